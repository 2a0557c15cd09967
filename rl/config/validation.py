"""Coercion and validation for the sections of a ``heed train`` run config.

A section is a dataclass whose fields carry their help text as a trailing comment. :class:`Section`
coerces each value to its field's type first (so YAML's ``1e-6``, a string to PyYAML, is a float, and a bad
type is a clear error), then runs the section's ``validate``; every error is a :class:`ConfigError` that
starts with the dotted key to change (``grpo.num_generations: must be >= 2, got 1``), and an unknown key
suggests the near miss. The sections themselves: ``rl/config/sections.py`` (the job's inputs and
outputs), ``rl/config/training.py`` (SFT, GRPO, Selective Attention), ``rl/config/cluster.py`` (the
rollout pool and the trainer ranks); the whole config: ``rl/config/__init__.py``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

REPO_ROOT = Path(__file__).resolve().parents[2]  # a source checkout or an editable install
SHARE_ROOT = Path(sys.prefix) / "share" / "heed"  # where a wheel installs configs/ (pyproject data-files)


class ConfigError(ValueError):
    """A run config that cannot run; the message starts with the dotted key to change."""


def check(ok, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def unknown_key_message(path: str, key, known: typing.Sequence[str]) -> str:
    close = difflib.get_close_matches(str(key), list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(known)}"
    return f"unknown key {path!r}{hint}"


def resolve_path(path: str) -> Path | None:
    """``path`` if absolute, else the first of CWD, the repo root and the installed share dir that has it."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        return candidate if candidate.exists() else None
    for root in search_roots():
        if (root / candidate).exists():
            return (root / candidate).resolve()
    return None


def local_or_hub(path: str | None) -> str | None:
    """A relative folder found by :func:`resolve_path`, as an absolute path; anything else (a hub id, an
    absolute path, None) as given."""
    if not path or Path(path).expanduser().is_absolute():
        return path
    found = resolve_path(path)
    return str(found) if found is not None and found.is_dir() else path


def search_roots() -> list[Path]:
    """Where relative config paths are looked up, in order: CWD, the repo root, the installed share dir."""
    return list(dict.fromkeys(p.resolve() for p in (Path.cwd(), REPO_ROOT, SHARE_ROOT)))


# -- coercion: raw YAML values -> the field's declared type, errors by dotted path --------------------------


def _join(where: str, key) -> str:
    return f"{where}.{key}" if where else str(key)


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def coerce(value, hint, key: str):
    """``value`` as the type ``hint`` (a dict becomes the dataclass it describes), or ``ConfigError``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return coerce(value, inner, key)
    if hint is bool:
        check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if hint is int:
        check(
            isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}"
        )
        return value
    if hint is float:
        if isinstance(value, str):  # PyYAML reads 1e-6 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        check(ok, key, f"must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    if hint is dict or origin is dict:
        check(isinstance(value, Mapping), key, f"must be a mapping, got {value!r}")
        if not args:
            return dict(value)
        for k in value:
            check(isinstance(k, str), _join(key, k), "keys must be strings")
        return {k: coerce(v, args[1], _join(key, k)) for k, v in value.items()}
    if origin is list:
        check(isinstance(value, list), key, f"must be a list, got {value!r}")
        return [coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if is_dataclass(hint):
        return value if isinstance(value, hint) else from_mapping(hint, value, key)
    raise TypeError(f"{key}: no coercion for type {hint!r}")


def from_mapping(cls, raw, where: str):
    """A ``cls`` from a YAML mapping: unknown keys are errors that suggest the near miss."""
    raw = {} if raw is None else raw
    check(isinstance(raw, Mapping), where or "the config", f"must be a mapping of keys, got {raw!r}")
    known = [f.name for f in fields(cls) if f.init]
    for key in raw:
        if key not in known:
            raise ConfigError(unknown_key_message(_join(where, key), key, known))
    for f in fields(cls):
        if f.init and f.default is MISSING and f.default_factory is MISSING and f.name not in raw:
            raise ConfigError(f"{_join(where, f.name)}: missing (required)")
    hints = _hints(cls)
    values = {k: coerce(v, hints[k], _join(where, k)) for k, v in raw.items()}
    try:
        return cls(**values)
    except ConfigError:
        raise
    except ValueError as err:  # a foreign dataclass (TinyModelConfig, RewardConfig) checking itself
        message = str(err).removeprefix(f"{cls.__name__}.")
        if message != str(err):  # "RewardConfig.mfu must be ..." -> "rewards.mfu: must be ..."
            name, _, rest = message.partition(" ")
            raise ConfigError(f"{_join(where, name)}: {rest}") from None
        raise ConfigError(f"{where}: {err}") from None


class Section:
    """Coerces its fields to their types, then runs ``validate``; ``SECTION`` is its YAML key."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self):
        hints = _hints(type(self))
        for f in fields(self):
            setattr(self, f.name, coerce(getattr(self, f.name), hints[f.name], _join(self.SECTION, f.name)))
        self.validate()

    def validate(self) -> None:
        pass

    def key(self, name: str) -> str:
        return _join(self.SECTION, name)

    def at_least(self, name: str, low, *, strict: bool = False) -> None:
        value = getattr(self, name)
        ok = value is None or (value > low if strict else value >= low)
        check(ok, self.key(name), f"must be {'>' if strict else '>='} {low}, got {value!r}")

    def one_of(self, name: str, choices: typing.Sequence[str]) -> None:
        value = getattr(self, name)
        check(value in choices, self.key(name), f"must be one of {', '.join(choices)}; got {value!r}")

"""A setting declared once: its default, its help text and the values it accepts, on one dataclass field.

:func:`setting` is a ``dataclasses.field`` that carries its help (TRL's habit) and what it accepts. A
class that offers another class's settings under its own names -- ``RewardConfig`` holds the roofline's
and the graders' knobs as flat keys of a run config's ``rewards:`` section -- declares each with
:func:`exposed`: the owner's default, help and range, and a note of where they came from. :func:`build`
makes the owner back from such a class, :func:`check` validates one. So ``mfu``'s default, help and
range are written once, in ``Roofline``, and ``rewards.mfu`` is one line of ``RewardConfig`` saying whose
setting it is.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Knobs:
...     rate: float = setting(0.5, "How often it happens.", within(0, 1, open_low=True))
>>> @dataclass(frozen=True)
... class Config:
...     knob_rate: float = exposed(Knobs, "rate")
>>> build(Knobs, Config(knob_rate=0.25))
Knobs(rate=0.25)
>>> check(Config(knob_rate=2.0))
Traceback (most recent call last):
...
ValueError: Config.knob_rate must be in (0, 1], got 2.0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, Field, field, fields
from typing import Any, NamedTuple


class Accepts(NamedTuple):
    """The values a setting accepts: as an error states them (``"in (0, 1]"``), and as a test."""

    text: str
    test: Callable[[Any], bool]


def at_least(low) -> Accepts:
    return Accepts(f">= {low}", lambda value: value >= low)


def above(low) -> Accepts:
    return Accepts(f"> {low}", lambda value: value > low)


def within(low, high, *, open_low: bool = False) -> Accepts:
    if open_low:
        return Accepts(f"in ({low}, {high}]", lambda value: low < value <= high)
    return Accepts(f"in [{low}, {high}]", lambda value: low <= value <= high)


def one_of(choices: tuple) -> Accepts:
    return Accepts(f"one of {choices}", lambda value: value in choices)


def setting(default, help: str, accepts: Accepts | None = None) -> Any:
    """A dataclass field with its default, its help text and, if given, the values it accepts."""
    return field(default=default, metadata={"help": help, "accepts": accepts})


def exposed(owner: type, name: str) -> Any:
    """``owner``'s setting ``name`` as a field of another class, under that class's own name for it.

    The field takes the setting's default, help and range from ``owner`` and records where they came
    from, which :func:`build` reads. Its type annotation must be the owner's (tests check it).
    """
    source = _fields(owner)[name]
    if source.default is MISSING:
        raise TypeError(f"{owner.__name__}.{name} has no default to expose")
    return field(default=source.default, metadata={**source.metadata, "exposes": (owner, name)})


def build(owner: type, config) -> Any:
    """The ``owner`` made of the values of ``config``'s fields that expose its settings (integer settings
    as ``int``: a config accepts ``32.0`` for an integer)."""
    types = {name: f.type for name, f in _fields(owner).items()}
    values = {}
    for f in fields(config):
        source = f.metadata.get("exposes")
        if source is not None and source[0] is owner:
            value = getattr(config, f.name)
            values[source[1]] = int(value) if _type_name(types[source[1]]) == "int" else value
    return owner(**values)


def check(config) -> None:
    """Validate a dataclass of settings: first each field's type (``bool``: true or false; ``float`` and
    ``int``: a finite number, an integer for ``int``), then what each accepts. An error names the field
    as ``Class.field`` (a run config renames it to its YAML key) and says what it must be."""
    cls = type(config).__name__
    for f in fields(config):
        value, kind = getattr(config, f.name), _type_name(f.type)
        if kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{cls}.{f.name} must be true or false, got {value!r}")
        elif kind in ("float", "int"):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{cls}.{f.name} must be a finite number, got {value!r}")
            if kind == "int" and value != int(value):
                raise ValueError(f"{cls}.{f.name} must be an integer, got {value!r}")
    for f in fields(config):
        accepts, value = f.metadata.get("accepts"), getattr(config, f.name)
        if accepts is not None and not accepts.test(value):
            raise ValueError(f"{cls}.{f.name} must be {accepts.text}, got {value!r}")


def _fields(cls: type) -> dict[str, Field]:
    return {f.name: f for f in fields(cls)}


def _type_name(annotation) -> str:
    # annotations are strings under `from __future__ import annotations`, classes without it
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))

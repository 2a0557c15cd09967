"""The DA modes, one row each: what the parser reads as a mode's tags, which prompt regions the
visibility rule lets it read, and what every view of a mode (metrics, eval rows, charts, highlighted
text) iterates, so that a mode is written in one place.

The four built-in modes are :data:`MODE_TABLE`. :func:`register_mode` adds another at run time, with no
product file edited: the parser then reads ``<name>`` and ``</name>`` as its tags (from the mode's
``since_version`` on), ``rollouts/masks/visibility.py``'s one visibility function gives it the regions
of its ``visible`` rule, and every view that iterates :func:`mode_table` shows it::

    register_mode(Mode("recall", "no chunk: what it wrote so far", "#8c564b", "#efe4e1", visible="none"))

What is left out: a registered mode's rule is one of the built-in rules (``all``, ``index``, ``none``;
``listed`` belongs to ``<focus>``, the one tag with attributes), and its tags are not single tokens of a
tokenizer (``PROTOCOL_TAG_TOKENS`` fixes the built-in tags' ids). Registrations live in one process, as
reward terms' do (rewards/terms.py): a mode meant for ``heed launch`` jobs or vLLM workers must be
registered by their entry point as well.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

# What a mode may read, besides the scaffold and the generated tokens (visibility.visible_chunks):
VISIBLE_RULES = ("all", "listed", "index", "none")  # every chunk and the index / its tag's chunk ids / ...


@dataclass(frozen=True)
class Mode:
    """One DA mode as the views show it."""

    name: str  # as mode states spell it
    reads: str  # what a token predicted under this mode may read (docs; visibility decides)
    color: str  # its line and bar colour in the charts
    background: str  # its highlight behind a completion's text
    since_version: int = 1  # the protocol version whose parser reads its tag
    visible: str = "none"  # its regions, one of VISIBLE_RULES (the visibility function reads it)

    def __post_init__(self):
        if self.visible not in VISIBLE_RULES:
            raise ValueError(f"mode {self.name!r}: visible must be one of {', '.join(VISIBLE_RULES)}")

    @property
    def metric(self) -> str:
        """Its share of generated tokens in ``metrics.jsonl`` (``mode_mix/<name>``)."""
        return f"mode_mix/{self.name}"

    @property
    def eval_key(self) -> str:
        """Its share of generated tokens in an eval row (``mode_mix_<name>``)."""
        return f"mode_mix_{self.name}"


# In the order tables and dashboards show them.
MODE_TABLE: tuple[Mode, ...] = (
    Mode("global", "every magic chunk and the index", "#d62728", "#fbe3e3", visible="all"),
    Mode("focus", "the chunks its tag lists", "#1f77b4", "#dde9f7", visible="listed"),
    Mode("local", "no chunk: the scaffold and what it generated", "#2ca02c", "#e0f3e0", visible="none"),
    Mode("index", "the prompt's index of the chunks", "#9467bd", "#ece3f5", since_version=3, visible="index"),
)
MODES = tuple(mode.name for mode in MODE_TABLE)  # the built-in names (the parser's GLOBAL, FOCUS, ...)
MODE_BY_NAME = {mode.name: mode for mode in MODE_TABLE}
OTHER_TAG_NAMES = ("answer", "think")  # the protocol's tag names that are no mode (parser.tag_names)

_registered: dict[str, Mode] = {}
_generation = [0]  # bumped at every (un)registration: the parser's tag tables are cached per generation


def register_mode(mode: Mode) -> None:
    """Add ``mode`` to the parser, the visibility rule and every view (module docstring)."""
    from .instructions import PROTOCOL_VERSIONS

    name = mode.name
    if not (name.isascii() and name.isalpha() and name.islower()) or name in OTHER_TAG_NAMES:
        raise ValueError(f"mode name {name!r} must be lower-case letters, not {' or '.join(OTHER_TAG_NAMES)}")
    if name in MODE_BY_NAME or name in _registered:
        raise ValueError(f"a mode named {name!r} exists already")
    if mode.visible == "listed":
        raise ValueError(f"mode {name!r}: only <focus> lists chunks; choose visible all, index or none")
    if mode.since_version not in PROTOCOL_VERSIONS:
        raise ValueError(f"mode {name!r}: since_version must be one of {PROTOCOL_VERSIONS}")
    _registered[name] = mode
    _generation[0] += 1


def unregister_mode(name: str) -> None:
    if _registered.pop(name, None) is not None:
        _generation[0] += 1


@contextlib.contextmanager
def registered_mode(mode: Mode) -> Iterator[Mode]:
    """``mode`` registered for the ``with`` block only."""
    register_mode(mode)
    try:
        yield mode
    finally:
        unregister_mode(mode.name)


def mode_table() -> tuple[Mode, ...]:
    """Every mode, built-in then registered, in the order the views show them."""
    return (*MODE_TABLE, *_registered.values())


def mode_names() -> tuple[str, ...]:
    """The names of :func:`mode_table`.

    >>> mode_names()
    ('global', 'focus', 'local', 'index')
    """
    return tuple(mode.name for mode in mode_table())


def mode_by_name(name: str) -> Mode:
    mode = MODE_BY_NAME.get(name) or _registered.get(name)
    if mode is None:
        raise KeyError(f"no mode named {name!r}: modes are {', '.join(mode_names())}")
    return mode


def generation() -> int:
    """A number that changes whenever the table does."""
    return _generation[0]

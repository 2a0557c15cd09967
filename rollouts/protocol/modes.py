"""The DA modes, one row each: what every view of a mode (metrics, eval rows, charts, highlighted text)
iterates, so that a mode's name, metric keys and colours are written in one place.

The parser's rules for each mode (which tag opens it, where a closing tag returns to) stay in
``parser.py``; visibility (what a mode reads) in ``rollouts/masks/visibility.py`` (docs/ARCHITECTURE.md,
contract 1: one visibility function). This table only describes them for the views.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    """One DA mode as the views show it."""

    name: str  # as mode states spell it
    reads: str  # what a token predicted under this mode may read (docs; visibility decides)
    color: str  # its line and bar colour in the charts
    background: str  # its highlight behind a completion's text
    since_version: int = 1  # the protocol version whose parser reads its tag

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
    Mode("global", "every magic chunk and the index", "#d62728", "#fbe3e3"),
    Mode("focus", "the chunks its tag lists", "#1f77b4", "#dde9f7"),
    Mode("local", "no chunk: the scaffold and what it generated", "#2ca02c", "#e0f3e0"),
    Mode("index", "the prompt's index of the chunks", "#9467bd", "#ece3f5", since_version=3),
)
MODES = tuple(mode.name for mode in MODE_TABLE)
MODE_BY_NAME = {mode.name: mode for mode in MODE_TABLE}

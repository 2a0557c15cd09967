"""Printing a rich table whole, at any console width.

Rich fits a table to a console narrower than the table by cutting every cell (``0.604`` becomes ``0.…``):
piped with ``COLUMNS=80``, or on a small terminal, every number in Heed's tables was lost. A number cut
short is worse than a line that wraps, so a table that does not fit is printed at its own natural width
(the terminal or the reader wraps the long lines; a file keeps them). Torch- and transformers-free:
``heed dashboard --text`` prints with it too.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

UNBOUNDED = 1 << 16  # columns: wide enough to measure any table's natural width


def print_table(table: Table, out: Console) -> None:
    """Print ``table`` on ``out``: at the console's width when it fits, else at its natural width."""
    natural = out.measure(table, options=out.options.update(max_width=UNBOUNDED)).maximum
    if natural <= out.width:
        out.print(table)
        return
    wide = Console(
        file=out.file, width=natural, color_system=out.color_system, force_terminal=out.is_terminal,
        no_color=out.no_color, highlight=False,
    )  # fmt: skip
    wide.print(table, crop=False)

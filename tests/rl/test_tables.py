"""Tables print whole at any console width: every number of the table appears intact in the output."""

import io

import pytest
from rich.console import Console
from rich.table import Table

from rl.tables import print_table

ROW = ("da", "192", "0.604", "0.604", "0.979", "0.610", "4,952", "36/12/52/0")


def _table() -> Table:
    table = Table(title="Eval: answers, every task and length", title_justify="left")
    for name in ("mode", "n", "acc", "RULER", "compl.", "cover.", "KV read/ex", "g/f/l/i %"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_row(*ROW)
    return table


def _printed(width: int, printer) -> str:
    out = Console(file=io.StringIO(), width=width, color_system=None)
    printer(_table(), out)
    return out.file.getvalue()


@pytest.mark.parametrize("width", [20, 40, 80, 200])
def test_every_cell_is_whole_at_any_width(width):
    text = _printed(width, print_table)
    for cell in ROW:
        assert f" {cell} " in text, (width, cell, text)


def test_a_table_that_fits_prints_as_rich_prints_it_and_one_that_does_not_is_not_cut():
    assert _printed(200, print_table) == _printed(200, lambda t, out: out.print(t))
    cut = _printed(40, lambda t, out: out.print(t))  # rich's own fitting: the failure this guards against
    assert "0.604" not in cut and "…" in cut

"""Every view of a mode reads rollouts.protocol's mode table: the parser's modes, the charts' colours, the
highlighted text in the report and the wandb mirror, and the eval rows' keys come from its rows (a mode
registered at run time: tests/rl/dashboard/test_registered_mode.py)."""

import re

from rl.dashboard import charts, report, wandb_mirror
from rollouts.protocol import MODE_TABLE, MODES
from rollouts.protocol import parser as protocol_parser


def test_the_parser_and_the_views_take_the_tables_modes():
    assert MODES == tuple(m.name for m in MODE_TABLE) == ("global", "focus", "local", "index")
    assert (protocol_parser.GLOBAL, protocol_parser.INDEX) == ("global", "index")
    assert charts.INDEX_COLOR == "#9467bd"
    assert [wandb_mirror._background(m) for m in MODES] == ["#fbe3e3", "#dde9f7", "#e0f3e0", "#ece3f5"]
    for mode in MODE_TABLE:
        assert re.search(rf"\.mode-{mode.name} \{{ background: {mode.background}; \}}", report._css())
        assert (mode.metric, mode.eval_key) == (f"mode_mix/{mode.name}", f"mode_mix_{mode.name}")
    assert len({m.color for m in MODE_TABLE}) == len({m.background for m in MODE_TABLE}) == len(MODE_TABLE)


def test_an_eval_row_writes_the_mix_as_the_flat_keys_old_files_have():
    from rl.evaluate import EvalRow

    mix = {"global": 0.5, "focus": 0.25, "local": 0.25, "index": None}
    row = EvalRow("da", "t", "<=1K", 2, 1.0, 1.0, 1.0, None, 0.5, 10, 20, 5.0, 10.0, 3.0, mix)
    written = row.to_dict()
    assert "mode_mix" not in written
    assert {k: v for k, v in written.items() if k.startswith("mode_mix_")} == {
        "mode_mix_global": 0.5, "mode_mix_focus": 0.25, "mode_mix_local": 0.25, "mode_mix_index": None
    }  # fmt: skip

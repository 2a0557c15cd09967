"""The end-of-run summary of `heed train`: paired GRPO - SFT differences with their standard errors
(checked against a hand computation), and tables that keep every number whole when piped."""

import math

from rich.console import Console

from rl.summary import before_after_table, difference_line, paired_difference


def test_paired_difference_by_hand():
    # four completions scored by both evals (and one only by the first): differences 1, 0, 0, -1 ... plus
    # one None coverage that drops out
    before = {
        "a#0": [0, 1, 0.5, 0.1],
        "b#0": [1, 1, None, 0.2],
        "c#0": [0, 0, 1.0, 0.3],
        "d#0": [1, 1, 0, 0.4],
        "e#0": [0, 0, 0, 0],
    }
    after = {"a#0": [1, 1, 1.0, 0.2], "b#0": [1, 1, 1.0, 0.2], "c#0": [0, 1, 1.0, 0.3], "d#0": [0, 1, 0, 0.5]}
    mean, se, n = paired_difference(before, after, 0)
    assert (mean, n) == (0.0, 4)
    assert math.isclose(se, math.sqrt((1 + 0 + 0 + 1) / 3 / 4))  # sample sd / sqrt(n)
    mean, se, n = paired_difference(before, after, 2)  # b's coverage is unknown before: 3 pairs
    assert n == 3 and math.isclose(mean, (0.5 + 0 + 0) / 3)
    assert paired_difference({"a#0": [1]}, {"a#0": [0]}, 0)[2] == 1 and math.isnan(
        paired_difference({}, {}, 0)[0]
    )


STATE = {
    "eval": {
        stage: {
            "da": {
                "accuracy": acc,
                "compliance": 1.0,
                "coverage": 0.5,
                "kv_saving": 0.123456,
                "n": 96,
                "mode_mix_global": 0.6,
                "mode_mix_focus": 0.3,
                "mode_mix_local": 0.1,
            }
        }
        for stage, acc in (("init", 0.0), ("sft", 0.53125), ("grpo", 0.59375))
    },
    "eval_examples": {
        "sft": {f"x{i}#0": [float(i % 2), 1.0, 0.5, 0.1] for i in range(10)},
        "grpo": {f"x{i}#0": [1.0, 1.0, 0.5, 0.1] for i in range(10)},
    },
}


def test_before_after_table_keeps_its_numbers_whole_at_80_columns():
    console = Console(width=80, record=True)
    console.print(before_after_table(STATE, "", title="held-out da"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for cell in ("0.531", "0.594", "0.123", "60/30/10", "after GRPO", "random"):
        assert cell in text, cell
    assert "…" not in text
    assert before_after_table(STATE, "_sampled") is None  # no sampled evals in this state


def test_difference_line_reports_mean_and_standard_error():
    line = difference_line(STATE)
    # accuracy: differences 1,0,1,0,... over 10 completions: mean 0.5, se = sqrt(10/36)/sqrt(10)
    assert line.startswith("GRPO - SFT (paired, n=10): accuracy +0.500 ± 0.167")
    assert "compliance +0.000 ± 0.000" in line and "kv_saving +0.000 ± 0.000" in line
    assert difference_line(STATE, "_sampled") is None

"""The end-of-run summary of `heed train`: paired GRPO - SFT differences with their standard errors
(checked against a hand computation), KV tokens read per example beside the KV saving, and tables that
keep every number whole when piped."""

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
                "kv_tokens": kv_tokens,
                "n": 96,
                "mode_mix_global": 0.6,
                "mode_mix_focus": 0.3,
                "mode_mix_local": 0.1,
            }
        }
        for stage, acc, kv_tokens in (
            ("init", 0.0, 96 * 31_250),
            ("sft", 0.53125, 96 * 1_234_567),
            ("grpo", 0.59375, 96 * 987_654 + 24),  # 987,654.25 per example
        )
    },
    "eval_examples": {  # accuracy, compliance, coverage, kv_saving, kv_tokens read
        "sft": {f"x{i}#0": [float(i % 2), 1.0, 0.5, 0.1, 1000.0 + 10 * i] for i in range(10)},
        "grpo": {
            f"x{i}#0": [1.0, 1.0, 0.5, 0.1, 1000.0 + 10 * i - (100 if i < 5 else 50)] for i in range(10)
        },
    },
}


def test_before_after_table_keeps_its_numbers_whole_at_80_columns():
    console = Console(width=80, record=True)
    console.print(before_after_table(STATE, "", title="held-out da"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for cell in ("0.531", "0.594", "0.123", "60/30/10", "after GRPO", "random"):
        assert cell in text, cell
    # KV tokens read per example: kv_tokens / n of each stage, to whole tokens
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.startswith("│")}
    assert "31,250" in rows["random"] and "1,234,567" in rows["after SFT"] and "987,654" in rows["after GRPO"]
    assert "KV read" in text and "per ex." in text
    assert "…" not in text
    assert before_after_table(STATE, "_sampled") is None  # no sampled evals in this state


def test_difference_line_reports_mean_and_standard_error():
    line = difference_line(STATE)
    # accuracy: differences 1,0,1,0,... over 10 completions: mean 0.5, se = sqrt(10/36)/sqrt(10)
    assert line.startswith("GRPO - SFT (paired, n=10): accuracy +0.500 ± 0.167")
    assert "compliance +0.000 ± 0.000" in line and "kv_saving +0.000 ± 0.000" in line
    assert difference_line(STATE, "_sampled") is None


def test_difference_line_reports_kv_tokens_read_per_example():
    # GRPO reads 100 fewer tokens on five completions and 50 fewer on the other five: mean -75, sample sd
    # sqrt(10 * 25**2 / 9), se = sd / sqrt(10) = 25 / 3 = 8.33; SFT read 1000..1090, mean 1045, so -75 is
    # -7.2% of it
    line = difference_line(STATE)
    assert line.endswith("KV read/ex -75.0 ± 8.3 (-7.2% of SFT's 1,045)"), line


def test_runs_recorded_without_per_example_kv_reads_still_summarize():
    """A run whose evals kept four metrics per completion (before KV reads were kept), and one resumed after
    SFT with the new code (four before, five after): the rates pair up, KV reads have no pairs."""
    four = {stage: {k: v[:4] for k, v in rows.items()} for stage, rows in STATE["eval_examples"].items()}
    for examples in (four, {"sft": four["sft"], "grpo": STATE["eval_examples"]["grpo"]}):
        line = difference_line({**STATE, "eval_examples": examples})
        assert line.startswith("GRPO - SFT (paired, n=10): accuracy +0.500 ± 0.167")
        assert "KV read" not in line

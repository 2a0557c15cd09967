"""A mode registered inside the test, no product file edited, is read by the parser, given its regions by
the visibility rule and shown in every view of a run: the metrics the trainer logs, the HTML report's
mode chart and highlights, the text summary, the wandb mirror's samples table and ``heed eval``'s table.
The expected shares are counted here from the completions' tokens, not taken from the code under test."""

import re

import pytest
from rich.console import Console

from data.tokenizer import build_tokenizer
from rl.dashboard import RunReader
from rollouts.protocol import Mode, registered_mode

from .conftest import figures, metrics_lines, registered_run, summary_shows, wandb_samples

RECALL = Mode("recall", "no chunk: what it wrote so far", "#8c564b", "#efe4e1", visible="none")
NOTE = "<recall>checking my notes</recall>"


def with_recall(text: str) -> str:
    return NOTE + text


def recall_tokens(tokenizer, text: str) -> tuple[int, int]:
    """(tokens predicted under recall, all tokens) of a completion that begins with ``NOTE``: token t is
    predicted under the state after the text before it, which is recall from the end of ``<recall>`` to
    the end of ``</recall>``."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = [start for start, _ in enc["offset_mapping"]]
    opened, closed = len("<recall>"), len(NOTE)
    return sum(opened <= s < closed for s in starts), len(starts)


@pytest.fixture(scope="module")
def mode_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("modes") / "run"
    return registered_run(out, registered_mode(RECALL), batch_size=6, rewrite=with_recall)


def test_the_logged_mode_mix_counts_its_tokens(mode_run):
    run_dir, _, _ = mode_run
    tokenizer = build_tokenizer()
    run = RunReader(run_dir).read()
    for line in metrics_lines(run_dir):
        counts = [
            recall_tokens(tokenizer, t["completion_text"])
            for t in run.trajectories
            if t["step"] == line["step"]
        ]
        expected = sum(c for c, _ in counts) / sum(n for _, n in counts)
        assert 0 < expected < 1
        assert line["mode_mix/recall"] == pytest.approx(expected)
        shares = [line[f"mode_mix/{m}"] for m in ("global", "focus", "local", "index", "recall")]
        assert sum(shares) == pytest.approx(1.0)


def test_the_html_report_charts_and_highlights_it(mode_run):
    _, page, _ = mode_run
    assert "recall" in [trace["name"] for trace in figures(page)["mode_mix"]["data"]]
    assert ".mode-recall { background: #efe4e1; }" in page


def test_the_text_summary_shows_it(mode_run):
    run_dir, _, text = mode_run
    assert summary_shows(text, "mode_mix/recall", metrics_lines(run_dir)[0]["mode_mix/recall"])


def test_the_wandb_samples_table_has_its_column(mode_run):
    tokenizer = build_tokenizer()
    columns, records, rows = wandb_samples(mode_run[0], registered_mode(RECALL))
    at = columns.index("share_recall")
    for row, record in zip(rows, records, strict=True):
        count, total = recall_tokens(tokenizer, record["completion_text"])
        assert row[at] == pytest.approx(count / total)


def test_heed_evals_table_and_file_have_it(tokenizer, token_table):
    from rewards import score_trajectories
    from rl.evaluate import EvalReport
    from rollouts.protocol import build_prompt
    from tests.rewards.helpers import ACME_GOLD, ACME_QUESTION, acme_documents, acme_example, make_trajectory

    layout = build_prompt(ACME_QUESTION, acme_documents(), tokenizer, block_size=32)
    completion = NOTE + "".join(text for text, _ in ACME_GOLD)
    with registered_mode(RECALL):
        trajectories = [make_trajectory(layout, tokenizer, token_table, completion, acme_example())]
        report = EvalReport(trajectories, score_trajectories(trajectories).items)
        table = report.reads_table()
        console = Console(record=True, width=200)
        console.print(table)
        results = report.results()
    count, total = recall_tokens(tokenizer, completion)
    assert results[0]["mode_mix_recall"] == pytest.approx(count / total)
    assert "g/f/l/i/r %" in [c.header for c in table.columns]
    assert re.search(rf"/{100 * count / total:.0f}\s", console.export_text())  # the last share: recall's

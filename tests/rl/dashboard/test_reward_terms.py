"""A reward term registered inside the test, no product file edited, shows in every view of a run: the
metrics the trainer logs, the trajectory records, the HTML report's reward chart and samples table, the
text summary, the wandb mirror's samples table and ``heed eval``'s table. The expected values are counted
here from the records' answers, not taken from the code under test."""

import re

import pytest
from rich.console import Console

from rewards import RewardTerm, registered, score_trajectories
from rl.dashboard import RunReader

from .conftest import figures, metrics_lines, registered_run, summary_shows, wandb_samples


def short_answer(parsed, example, reads):
    return float(parsed.answer is not None and len(parsed.answer.split()) <= 2)


def by_hand(record: dict) -> float:
    answer = record.get("answer")
    return float(answer is not None and len(answer.split()) <= 2)


@pytest.fixture(scope="module")
def term_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("terms") / "run"
    return registered_run(out, registered(RewardTerm("short", short_answer, weight=0.0)), batch_size=8)


def test_the_logged_metrics_and_records_carry_it(term_run):
    run_dir, _, _ = term_run
    run = RunReader(run_dir).read()
    for line in metrics_lines(run_dir):
        records = [t for t in run.trajectories if t["step"] == line["step"]]
        assert [t["reward"]["short"] for t in records] == [by_hand(t) for t in records]
        assert line["reward/short"] == pytest.approx(sum(map(by_hand, records)) / len(records))
    assert len({t["reward"]["short"] for t in run.trajectories}) == 2  # both values occur: it says something


def test_the_html_report_charts_it_and_lists_it_per_sample(term_run):
    _, page, _ = term_run
    names = [trace["name"] for trace in figures(page)["rewards"]["data"]]
    assert "reward/short" in names
    assert "<th>short</th>" in page


def test_the_text_summary_shows_it(term_run):
    run_dir, _, text = term_run
    assert summary_shows(text, "reward/short", metrics_lines(run_dir)[0]["reward/short"])


def test_the_wandb_samples_table_has_its_column(term_run):
    columns, records, rows = wandb_samples(
        term_run[0], registered(RewardTerm("short", short_answer, weight=0.0))
    )
    at = columns.index("short")
    assert [row[at] for row in rows] == [by_hand(t) for t in records]


def test_heed_evals_table_and_file_have_it(tokenizer, token_table):
    from rl.evaluate import EvalReport
    from rollouts.protocol import build_prompt
    from tests.rewards.helpers import ACME_GOLD, ACME_QUESTION, acme_documents, acme_example, make_trajectory

    acme_layout = build_prompt(ACME_QUESTION, acme_documents(), tokenizer, block_size=32)
    trajectories = [
        make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example()),
        make_trajectory(
            acme_layout, tokenizer, token_table, "<answer>it is 8 years</answer>", acme_example()
        ),
    ]
    with registered(RewardTerm("short", short_answer, weight=0.0)):
        report = EvalReport(trajectories, score_trajectories(trajectories).items)
        (summary,) = report.summaries
        table = report.summary_table()
        console = Console(record=True, width=200)
        console.print(table)
    assert "short" in [c.header for c in table.columns]
    assert summary.terms == {"short": 0.5}  # "8 years" is short, "it is 8 years" is not
    assert report.results()[0]["reward_short"] == 0.5
    assert re.search(r"0\.500", console.export_text())

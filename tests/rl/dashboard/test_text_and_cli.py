"""``heed dashboard``: the terminal summary's numbers and the CLI's two outputs."""

import re

from rich.console import Console

from rl.cli import main
from rl.dashboard import RunReader, RunWriter, print_summary

from .conftest import debiased_ema, metrics_lines


def summary_text(run_dir) -> str:
    console = Console(record=True, width=200)
    print_summary(RunReader(run_dir).read(), console)
    return console.export_text()


def test_text_summary_numbers_match_metrics_file(sample_run):
    """First, latest and smoothed latest (the end of the report's line) of each headline metric."""
    text = summary_text(sample_run)
    lines = metrics_lines(sample_run)
    for name in ("reward/total", "reward/compliance", "mode_mix/global", "mode_mix/focus", "kv/saving"):
        values = [row[name] for row in lines]
        first, last, smoothed = values[0], values[-1], debiased_ema(values)[-1]
        assert re.search(
            rf"{re.escape(name)}\s+│\s+{first:.4f}\s+│\s+{last:.4f}\s+│\s+{smoothed:.4f}\s+│\s+"
            rf"{lines[-1]['step']}",
            text,
        ), name
    reads = [row["kv/tokens_da_per_completion"] for row in lines]
    assert re.search(
        rf"kv/tokens_da_per_completion\s+│\s+{reads[0]:,.0f}\s+│\s+{reads[-1]:,.0f}\s+│\s+"
        rf"{debiased_ema(reads)[-1]:,.0f}\s+│",
        text,
    )
    assert f"{lines[-1]['kv/tokens_da']:,}" in text
    assert "Eval gold_traces" in text and "Skipped" not in text


def test_text_summary_of_a_run_before_reads_per_completion_were_logged(tmp_path):
    """GRPO lines with batch sums and ``rollouts/count`` only: reads per completion are their ratio."""
    writer = RunWriter(tmp_path)
    for step, da in ((1, 8000), (2, 4000)):
        writer.log_metrics(step, "grpo", {"kv/tokens_da": da, "rollouts/count": 4})
    smoothed = debiased_ema([2000, 1000])[-1]
    assert re.search(
        rf"kv/tokens_da_per_completion\s+│\s+2,000\s+│\s+1,000\s+│\s+{smoothed:,.0f}\s+│\s+2",
        summary_text(tmp_path),
    )


def test_cli_writes_report_and_text(sample_run, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["dashboard", str(sample_run), "--out", str(out)]) == 0
    assert out.stat().st_size > 1_000_000 and f"wrote {out}" in capsys.readouterr().out
    record_id = (
        (sample_run / "trajectories" / "samples.jsonl").read_text().split('"id": "', 1)[1].split('"')[0]
    )
    assert main(["dashboard", str(sample_run), "--out", str(out), "--trajectory", record_id]) == 0
    assert f'data-id="{record_id}"' in out.read_text()
    assert main(["dashboard", str(sample_run), "--text"]) == 0
    assert "Headline metrics" in capsys.readouterr().out


def test_cli_rejects_a_missing_run_directory(tmp_path, capsys):
    assert main(["dashboard", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()


def test_cli_names_unknown_trajectory_ids(sample_run, tmp_path):
    out = tmp_path / "r.html"
    assert main(["dashboard", str(sample_run), "--out", str(out), "--trajectory", "no-such-id"]) == 0
    assert "No trajectory with id no-such-id." in out.read_text()


def test_cli_mirrors_to_offline_wandb(sample_run, tmp_path, capsys, monkeypatch):
    import shutil

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = shutil.copytree(sample_run, tmp_path / "run")
    assert main(["dashboard", str(run_dir), "--wandb"]) == 0
    steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert f"mirrored {steps} steps to wandb (offline)" in capsys.readouterr().out
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))

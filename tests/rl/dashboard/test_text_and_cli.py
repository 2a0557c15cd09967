"""``heed dashboard``: the terminal summary's numbers and the CLI's two outputs."""

import re

from rich.console import Console

from rl.cli import main
from rl.dashboard import RunReader, print_summary

from .conftest import metrics_lines


def test_text_summary_numbers_match_metrics_file(sample_run):
    console = Console(record=True, width=200)
    print_summary(RunReader(sample_run).read(), console)
    text = console.export_text()
    lines = metrics_lines(sample_run)
    for name in ("reward/total", "reward/compliance", "mode_mix/global", "kv/saving"):
        first, last = lines[0][name], lines[-1][name]
        assert re.search(
            rf"{re.escape(name)}\s+│\s+{first:.4f}\s+│\s+{last:.4f}\s+│\s+{lines[-1]['step']}", text
        ), name
    assert f"{lines[-1]['kv/tokens_da']:,}" in text
    assert "Eval gold_traces" in text and "Skipped" not in text


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

"""Mirroring a run directory into an offline wandb run: every metrics line once, tables readable back."""

import json
import shutil

import pytest

from rl.dashboard import RunWriter
from rl.dashboard.wandb_mirror import WandbMirror, sample_columns

from .conftest import metrics_lines


@pytest.fixture
def mirror(sample_run, tmp_path, monkeypatch):
    """An offline mirror of a copy of the sample run whose ``log`` calls are also recorded."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = shutil.copytree(sample_run, tmp_path / "run")
    m = WandbMirror(run_dir, mode="offline", dir=tmp_path)
    calls = []
    log = m.wandb_run.log
    monkeypatch.setattr(
        m.wandb_run, "log", lambda data, step: (calls.append((step, data)), log(data, step=step))
    )
    yield m, calls
    m.finish()


def test_metrics_are_logged_once_per_step_with_file_values(mirror, sample_run):
    m, calls = mirror
    lines = metrics_lines(sample_run)
    assert m.sync() == len(lines)
    logged = [(step, data) for step, data in calls if "reward/total" in data]
    assert [step for step, _ in logged] == [row["step"] for row in lines]
    for (_, data), row in zip(logged, lines, strict=True):
        assert data == {k: v for k, v in row.items() if k not in ("step", "time", "phase") and v is not None}
    RunWriter(m.run_dir).log_metrics(lines[-1]["step"] + 1, "grpo", {"reward/total": 2.0})
    assert m.sync() == 1  # only the new line
    assert calls[-2] == (lines[-1]["step"] + 1, {"reward/total": 2.0})


def test_samples_table_is_written_with_record_values(mirror, sample_run, tmp_path):
    m, _ = mirror
    m.sync()
    m.finish()
    tables = list(tmp_path.glob("wandb/offline-run-*/files/media/table/samples_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"] == sample_columns()
    records = [
        json.loads(x) for x in (sample_run / "trajectories" / "samples.jsonl").read_text().splitlines()
    ]
    last = max(r["step"] for r in records)
    expected = {r["id"]: r["reward"]["total"] for r in records if r["step"] == last}
    assert {row[0]: row[4] for row in table["data"]} == expected

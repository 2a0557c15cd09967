"""A real tiny run directory (``rl.dashboard.sample_run``) and its rendered report, built once."""

import json
import re
from pathlib import Path

import pytest

FIGURE = re.compile(
    r'<script type="application/json" class="heed-figure" data-chart="(\w+)">(.*?)</script>', re.S
)


def figures(page: str) -> dict[str, dict]:
    """Every figure embedded in a report page, parsed back from its JSON."""
    return {name: json.loads(payload) for name, payload in FIGURE.findall(page)}


def summary_shows(text: str, name: str, value: float) -> bool:
    """Does the text summary ``text`` have a row for metric ``name`` whose first value is ``value``?"""
    return re.search(rf"{re.escape(name)}\s+│\s+{value:.4f}", text) is not None


def registered_run(out: Path, registration, **sample_args) -> tuple[Path, str, str]:
    """A sample run written under ``registration`` (the ``with`` block of a registered reward term or mode),
    its HTML report page and its text summary."""
    from rich.console import Console

    from rl.dashboard import RunReader, print_summary, write_report
    from rl.dashboard.sample_run import write_sample_run

    with registration:  # registered for this block only
        run_dir = write_sample_run(out, steps=3, **sample_args)
        page = write_report(run_dir, run_dir / "report.html")[0].read_text(encoding="utf-8")
        console = Console(record=True, width=200)
        print_summary(RunReader(run_dir).read(), console)
    return run_dir, page, console.export_text()


def wandb_samples(run_dir: Path, registration) -> tuple[list[str], list[dict], list[list]]:
    """The wandb mirror's sample columns, the run's records and their rows, under ``registration`` (the
    ``with`` block of a registered reward term or mode)."""
    from rl.dashboard import RunReader
    from rl.dashboard.wandb_mirror import record_rows, sample_columns

    with registration:
        trajectories = RunReader(run_dir).read().trajectories
        return sample_columns(), trajectories, record_rows(trajectories)


def metrics_lines(run_dir: Path) -> list[dict]:
    """``metrics.jsonl`` read directly, independent of ``RunReader``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def debiased_ema(values: list[float], weight: float = 0.6) -> list[float]:
    """TensorBoard's smoothing in closed form, not the recursion the dashboard runs: at the t-th point
    (1-based) ``sum_k (1 - w) w^(t-k) x_k / (1 - w^t)``."""
    return [
        sum((1 - weight) * weight ** (t - k) * values[k] for k in range(t + 1)) / (1 - weight ** (t + 1))
        for t in range(len(values))
    ]


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory) -> Path:
    from rl.dashboard.sample_run import write_sample_run

    return write_sample_run(tmp_path_factory.mktemp("runs") / "sample", steps=6, batch_size=10)


@pytest.fixture(scope="session")
def report_page(sample_run, tmp_path_factory) -> tuple[Path, str]:
    from rl.dashboard import write_report

    out, _ = write_report(sample_run, tmp_path_factory.mktemp("report") / "report.html")
    return out, out.read_text(encoding="utf-8")

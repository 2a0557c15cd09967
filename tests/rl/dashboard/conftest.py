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

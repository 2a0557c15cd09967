"""``heed dashboard RUN_DIR --text``: the latest numbers of a run in the terminal (rich).

Shows each headline metric's first logged value, its value at the latest step that logged it and
there the smoothed value the report's line ends at (``smoothing.smooth``: a single batch is noisy, the
smoothed value is the trend; the smoothed first value is the first value itself, so it needs no column),
then the da / da-nm / vanilla eval table, and what the reader skipped.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rewards import shown
from rl.tables import print_table
from rollouts.protocol import mode_table

from .report import EVAL_MODES
from .run_dir import Run
from .smoothing import smooth

# after the reward's total and terms (rewards.shown: registered terms too)
HEADLINE = (
    "kv/tokens_da_per_completion",
    "kv/tokens_vanilla_per_completion",
    "kv/tokens_da",
    "kv/tokens_vanilla",
    "kv/saving",
    "decode/roofline_s_da",
    "decode/roofline_s_vanilla",
    "decode/steps_overhead",
    "is_ratio/mean",
    "throughput/tokens_per_s",
)


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    if 0 < abs(value) < 1e-3:  # roofline seconds of a batch: microseconds
        return f"{value:.3e}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"


def _eval_cell(row: dict) -> str:
    """``accuracy (RULER accuracy) / KV tokens``; files written before ``accuracy_ruler`` show no RULER part."""
    ruler = row.get("accuracy_ruler")
    ruler = f" ({ruler:.3f})" if isinstance(ruler, int | float) else ""
    return f"{row['accuracy']:.3f}{ruler} / {row['kv_tokens']:,}"


def print_summary(run: Run, console: Console | None = None) -> None:
    console = console or Console()
    steps = [row["step"] for row in run.metrics]
    console.print(
        f"[bold]Heed run[/] {run.root}: {len(run.metrics)} metric lines"
        + (f", steps {min(steps)}–{max(steps)}" if steps else "")
        + f", {len(run.trajectories)} trajectories, {len(run.evals)} eval files"
    )
    table = Table(title="Headline metrics")
    table.add_column("metric")
    table.add_column("first", justify="right")
    table.add_column("latest", justify="right")
    table.add_column("smoothed", justify="right")
    table.add_column("at step", justify="right")
    violations = [n for n in run.metric_names() if n.startswith("violations/") and run.latest(n)]
    modes = (mode.metric for mode in mode_table())
    for name in (*(f"reward/{term}" for term in shown()), *modes, *HEADLINE, *violations):
        at, values = run.series(name)
        if values:
            table.add_row(name, _fmt(values[0]), _fmt(values[-1]), _fmt(smooth(values)[-1]), str(at[-1]))
    if table.row_count:
        print_table(table, console)
    else:
        console.print("[italic]no metrics logged yet[/]")
    for name, data in run.evals.items():
        ev = Table(title=f"Eval {name} (step {data.get('step')}): accuracy (RULER's) / KV tokens read")
        ev.add_column("task")
        ev.add_column("context")
        for mode in EVAL_MODES:
            ev.add_column(mode, justify="right")
        rows: dict[tuple[str, str], dict[str, dict]] = {}
        for r in data["results"]:
            rows.setdefault((str(r.get("task")), str(r.get("length_bin"))), {})[str(r.get("mode"))] = r
        for (task, label), by_mode in sorted(rows.items()):
            cells = [_eval_cell(by_mode[m]) if m in by_mode else "–" for m in EVAL_MODES]
            ev.add_row(task, label, *cells)
        print_table(ev, console)
    if run.skipped:
        console.print(f"[bold yellow]Skipped while reading ({len(run.skipped)}):[/]")
        for s in run.skipped:
            console.print(f"  {s}", markup=False)

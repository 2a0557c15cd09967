"""Mirror a run directory into Weights & Biases (offline unless the user configures online).

The run directory stays the source of truth; wandb is a view of it. :class:`WandbMirror` logs every
metrics line it has not logged yet (so a trainer can call :meth:`WandbMirror.sync` after each step,
and ``heed dashboard RUN_DIR --wandb`` can mirror a finished run in one go), plus two tables at each
sync: the latest step's sample trajectories with mode-colored text, and the eval results.

wandb needs steps that only grow: metrics lines are merged per step (several phases may log the
same step; a resumed run re-logs steps, and the latest value wins) and steps at or below the last
one mirrored are not sent again.
"""

from __future__ import annotations

import html
from pathlib import Path

from rewards import shown
from rollouts.protocol import mode_by_name, mode_names

from .run_dir import ROW_KEYS, Run, RunReader
from .trajectory_views import record_mode_mix


def sample_columns() -> list[str]:
    """The samples table's columns: the reward's total and every term (``rewards.shown``, registered
    ones included), each mode's share, the saving, violations, answer and the mode-colored text."""
    rewards = ["reward" if name == "total" else name for name in shown()]
    return [
        "id", "step", "task", "context_tokens", *rewards, *(f"share_{m}" for m in mode_names()), "kv_saving",
        "violations", "answer", "text",
    ]  # fmt: skip


EVAL_COLUMNS = (
    "eval",
    "mode",
    "task",
    "length_bin",
    "n",
    "accuracy",
    "kv_tokens",
    "kv_tokens_vanilla",
    "decode_steps",
)


def merged_steps(run: Run) -> dict[int, dict[str, float]]:
    """Step -> every numeric metric logged at that step (later lines override earlier ones)."""
    steps: dict[int, dict[str, float]] = {}
    for row in run.metrics:
        values = steps.setdefault(row["step"], {})
        for key, value in row.items():
            if key not in ROW_KEYS and isinstance(value, int | float) and not isinstance(value, bool):
                values[key] = value
    return dict(sorted(steps.items()))


def _background(mode: str) -> str:
    try:
        return mode_by_name(mode).background
    except KeyError:  # a mode registered in the run that wrote the record, not in this process
        return "#fff"


def colored_text_html(record: dict) -> str:
    text = record.get("completion_text", "")
    parts = [
        f'<span style="background:{_background(s["mode"])}">{html.escape(text[s["start"] : s["end"]])}</span>'
        for s in record.get("segments", [])
    ]
    return f'<pre style="white-space:pre-wrap">{"".join(parts)}</pre>'


def sample_rows(run: Run) -> list[list]:
    """One :func:`sample_columns` row per trajectory of the latest step."""
    if not run.trajectories:
        return []
    last = max(t["step"] for t in run.trajectories)
    return record_rows([t for t in run.trajectories if t["step"] == last])


def record_rows(records: list[dict]) -> list[list]:
    """One :func:`sample_columns` row per trajectory record (``records.trajectory_record``); the last
    cell is the mode-colored HTML of the completion."""
    rows = []
    for t in records:
        try:
            mix = record_mode_mix(t)
            reward = t["reward"]
            violations = ", ".join(v["kind"] for v in t.get("violations", []))
            rows.append(
                [t["id"], t["step"], t.get("task"), t.get("context_tokens")]
                + [reward.get(c) for c in shown()]
                + [mix[m] for m in mode_names()]
                + [reward.get("kv_saving"), violations, t.get("answer"), colored_text_html(t)]
            )
        except (KeyError, TypeError, IndexError, AttributeError):
            continue  # the HTML report says what is wrong with this record
    return rows


def samples_table(wandb, rows: list[list]):
    """A ``wandb.Table`` of :func:`record_rows` rows, the text rendered as HTML."""
    table = wandb.Table(columns=sample_columns())
    for row in rows:
        table.add_data(*row[:-1], wandb.Html(row[-1]))
    return table


class WandbMirror:
    """Log a run directory's new metrics lines and its tables to one wandb run."""

    def __init__(self, run_dir: str | Path, project: str = "heed", mode: str = "offline", **init_kwargs):
        import wandb

        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.last_step = -1
        self.wandb_run = wandb.init(
            project=project,
            mode=mode,
            dir=str(init_kwargs.pop("dir", self.run_dir)),
            name=init_kwargs.pop("name", self.run_dir.name),
            **init_kwargs,
        )

    def sync(self) -> int:
        """Mirror what the run directory holds now; return the number of steps sent."""
        run = RunReader(self.run_dir).read()
        sent = 0
        for step, values in merged_steps(run).items():
            if step > self.last_step and values:
                self.wandb_run.log(values, step=step)
                self.last_step, sent = step, sent + 1
        tables = {}
        rows = sample_rows(run)
        if rows:
            tables["samples"] = samples_table(self._wandb, rows)
        eval_rows = [
            [name] + [r.get(c) for c in EVAL_COLUMNS[1:]]
            for name, d in run.evals.items()
            for r in d["results"]
        ]
        if eval_rows:
            tables["eval"] = self._wandb.Table(columns=list(EVAL_COLUMNS), data=eval_rows)
        if tables:
            self.wandb_run.log(tables, step=max(self.last_step, 0))
        return sent

    def finish(self) -> None:
        self.wandb_run.finish()

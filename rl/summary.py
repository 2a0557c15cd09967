"""The summary `heed train` prints at the end: held-out `da` from random through SFT to GRPO, and GRPO - SFT
as paired differences over the completions both evals scored, with their standard errors."""

from __future__ import annotations

import math

from rich.table import Table

from rollouts.protocol import MODES

SUMMARY_METRICS = ("accuracy", "compliance", "coverage", "kv_saving")  # compared GRPO - SFT per example
STAGES = (("init", "random"), ("sft", "after SFT"), ("grpo", "after GRPO"))


def paired_difference(
    before: dict[str, list], after: dict[str, list], metric: int
) -> tuple[float, float, int]:
    """Mean of ``after - before`` over the completions both evals scored, its standard error, and n."""
    diffs = [
        after[k][metric] - before[k][metric]
        for k in before.keys() & after.keys()
        if before[k][metric] is not None and after[k][metric] is not None
    ]
    n = len(diffs)
    if n < 2:
        return (diffs[0] if diffs else math.nan), math.nan, n
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return mean, math.sqrt(var / n), n


def before_after_table(state: dict, suffix: str = "", title: str = "held-out da") -> Table | None:
    """random -> SFT -> GRPO on the `da` eval named ``<stage><suffix>`` (the sampled evals have no random
    stage); ``None`` when there is none."""
    rows = [
        (label, state["eval"][stage + suffix]["da"])
        for stage, label in STAGES
        if stage + suffix in state["eval"]
    ]
    if not rows:
        return None
    table = Table(title=title, title_justify="left")
    for column in ("", "acc", "compl.", "cover.", "KV saved", "/".join(m[0] for m in MODES) + " %", "n"):
        table.add_column(column, justify="left" if not column else "right", no_wrap=True)
    for label, row in rows:
        mix = "/".join(_fmt(row.get(f"mode_mix_{m}"), "{:.0f}", 100) for m in MODES)
        cells = [_fmt(row.get(k)) for k in SUMMARY_METRICS]
        table.add_row(label, *cells, mix, str(row["n"]))
    return table


def difference_line(state: dict, suffix: str = "") -> str | None:
    """``GRPO - SFT`` on the `da` eval named ``<stage><suffix>``: each metric's mean paired difference
    over the completions both evals scored, ± its standard error (KV saving per completion here; the
    table pools tokens over completions). ``None`` before both evals exist."""
    examples = state.get("eval_examples", {})
    before, after = examples.get("sft" + suffix), examples.get("grpo" + suffix)
    if not (before and after):
        return None
    cells, n = [], 0
    for i, name in enumerate(SUMMARY_METRICS):
        mean, se, n = paired_difference(before, after, i)
        cells.append(f"{name} {mean:+.3f} ± {se:.3f}")
    return f"GRPO - SFT (paired, n={n}): " + ", ".join(cells)


def _fmt(value, spec: str = "{:.3f}", scale: float = 1.0) -> str:
    return "-" if value is None else spec.format(value * scale)

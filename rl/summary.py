"""The summary `heed train` prints at the end: held-out `da` from random through SFT to GRPO, and GRPO - SFT
as paired differences over the completions both evals scored, with their standard errors.

Beside the KV saving (a ratio against causal decoding of the same completion) it shows the KV tokens read
per completion: a policy that writes shorter completions reads fewer tokens at the same ratio, and one
that reads less per step at the same length raises the ratio; only the two together say whether GRPO
taught the policy to read less.
"""

from __future__ import annotations

import math

from rich.table import Table

from rollouts.protocol import mode_table

RATE_METRICS = ("accuracy", "compliance", "coverage", "kv_saving")  # shares in [0, 1]
KV_READ = "kv_tokens"  # KV tokens the engine read for one completion (rl.evaluate.completion_kv_tokens)
SUMMARY_METRICS = (*RATE_METRICS, KV_READ)  # per completion, compared GRPO - SFT per example
STAGES = (("init", "random"), ("sft", "after SFT"), ("grpo", "after GRPO"))


def paired_values(before: dict[str, list], after: dict[str, list], metric: int) -> list[tuple[float, float]]:
    """``(before, after)`` of ``metric`` for each completion both evals scored. A completion whose value is
    ``None``, or whose list stops before ``metric`` (a run recorded before that metric was), has none."""
    return [
        (before[k][metric], after[k][metric])
        for k in before.keys() & after.keys()
        if metric < min(len(before[k]), len(after[k]))
        and before[k][metric] is not None
        and after[k][metric] is not None
    ]


def paired_difference(
    before: dict[str, list], after: dict[str, list], metric: int
) -> tuple[float, float, int]:
    """Mean of ``after - before`` over the completions both evals scored, its standard error, and n."""
    diffs = [a - b for b, a in paired_values(before, after, metric)]
    n = len(diffs)
    if n < 2:
        return (diffs[0] if diffs else math.nan), math.nan, n
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return mean, math.sqrt(var / n), n


def before_after_table(state: dict, suffix: str = "", title: str = "held-out da") -> Table | None:
    """random -> SFT -> GRPO on the `da` eval named ``<stage><suffix>`` (the sampled evals have no random
    stage); ``None`` when there is none. Fits an 80-column console."""
    rows = [
        (label, state["eval"][stage + suffix]["da"])
        for stage, label in STAGES
        if stage + suffix in state["eval"]
    ]
    if not rows:
        return None
    table = Table(title=title, title_justify="left")
    mix_header = "/".join(m.name[0] for m in mode_table()) + " %"
    for column in ("", "acc", "compl.", "cover.", "KV\nsaved", "KV read\nper ex.", mix_header, "n"):
        table.add_column(column, justify="left" if not column else "right", no_wrap=True)
    for label, row in rows:
        mix = "/".join(_fmt(row.get(m.eval_key), "{:.0f}", 100) for m in mode_table())
        rates = [_fmt(row.get(k)) for k in RATE_METRICS]
        read = f"{row['kv_tokens'] / row['n']:,.0f}"  # = kv_tokens_per_example, which older evals lack
        table.add_row(label, *rates, read, mix, str(row["n"]))
    return table


def difference_line(state: dict, suffix: str = "") -> str | None:
    """``GRPO - SFT`` on the `da` eval named ``<stage><suffix>``: each metric's mean paired difference
    over the completions both evals scored, ± its standard error (KV saving per completion here; the
    table pools tokens over completions), then the KV tokens read per example, also as a share of SFT's
    mean over the same completions, e.g. ``KV read/ex -75.0 ± 8.3 (-7.2% of SFT's 1,045)``. ``None``
    before both evals exist."""
    examples = state.get("eval_examples", {})
    before, after = examples.get("sft" + suffix), examples.get("grpo" + suffix)
    if not (before and after):
        return None
    cells, n = [], 0
    for i, name in enumerate(RATE_METRICS):
        mean, se, n = paired_difference(before, after, i)
        cells.append(f"{name} {mean:+.3f} ± {se:.3f}")
    read = SUMMARY_METRICS.index(KV_READ)
    pairs = paired_values(before, after, read)
    if pairs:  # runs recorded before KV reads were kept per completion have none
        mean, se, _ = paired_difference(before, after, read)
        sft_mean = sum(b for b, _ in pairs) / len(pairs)
        share = f"{mean / sft_mean:+.1%}" if sft_mean else "-"
        cells.append(f"KV read/ex {mean:+,.1f} ± {se:,.1f} ({share} of SFT's {sft_mean:,.0f})")
    return f"GRPO - SFT (paired, n={n}): " + ", ".join(cells)


def _fmt(value, spec: str = "{:.3f}", scale: float = 1.0) -> str:
    return "-" if value is None else spec.format(value * scale)

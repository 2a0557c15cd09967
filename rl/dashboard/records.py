"""From rollouts to run-directory rows: one trajectory record, and one step's rollout metrics.

Everything here is read off what the rollout already measured — the :class:`CompletionTrace`
(per-step mode states and KV reads, from the shared visibility code), the parser's segments and
violations, and the reward breakdown. Nothing recomputes visibility.

Mode mix is the share of generated tokens by the mode each token was *predicted under*
(``trace.predicted_state``, docs/ARCHITECTURE.md, contract 3: tag timing), the paper's Figure 5 quantity: a ``<focus ...>``
tag's own tokens count as the mode before it, the text after its ``>`` as focus.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from rewards import RewardBreakdown, shown
from rewards.efficiency import DecodeCost, KVReads, Roofline, decode_seconds, kv_bytes
from rollouts.protocol import VIOLATION_KINDS, mode_names
from rollouts.trajectory import Trajectory

UNPAID = ("accuracy_ruler", "kv_saving")  # RewardBreakdown fields logged beside the terms, not paid

# Context-length bins (upper edges in tokens) and their labels; the paper's longest bin is 64-256K.
LENGTH_EDGES = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 262144)
LENGTH_LABELS = ("<=1K", "<=2K", "<=4K", "<=8K", "<=16K", "<=32K", "<=64K", "<=256K", ">256K")


def length_bin(context_tokens: int) -> str:
    """The label of the context-length bin holding ``context_tokens``."""
    for edge, label in zip(LENGTH_EDGES, LENGTH_LABELS, strict=False):
        if context_tokens <= edge:
            return label
    return LENGTH_LABELS[-1]


def bin_order(label: str) -> int:
    """Sort key of a length-bin label; labels this module did not make sort last."""
    return LENGTH_LABELS.index(label) if label in LENGTH_LABELS else len(LENGTH_LABELS)


def context_tokens(trajectory: Trajectory) -> int:
    """The example's context length; the prompt length when the row does not say."""
    value = trajectory.example.get("context_tokens") if isinstance(trajectory.example, Mapping) else None
    return int(value) if isinstance(value, int) and value > 0 else trajectory.layout.prompt_len


def predicted_modes(trajectory: Trajectory) -> list[str]:
    """``[n]`` the mode each generated token was predicted under."""
    return trajectory.trace.predicted_modes


def trajectory_record(trajectory: Trajectory, reward: RewardBreakdown, step: int, record_id: str) -> dict:
    """The ``trajectories/*.jsonl`` record of one scored trajectory (JSON-ready)."""
    t, trace, layout = trajectory, trajectory.trace, trajectory.layout
    n_ctx = context_tokens(t)
    return {
        "id": record_id,
        "step": int(step),
        "example_id": t.example.get("id"),
        "task": t.example.get("task", "unknown"),
        "mode": t.mode,
        "protocol_version": t.protocol_version,
        "finish_reason": t.finish_reason,
        "context_tokens": n_ctx,
        "length_bin": length_bin(n_ctx),
        "layout": {
            "block_size": layout.block_size,
            "prompt_len": layout.prompt_len,
            "chunk_spans": [list(s) for s in layout.chunk_spans],
            "index_span": list(layout.index_span),
        },
        "completion_text": t.completion_text,
        "num_tokens": len(t.completion_ids),
        "segments": [
            {"mode": s.mode, "chunks": list(s.chunks), "start": s.start, "end": s.end}
            for s in t.parsed.segments
        ],
        "answer": t.parsed.answer,
        "answers": list(t.example.get("answers", [])),
        "evidence_chunks": list(t.example.get("evidence_chunks", [])),
        "violations": [{"kind": v.kind, "position": v.position} for v in t.parsed.violations],
        # the trace: states table, the state each token was predicted under, per-step KV reads
        "states": [{"mode": s.mode, "chunks": list(s.chunks)} for s in trace.states],
        "predicted_state": trace.predicted_state.tolist(),
        "kv_tokens": trace.kv_tokens.tolist(),
        "kv_tokens_vanilla": trace.kv_tokens_vanilla.tolist(),
        # what the engine read per step (the DA trace, causal reads, or under Selective Attention eviction
        # the mean over layers) and, under eviction, each layer's own reads [n][L] (None without it)
        "kv_tokens_read": t.kv_tokens_read.tolist(),
        "kv_tokens_per_layer": None
        if t.kv_tokens_per_layer is None
        else np.asarray(t.kv_tokens_per_layer).tolist(),
        "reward": {
            **{name: reward.value(name) for name in (*shown(), *UNPAID)},
            "reasons": list(reward.reasons),
        },
    }


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def step_metrics(
    trajectories: Sequence[Trajectory],
    rewards: Sequence[RewardBreakdown],
    cost: DecodeCost | None = None,
    vanilla_steps: Sequence[int] | None = None,
    importance_ratios: np.ndarray | None = None,  # [tokens] policy / rollout probability ratios
    wall_time_s: float | None = None,
    roofline: Roofline | None = None,
) -> dict[str, float | None]:
    """The flat ``metrics.jsonl`` keys for one batch of scored rollouts (see ``run_dir`` for names).

    ``cost``: the model's :class:`~rewards.efficiency.DecodeCost`, for KV bytes and roofline decoding
    time (``roofline``: the accelerator, :class:`Roofline`'s defaults when ``None``); ``vanilla_steps``: generated tokens
    of the same examples without DA (for ``decode/steps_overhead``); ``wall_time_s``: time the batch
    took (for ``throughput/tokens_per_s``). Each is skipped when absent.

    KV reads come from :meth:`KVReads.from_trajectory` (what the engine read in the trajectory's mode,
    per layer under Selective Attention eviction) and are converted by the efficiency reward's own
    :func:`~rewards.efficiency.kv_bytes` and :func:`~rewards.efficiency.decode_seconds`.
    """
    if len(trajectories) != len(rewards):
        raise ValueError(f"{len(trajectories)} trajectories but {len(rewards)} rewards")
    out: dict[str, float | None] = {}
    for name in (*shown(), *UNPAID):  # over the completions that know it (coverage, saving: not all)
        out[f"reward/{name}"] = _mean([v for r in rewards if (v := r.value(name)) is not None])

    by_task: dict[str, list[RewardBreakdown]] = defaultdict(list)
    by_bin: dict[str, list[int]] = defaultdict(list)  # bin -> indices
    for i, (t, r) in enumerate(zip(trajectories, rewards, strict=True)):
        by_task[t.example.get("task", "unknown")].append(r)
        by_bin[length_bin(context_tokens(t))].append(i)
    for task, rs in sorted(by_task.items()):
        out[f"accuracy/by_task/{task}"] = _mean([r.accuracy for r in rs])
        out[f"compliance/by_task/{task}"] = _mean([r.compliance for r in rs])
        out[f"coverage/by_task/{task}"] = _mean([r.coverage for r in rs if r.coverage is not None])

    modes = [predicted_modes(t) for t in trajectories]
    out.update(_mode_mix("mode_mix", [m for ms in modes for m in ms]))
    for label, idx in sorted(by_bin.items(), key=lambda kv: bin_order(kv[0])):
        out[f"accuracy/by_length/{label}"] = _mean([rewards[i].accuracy for i in idx])
        out[f"compliance/by_length/{label}"] = _mean([rewards[i].compliance for i in idx])
        out[f"coverage/by_length/{label}"] = _mean(
            [rewards[i].coverage for i in idx if rewards[i].coverage is not None]
        )
        out.update(_mode_mix(f"mode_mix/by_length/{label}", [m for i in idx for m in modes[i]]))

    decoded = [t for t in trajectories if len(t.completion_ids)]  # a failed rollout may hold no step
    out.update(_kv_reads([KVReads.from_trajectory(t) for t in decoded], cost, roofline or Roofline()))
    # per completion, the quantity GRPO's efficiency reward pushes down (batch sums also grow with the
    # batch); like decode/steps a rollout the pool gave up on read nothing and counts as 0
    for name in ("kv/tokens_da", "kv/tokens_vanilla"):
        out[f"{name}_per_completion"] = out[name] / len(trajectories) if trajectories else None

    generated = sum(len(t.completion_ids) for t in trajectories)
    out["decode/steps"] = generated / len(trajectories) if trajectories else None
    if vanilla_steps is not None and sum(vanilla_steps):
        out["decode/steps_overhead"] = generated / sum(vanilla_steps) - 1.0

    kinds = Counter(v.kind for t in trajectories for v in t.parsed.violations)
    for kind in VIOLATION_KINDS:
        out[f"violations/{kind}"] = kinds[kind] / len(trajectories) if trajectories else None

    if importance_ratios is not None and len(importance_ratios):
        ratios = np.asarray(importance_ratios, dtype=float)
        out["is_ratio/mean"], out["is_ratio/min"], out["is_ratio/max"] = (
            float(ratios.mean()),
            float(ratios.min()),
            float(ratios.max()),
        )
    if wall_time_s:
        out["throughput/tokens_per_s"] = generated / wall_time_s
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def _kv_reads(reads: Sequence[KVReads], cost: DecodeCost | None, roofline: Roofline) -> dict[str, float]:
    """Batch sums of KV reads: tokens (per layer, averaged over layers), per-layer tokens when any
    completion was decoded with per-layer eviction, and with ``cost`` bytes and roofline seconds."""
    out: dict[str, float] = {}
    per_layer = [r.layers for r in reads if r.layers is not None]
    layers = per_layer[0] if per_layer else 1
    read_by_layer = np.zeros(layers)  # [layers] KV tokens read, summed over steps and completions
    vanilla = 0
    for r in reads:
        read_by_layer += r.read.sum(axis=0) if r.read.ndim == 2 else r.read.sum()
        vanilla += int(r.vanilla.sum())
    da = float(read_by_layer.mean())
    out["kv/tokens_da"], out["kv/tokens_vanilla"] = (int(da) if da.is_integer() else da), vanilla
    out["kv/saving"] = 1.0 - da / vanilla if vanilla else None
    if per_layer:
        out.update({f"kv/tokens_da/layer_{i:02d}": int(n) for i, n in enumerate(read_by_layer)})
    if cost is not None:
        nbytes = np.array([kv_bytes(r, cost.kv) for r in reads]).reshape(-1, 2).sum(axis=0)
        seconds = np.array([decode_seconds(r, cost, roofline) for r in reads]).reshape(-1, 2).sum(axis=0)
        out["kv/bytes_da"], out["kv/bytes_vanilla"] = int(nbytes[0]), int(nbytes[1])
        out["decode/roofline_s_da"], out["decode/roofline_s_vanilla"] = float(seconds[0]), float(seconds[1])
    return out


def _mode_mix(prefix: str, modes: Sequence[str]) -> dict[str, float | None]:
    counts = Counter(modes)
    total = len(modes)
    return {f"{prefix}/{m}": (counts[m] / total if total else None) for m in mode_names()}

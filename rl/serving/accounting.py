"""A served completion's KV accounting: what the client gets in ``"heed"`` and what ``/metrics`` adds up.

Nothing is derived here. The completion's token ids go through ``build_trajectory`` — the trace
(``rollouts.masks.visibility.trace_completion``: the tracker the plugin runs while decoding, so its per-step
``kv_tokens`` are what the engine handed attention) and the parse — and the figures are the ones
``heed eval`` sums per mode (``Trajectory.kv_tokens_read``, ``trace.kv_tokens_vanilla``,
``records.predicted_modes``); bytes come from ``rollouts.masks.accounting.KVShape``. One request::

    "heed": {"mode": "da", "prompt_tokens": 448, "completion_tokens": 20,
             "kv_tokens": 3861, "kv_tokens_vanilla": 9150, "kv_saving": 0.578,
             "kv_bytes": ..., "kv_bytes_vanilla": ...,          KVShape x tokens (every layer, K and V)
             "mode_mix": {"global": 9, "focus": 7, "local": 4}, generated tokens by the mode they were
                                                                 predicted under
             "violations": [], "answer": "42", "protocol_version": 2,
             "kv_tokens_per_layer": null, "kv_peak_per_layer": null}

A Selective Attention export under budgets evicts in every mode, so the DA trace overstates what it reads.
The middleware collects each request's per-layer reads from the worker (``heed_sa_reports``, keyed by
``SA_KEY``) and passes them here, as the rollout engine passes them to its trajectories; then ``kv_tokens`` is
the mean over layers of what each layer read, summed over decoding steps (``Trajectory.kv_tokens_read``,
what ``heed eval`` sums), ``kv_tokens_per_layer`` each layer's own sum and ``kv_peak_per_layer`` the most
any decoding step read in that layer: the KV it held, at most its budget. Both are ``null`` for a standard
export. A streamed response gets the same record on its final event (``rl/serving/streaming.py``).

The Prometheus series live in the API server's process registry, which vLLM's ``/metrics`` serves (with
``--api-server-count > 1`` vLLM switches to its multiprocess registry, which prometheus_client also
writes these to). Counters: ``heed:requests_total{mode}``, ``heed:kv_tokens_read_total{mode}``,
``heed:kv_tokens_vanilla_total{mode}``, ``heed:generated_tokens_total{mode,attention}``,
``heed:protocol_violations_total{kind}``, ``heed:rejected_requests_total``; histogram
``heed:kv_saving{mode}`` (per request).
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

from prometheus_client import Counter, Histogram

from rollouts.engines.base import RolloutRequest, build_trajectory
from rollouts.masks.accounting import KVShape
from rollouts.protocol import mode_names
from rollouts.protocol.layout import PromptLayout

REQUESTS = Counter("heed:requests", "DA-laid-out requests served, by rollout mode", ["mode"])
KV_READ = Counter(
    "heed:kv_tokens_read", "KV tokens served requests read, block-rounded, summed over decode steps", ["mode"]
)
KV_VANILLA = Counter(
    "heed:kv_tokens_vanilla", "KV tokens the same completions read under causal attention", ["mode"]
)
GENERATED = Counter(
    "heed:generated_tokens",
    "generated tokens by the DA mode they were predicted under",
    ["mode", "attention"],
)
VIOLATIONS = Counter("heed:protocol_violations", "DA protocol violations in served completions", ["kind"])
REJECTED = Counter("heed:rejected_requests", "requests refused before the engine (HTTP 400 from Heed)")
SAVING = Histogram(
    "heed:kv_saving",
    "per request: 1 - kv_tokens / kv_tokens_vanilla",
    ["mode"],
    buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0),
)
HEED_FIELD = "heed"  # the response field that carries a request's accounting
_FINISH = {"stop": "stop", "length": "length"}  # what a Trajectory knows; anything else is an error


def request_accounting(
    layout: PromptLayout,
    mode: str,
    completion_ids: list[int],
    token_table: list[bytes],
    kv_shape: KVShape,
    finish_reason: str | None = "stop",
    kv_tokens_per_layer: list[list[int]] | None = None,
) -> dict[str, Any]:
    """The ``"heed"`` record of one completion (module docstring); ``kv_tokens_per_layer`` ``[n][L]``: what
    each layer of a Selective Attention model under budgets read per generated token."""
    ids = [int(t) for t in completion_ids]
    if kv_tokens_per_layer is not None and len(kv_tokens_per_layer) != len(ids):
        raise ValueError(
            f"the worker reported per-layer reads for {len(kv_tokens_per_layer)} generated tokens, the "
            f"completion has {len(ids)}"
        )
    request = RolloutRequest(layout, mode, max_tokens=max(1, len(ids)))
    trajectory = build_trajectory(
        request, ids, None, token_table, finish_reason=_FINISH.get(finish_reason or "", "error"),
        kv_tokens_per_layer=kv_tokens_per_layer,
    )  # fmt: skip
    kv = round(float(trajectory.kv_tokens_read.sum()))  # as heed eval sums it
    vanilla = int(trajectory.trace.kv_tokens_vanilla.sum())
    mix = Tally(trajectory.trace.predicted_modes)
    parsed = trajectory.parsed
    return {
        "mode": mode,
        "prompt_tokens": layout.prompt_len,
        "completion_tokens": len(ids),
        "kv_tokens": kv,
        "kv_tokens_vanilla": vanilla,
        "kv_saving": 1.0 - kv / vanilla if vanilla else None,
        "kv_bytes": kv_shape.kv_bytes(kv),
        "kv_bytes_vanilla": kv_shape.kv_bytes(vanilla),
        "mode_mix": {m: mix[m] for m in mode_names()},
        "violations": [v.kind for v in parsed.violations],
        "answer": parsed.answer,
        "protocol_version": layout.protocol_version,
        "kv_tokens_per_layer": trajectory.kv_tokens_by_layer,
        "kv_peak_per_layer": trajectory.kv_peak_by_layer,
    }


def record_metrics(accounting: dict[str, Any]) -> None:
    """Add one request's accounting to the Prometheus series."""
    mode = accounting["mode"]
    REQUESTS.labels(mode).inc()
    KV_READ.labels(mode).inc(accounting["kv_tokens"])
    KV_VANILLA.labels(mode).inc(accounting["kv_tokens_vanilla"])
    for attention, count in accounting["mode_mix"].items():
        GENERATED.labels(mode, attention).inc(count)
    for kind in accounting["violations"]:
        VIOLATIONS.labels(kind).inc()
    if accounting["kv_saving"] is not None:
        SAVING.labels(mode).observe(accounting["kv_saving"])

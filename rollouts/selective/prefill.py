"""A prefill under a KV budget, streamed in chunks over the tokens the layer holds.

A dense prefill (:func:`rollouts.selective.attention.selective_attention_forward` with budgets) builds ``S``,
``F``, the replayed held sets and the attention bias as ``[b, n, n]``: every query against every key, although
under a budget ``K`` a query reads at most ``K`` of them. This one reads the prompt as a decoding loop with a
compacted cache would, ``chunk`` queries at a time::

    held = nothing; total = nothing                    # the held positions, in arrival order, and their F sums
    for each chunk of queries:
        candidates = held + the chunk's own tokens     # K + chunk keys, not n
        S  = selection matrix of the chunk's queries over the candidates (head 0)
        F  = total, then + each row of S in turn       # F rows of the chunk's queries, summed in arrival order
        replay eviction over the chunk (rollouts.selective.eviction.replay_evictions)
        out = softmax(logits - F) over what each query holds
        held, total = what the layer holds after the chunk, and its F sums

So the work is ``O(n (K + chunk))`` per layer instead of ``O(n^2)``, and what is left at the end is what a
decoding loop continues from: the held positions and their running ``F`` sums. The decisions are the dense
replay's (the same rule, ``F`` summed in the same order); outputs agree to float rounding.

Left out: gradients (a rollout engine's prefill; the trainer replays densely, it needs every ``F`` for
L_mem), attention masks beyond causality and padding, and a layer without a budget (nothing to stream over).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attention import head0_logits, softmax_attention
from .eviction import replay_evictions
from .mask import selection_matrix

DEFAULT_CHUNK = 128  # queries per step: larger chunks mean fewer steps but more candidates per query


@dataclass
class BudgetedPrefill:
    """What :func:`budgeted_prefill` returns for ``R`` rows of ``n`` positions under budget ``K``."""

    out: torch.Tensor  # [R, heads, n, d] the attention output of every query
    reads: torch.Tensor  # [R, n] keys each query read
    held: torch.Tensor  # [R, K] positions held after the last query, ascending; -1 in unused slots
    total: torch.Tensor  # [R, K] float32 their F sums: the F row of the query that comes next


@torch.no_grad()
def budgeted_prefill(
    query: torch.Tensor,  # [R, heads, n, d]
    key: torch.Tensor,  # [R, kv_heads, n, d]
    value: torch.Tensor,  # [R, kv_heads, n, d]
    real: torch.Tensor,  # [R, n] bool: True = a token (padding never enters, nor is attended)
    budget: int,
    scaling: float,
    chunk: int = DEFAULT_CHUNK,
) -> BudgetedPrefill:
    """One layer's Selective Attention prefill of ``R`` sequences under KV budget ``budget``, in chunks.

    Each row's <BOS> is its first real token. A padding query sees only itself (its output is not used).
    """
    rows, heads, n, d = query.shape
    kv_heads = key.shape[1]
    device = query.device
    out = query.new_zeros(rows, heads, n, d)
    reads = torch.zeros(rows, n, dtype=torch.long, device=device)
    held = torch.full((rows, budget), -1, dtype=torch.long, device=device)  # positions, ascending
    total = torch.zeros(rows, budget, dtype=torch.float32, device=device)
    real_np = real.cpu().numpy()
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        size, width = stop - start, budget + stop - start
        positions = torch.cat(
            [held, torch.arange(start, stop, device=device).expand(rows, size)], 1
        )  # [R, M]
        valid = torch.cat([held >= 0, real[:, start:stop]], 1)  # [R, M]
        index = positions.clamp(min=0)[:, None, :, None].expand(rows, kv_heads, width, d)
        keys, values = key.gather(2, index), value.gather(2, index)  # [R, kv_heads, M, d]
        chunk_query = query[:, :, start:stop]  # [R, heads, C, d]
        # Query i (candidate K + i) sees the held tokens and the chunk's up to itself; padding only itself
        causal = torch.ones(size, width, dtype=torch.bool, device=device).tril(budget)  # [C, M]
        own = torch.zeros(size, width, dtype=torch.bool, device=device)
        own[torch.arange(size), budget + torch.arange(size)] = True
        querying = real[:, start:stop, None]  # [R, C, 1]
        visible = torch.where(querying, valid[:, None, :] & causal, own)  # [R, C, M]
        s = selection_matrix(head0_logits(chunk_query, keys, scaling), visible)  # [R, C, M]
        prior = torch.cat([total, total.new_zeros(rows, size)], 1)  # [R, M]
        f = torch.cat([prior[:, None], s[:, :-1]], 1).cumsum(1)  # [R, C, M] F rows, summed in arrival order
        after = f[:, -1] + s[:, -1]  # [R, M] F sums once the chunk's last query is done

        # Eviction over the chunk: candidate j arrives as step j (the held ones have arrived already)
        f_steps = np.zeros((rows, width, width), dtype=np.float32)
        f_steps[:, budget:] = f.cpu().numpy()
        valid_np = np.concatenate([(held >= 0).cpu().numpy(), real_np[:, start:stop]], 1)  # [R, M]
        holding = np.zeros((rows, width), dtype=bool)
        holding[:, :budget] = valid_np[:, :budget]
        evicted = replay_evictions(
            f_steps, valid_np, budget, np.arange(rows), np.full(rows, budget), np.full(rows, width), holding
        )  # [R, M] the step at which each candidate was evicted (M: never)
        steps = np.arange(budget, width)[:, None]  # [C, 1]
        keep = (
            valid_np[:, None, :] & (np.arange(width)[None, None, :] <= steps) & (evicted[:, None, :] > steps)
        )
        attended = visible & torch.from_numpy(keep).to(device)  # [R, C, M]
        reads[:, start:stop] = attended.sum(-1)
        out[:, :, start:stop] = softmax_attention(chunk_query, keys, values, attended, -f, scaling, 0.0)

        # What the layer holds now, oldest first (candidates are in arrival order), and their F sums
        count = holding.sum(1)  # [R] at most K
        kept = np.argsort(~holding, axis=1, kind="stable")[:, :budget]  # [R, K] held candidates first
        filled = torch.from_numpy(np.arange(budget)[None, :] < count[:, None]).to(device)
        kept = torch.from_numpy(kept).to(device)
        held = torch.where(filled, positions.gather(1, kept), -1)
        total = torch.where(filled, after.gather(1, kept), 0.0)
    return BudgetedPrefill(out=out, reads=reads, held=held, total=total)

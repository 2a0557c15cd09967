"""The training-side DA mask for a padded batch of (prompt + completion) sequences.

The trainer's log-prob forward must see exactly what the rollout engine let each token see, or the
importance ratios drift from 1. Row ``p`` of the mask is the visibility of the forward at position
``p``: prompt rows are plain causal (prefill is unmasked), completion row ``prompt_len + j`` uses
``CompletionTrace.row_state[j]`` (the state after parsing ``g_0..g_j``). Chunk blocks are block
aligned, so the token-level mask equals the engine's block-level one.

Built without per-token loops: for each row, the distinct states' key visibility ``[S, T]`` is
computed once (one :func:`~rollouts.masks.visibility.visible_chunks` row per state, gathered by each
key's chunk id), then indexed by the query's state. Two forms:

- ``dense_training_mask``: ``[B, 1, T, T]`` bool (True = attend) for SDPA; ``B * T^2`` bytes
  (8 x 8192^2 = 512 MiB), the path for CPU where FlexAttention has no backward.
- ``block_training_mask``: a FlexAttention ``BlockMask`` for GPUs; it stores block indices,
  ``O(B * (T / 128)^2)`` int32, plus the ``[B, S, T]`` bool state table its ``mask_mod`` reads.

Both carry causality and padding themselves (transformers passes a 4D mask through untouched).
Padding rows attend to themselves only, so SDPA never sees an all-masked row (which gives NaN).
Positions: pass ``position_ids`` too, so left padding does not shift RoPE away from the engine's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .visibility import CompletionTrace, state_visibility


@dataclass(frozen=True)
class MaskBatch:
    """Per-row index tensors from which both mask forms are built."""

    state_keys: torch.Tensor  # [B, S_max, T] bool: may a query in state s read key t (before causality)
    query_state: torch.Tensor  # [B, T] int64: state index of each query position (0 = global)
    valid: torch.Tensor  # [B, T] bool: real (non-padding) positions
    position_ids: torch.Tensor  # [B, T] int64: 0-based positions of real tokens, as the engine numbers them


def mask_batch(traces: Sequence[CompletionTrace], prompt_starts: Sequence[int], seq_len: int) -> MaskBatch:
    """Lay out each trace in a padded row of length ``seq_len``.

    ``prompt_starts[b]`` is where row ``b``'s prompt begins (TRL left-pads prompts:
    ``max_prompt_len - prompt_len``); its completion follows the prompt and padding follows that.
    """
    if len(traces) != len(prompt_starts):
        raise ValueError(f"{len(traces)} traces but {len(prompt_starts)} prompt_starts")
    batch = len(traces)
    s_max = max((len(t.states) for t in traces), default=1)
    state_keys = np.zeros((batch, s_max, seq_len), dtype=bool)
    query_state = np.zeros((batch, seq_len), dtype=np.int64)
    valid = np.zeros((batch, seq_len), dtype=bool)
    for b, (trace, start) in enumerate(zip(traces, prompt_starts)):
        layout, n = trace.layout, len(trace.row_state)
        end = start + layout.prompt_len + n
        if start < 0 or end > seq_len:
            raise ValueError(
                f"row {b}: prompt at {start} with {layout.prompt_len}+{n} tokens does not fit seq_len={seq_len}"
            )
        key_chunk = np.zeros(seq_len, dtype=np.int64)
        key_chunk[start : start + layout.prompt_len] = layout.chunk_of_token
        vis = state_visibility(trace.states, layout.num_chunks)  # [S, C+1]
        state_keys[b, : len(trace.states)] = vis[:, key_chunk]
        query_state[b, start + layout.prompt_len : end] = trace.row_state
        valid[b, start:end] = True
    valid_t = torch.from_numpy(valid)
    position_ids = (valid_t.long().cumsum(-1) - 1).clamp_min(0)
    return MaskBatch(torch.from_numpy(state_keys), torch.from_numpy(query_state), valid_t, position_ids)


def dense_training_mask(batch: MaskBatch) -> torch.Tensor:
    """``[B, 1, T, T]`` bool mask (True = attend) for SDPA."""
    b_size, _, seq_len = batch.state_keys.shape
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril_()
    eye = torch.eye(seq_len, dtype=torch.bool)
    out = torch.empty(b_size, 1, seq_len, seq_len, dtype=torch.bool)
    for b in range(b_size):
        rows = batch.state_keys[b].index_select(0, batch.query_state[b])  # [T, T]
        rows &= causal
        rows &= batch.valid[b][None, :] & batch.valid[b][:, None]
        rows |= eye & ~batch.valid[b][:, None]  # padding rows see themselves only
        out[b, 0] = rows
    return out


def block_training_mask(batch: MaskBatch, block_size: int = 128, device: str | torch.device = "cpu"):
    """A FlexAttention ``BlockMask`` equal to :func:`dense_training_mask` (for GPUs)."""
    from torch.nn.attention.flex_attention import create_block_mask

    state_keys = batch.state_keys.to(device)
    query_state = batch.query_state.to(device)
    valid = batch.valid.to(device)
    mask_mod = _mask_mod(state_keys, query_state, valid)
    b_size, _, seq_len = state_keys.shape
    return create_block_mask(mask_mod, b_size, None, seq_len, seq_len, device=device, BLOCK_SIZE=block_size)


def _mask_mod(state_keys, query_state, valid):
    def mask_mod(b, h, q, kv):
        visible = state_keys[b, query_state[b, q], kv] & (kv <= q) & valid[b, q] & valid[b, kv]
        return visible | ((q == kv) & ~valid[b, q])

    return mask_mod

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
  ``O(B * (T / 128)^2)`` int32, plus the ``[B, S, T]`` bool state table its ``mask_mod`` reads,
  and is derived at block level (no ``T x T`` evaluation, unlike ``create_block_mask``).

Group-shared rows (:func:`shared_mask_batch`, ``[prompt | c_1 | ... | c_G]``: one prompt forward for a
GRPO group) are the same tensors: each completion brings its own states, whose key rows hide the other
completions, so neither form needs a second visibility rule. ``branches`` says which completion each
position belongs to: Selective Attention, whose ``F`` sums over every earlier row, needs it to keep one
completion's selections out of another's (:class:`rollouts.selective.attention.AttentionState`).

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
    branches: torch.Tensor  # [B, T] int64: 0 on the prompt and padding before it, j on completion j, -1 after


def mask_batch(traces: Sequence[CompletionTrace], prompt_starts: Sequence[int], seq_len: int) -> MaskBatch:
    """Lay out each trace in a padded row of length ``seq_len``.

    ``prompt_starts[b]`` is where row ``b``'s prompt begins (TRL left-pads prompts:
    ``max_prompt_len - prompt_len``); its completion follows the prompt and padding follows that.
    """
    if len(traces) != len(prompt_starts):
        raise ValueError(f"{len(traces)} traces but {len(prompt_starts)} prompt_starts")
    return shared_mask_batch([[t] for t in traces], prompt_starts, seq_len)


def shared_mask_batch(
    groups: Sequence[Sequence[CompletionTrace]], prompt_starts: Sequence[int], seq_len: int
) -> MaskBatch:
    """Rows laid out as ``[pad] prompt c_1 .. c_k [pad]``: one prompt, the ``k`` completions of
    ``groups[b]`` (traces of that same prompt) after it, in order.

    Completion ``i`` reads the prompt under its own mode states and its own earlier tokens, never another
    completion's: each completion keeps its own state table, and a state's key row shows generated keys of
    its own completion only. So isolation lives in ``state_keys`` and both mask forms (dense and BlockMask)
    inherit it with no rule of their own. Position ids restart at the prompt length for every completion,
    as the engine numbers them. A group of one is :func:`mask_batch`'s row.
    """
    if len(groups) != len(prompt_starts):
        raise ValueError(f"{len(groups)} groups but {len(prompt_starts)} prompt_starts")
    batch = len(groups)
    s_max = max((sum(len(t.states) for t in group) for group in groups), default=1)
    state_keys = np.zeros((batch, s_max, seq_len), dtype=bool)
    query_state = np.zeros((batch, seq_len), dtype=np.int64)
    valid = np.zeros((batch, seq_len), dtype=bool)
    position_ids = np.zeros((batch, seq_len), dtype=np.int64)
    branches = np.full((batch, seq_len), -1, dtype=np.int64)
    for b, (group, start) in enumerate(zip(groups, prompt_starts)):
        layout = group[0].layout
        if any(t.layout != layout for t in group):
            raise ValueError(f"row {b}: the traces of a shared row must have one prompt layout")
        p = layout.prompt_len
        end = start + p + sum(len(t.row_state) for t in group)
        if start < 0 or end > seq_len:
            raise ValueError(
                f"row {b}: prompt at {start} with {p}+{end - start - p} tokens does not fit seq_len={seq_len}"
            )
        key_chunk = np.zeros(seq_len, dtype=np.int64)
        key_chunk[start : start + p] = layout.chunk_of_token
        position_ids[b, start : start + p] = np.arange(p)
        valid[b, start:end] = True
        branches[b, : start + p] = 0
        first_state, offset = 0, start + p  # this completion's first state index and first token
        for branch, trace in enumerate(group, start=1):
            n, s = len(trace.row_state), len(trace.states)
            keys = state_visibility(trace.states, layout.num_chunks)[:, key_chunk]  # [s, T]
            keys[:, start + p : offset] = False  # earlier completions' tokens
            keys[:, offset + n :] = False  # later completions' tokens (padding is cut by `valid`)
            state_keys[b, first_state : first_state + s] = keys
            query_state[b, offset : offset + n] = first_state + trace.row_state
            position_ids[b, offset : offset + n] = np.arange(p, p + n)
            branches[b, offset : offset + n] = branch
            first_state, offset = first_state + s, offset + n
    return MaskBatch(
        torch.from_numpy(state_keys),
        torch.from_numpy(query_state),
        torch.from_numpy(valid),
        torch.from_numpy(position_ids),
        torch.from_numpy(branches),
    )


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
    """A FlexAttention ``BlockMask`` equal to :func:`dense_training_mask` (for GPUs).

    The block structure is derived from the per-state key visibility at block level, never from a
    ``T x T`` evaluation: a (query block, key block) tile is *full* when every query in it is real and
    every state present among its queries sees every key in the key block (strictly below the
    diagonal), *partial* when some query may see some key, and skipped otherwise. Partial tiles are
    resolved by ``mask_mod`` inside the kernel. ``O(B * (T / block)^2 * S)`` work and memory.
    """
    from torch.nn.attention.flex_attention import BlockMask

    full, partial = _tile_classes(batch, block_size)
    kv_num, kv_indices = _tile_indices(partial)
    full_num, full_indices = _tile_indices(full)
    seq_len = batch.state_keys.shape[-1]
    mask_mod = _mask_mod(batch.state_keys.to(device), batch.query_state.to(device), batch.valid.to(device))
    return BlockMask.from_kv_blocks(
        kv_num.to(device),
        kv_indices.to(device),
        full_num.to(device),
        full_indices.to(device),
        BLOCK_SIZE=block_size,
        mask_mod=mask_mod,
        seq_lengths=(seq_len, seq_len),
    )


def _tile_classes(batch: MaskBatch, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, nb, nb]`` bool pairs (full, partial) over (query block, key block) tiles."""
    b_size, n_states, seq_len = batch.state_keys.shape
    nb = -(-seq_len // block)
    pad = nb * block - seq_len
    q_idx = torch.arange(nb)[:, None]
    k_idx = torch.arange(nb)[None, :]
    full = torch.zeros(b_size, nb, nb, dtype=torch.bool)
    partial = torch.zeros(b_size, nb, nb, dtype=torch.bool)
    for b in range(b_size):
        valid = torch.nn.functional.pad(batch.valid[b], (0, pad))  # [nb * block], padding is not real
        keys = torch.nn.functional.pad(batch.state_keys[b], (0, pad)) & valid  # [S, nb * block]
        seen = keys.view(n_states, nb, block).sum(-1)  # [S, nb]: keys of each block a state sees
        state_sees_all, state_sees_some = seen == block, seen > 0
        query_state = torch.nn.functional.pad(batch.query_state[b], (0, pad))
        present = torch.zeros(nb, n_states, dtype=torch.bool)  # [nb, S]: states among a block's real queries
        real = valid.nonzero().squeeze(-1)
        present[real // block, query_state[real]] = True
        all_real = valid.view(nb, block).all(-1)  # [nb]
        sees_all = (~present[:, :, None] | state_sees_all[None]).all(1) & all_real[:, None]
        sees_some = (present[:, :, None] & state_sees_some[None]).any(1)
        sees_some |= torch.diag(~all_real)  # padding rows attend to themselves
        full[b] = sees_all & (k_idx < q_idx)
        partial[b] = sees_some & (k_idx <= q_idx) & ~full[b]
    return full, partial


def _tile_indices(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, nb, nb]`` bool -> per query block the count ``[B, 1, nb]`` and the key-block indices
    ``[B, 1, nb, nb]`` (selected ones first, ascending), as ``BlockMask.from_kv_blocks`` takes them."""
    counts = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[:, None], order[:, None]


def _mask_mod(state_keys, query_state, valid):
    def mask_mod(b, h, q, kv):
        visible = state_keys[b, query_state[b, q], kv] & (kv <= q) & valid[b, q] & valid[b, kv]
        return visible | ((q == kv) & ~valid[b, q])

    return mask_mod

"""Decoding many sequences under a KV budget from one buffer per layer: a row per sequence, what it holds.

Under a budget ``K`` a decoding layer attends over at most ``K`` keys, and each step changes a sequence's
held set by one key in and (once full) one out. So each sequence keeps its held keys, values, ``F`` sums
and positions in one row of a per-layer buffer, in arrival order, and a decoding step of ``R`` sequences is
a handful of batched ops, not a copy per sequence::

    batch  = the sequences' rows (one index_select each) up to the longest, then the arriving keys
             as the last column                        # [R, kv_heads, W + 1, d]: the query is the last key
    selective attention over it (the one function):    F, and the most-masked held token evicted once full
    write back: the rows (one index_put), then the arriving column at each row's length
    a row holding more than ``slack`` evicted keys is compacted (a gather of its own)

Shorter rows leave a gap before the last column; it is neither attended, selected nor held, so ``F``, the
evictions (the oldest on ties: columns are in arrival order) and the outputs are each sequence's own, as
decoding it alone over a cache that keeps every key (:func:`rollouts.selective.attention.selective_attention_forward`).
A row is at most ``K + slack + 1`` wide. Rows are slots the caller assigns and frees; the buffer grows by
doubling its rows. Left out: layers without a budget (a row would grow without bound).
"""

from __future__ import annotations

import types

import numpy as np
import torch

from .attention import AttentionState, selective_attention_forward
from .mask import MaskAccumulator


class HeldCache:
    """One layer's held KV of many decoding sequences under ``budgets[layer_idx]``; rows are slots."""

    def __init__(self, layer_idx: int, budgets: tuple[int, ...], slack: int):
        self.layer_idx, self.budgets, self.slack = layer_idx, budgets, slack
        self.budget = budgets[layer_idx]
        self.width = self.budget + slack + 1  # the most keys a row holds during a step (the arriving one too)
        self.length = np.zeros(0, dtype=np.int64)  # [slots] keys each row holds
        self.keys: torch.Tensor | None = None  # [slots, kv_heads, width, d]
        self.values: torch.Tensor | None = None
        self.total: torch.Tensor | None = None  # [slots, width] float32: the next query's F row
        self.held: torch.Tensor | None = None  # [slots, width] bool: not yet evicted (compaction pending)
        self.positions: torch.Tensor | None = None  # [slots, width] long

    def load(
        self, slot: int, keys: torch.Tensor, values: torch.Tensor, total: torch.Tensor, positions
    ) -> None:
        """Put a prefilled sequence in row ``slot``: its held ``keys``, ``values`` ``[1, kv_heads, m, d]``
        (``m <= K``, in arrival order), their ``F`` sums ``total`` ``[1, m]`` and ``positions`` ``[m]``."""
        m = keys.shape[2]
        if m > self.budget:
            raise ValueError(
                f"a sequence holding {m} keys cannot load into a layer with budget {self.budget}"
            )
        self._grow(slot + 1, keys)
        self.keys[slot, :, :m], self.values[slot, :, :m] = keys[0], values[0]
        self.total[slot, :m], self.positions[slot, :m] = total[0], torch.as_tensor(positions)
        self.held[slot] = False
        self.held[slot, :m] = True
        self.length[slot] = m

    def row_positions(self, slot: int) -> torch.Tensor:
        """``[length]`` the positions row ``slot`` holds."""
        return self.positions[slot, : self.length[slot]]

    def step(
        self,
        slots: list[int],
        query: torch.Tensor,  # [R, heads, 1, d]
        key: torch.Tensor,  # [R, kv_heads, d] the arriving tokens' keys
        value: torch.Tensor,  # [R, kv_heads, d]
        positions: list[int],  # [R] the arriving tokens' positions
        visible: list[np.ndarray | None],  # per row: the keys it may read, by position (a DA mode), or None
        scaling: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoding step of ``R`` rows: ``(out [R, heads, d], reads [R])``; the rows are updated."""
        index = torch.as_tensor(slots)
        lengths = self.length[slots]  # [R]
        width = int(lengths.max())
        keys = torch.cat([self.keys[index, :, :width], key[:, :, None]], 2)  # [R, kv_heads, W + 1, d]
        values = torch.cat([self.values[index, :, :width], value[:, :, None]], 2)
        columns = np.arange(width + 1)
        readable = torch.from_numpy((columns[None, :] < lengths[:, None]) | (columns[None, :] == width))
        for r, (slot, keys_by_position) in enumerate(zip(slots, visible)):
            if keys_by_position is not None:  # a DA mode hides some held keys
                readable[r, : lengths[r]] = torch.from_numpy(
                    keys_by_position[self.row_positions(slot).cpu().numpy()]
                )
        state = AttentionState(budgets=self.budgets)
        state.accumulators[self.layer_idx] = MaskAccumulator()
        state.accumulators[self.layer_idx].total = self.total[index, :width]
        state.held[self.layer_idx] = self.held[index, :width]
        out, _ = selective_attention_forward(
            types.SimpleNamespace(layer_idx=self.layer_idx),
            query,
            keys,
            values,
            readable.to(query.device)[:, None, None, :],
            scaling=scaling,
            heed_state=state,
        )
        total, held = state.accumulators[self.layer_idx].total, state.held[self.layer_idx]  # [R, W + 1]
        self.total[index, :width], self.held[index, :width] = total[:, :width], held[:, :width]
        arriving = torch.as_tensor(lengths)  # each row's next free column
        self.keys[index, :, arriving], self.values[index, :, arriving] = key, value
        self.total[index, arriving], self.held[index, arriving] = total[:, width], held[:, width]
        self.positions[index, arriving] = torch.as_tensor(positions)
        self.length[slots] += 1
        for slot, position in zip(slots, positions):
            # a row holds every token that arrived up to its budget; the rest are evicted keys still here
            if self.length[slot] - min(position + 1, self.budget) > self.slack:
                self._compact(slot)
        return out[:, 0], state.kv_reads[self.layer_idx][:, 0]

    def _compact(self, slot: int) -> None:
        """Drop the evicted keys of row ``slot``, keeping the rest in arrival order."""
        keep = self.held[slot, : self.length[slot]].nonzero()[:, 0]
        m = len(keep)
        self.keys[slot, :, :m], self.values[slot, :, :m] = (
            self.keys[slot, :, keep],
            self.values[slot, :, keep],
        )
        self.total[slot, :m], self.positions[slot, :m] = self.total[slot, keep], self.positions[slot, keep]
        self.held[slot] = False
        self.held[slot, :m] = True
        self.length[slot] = m

    def _grow(self, slots: int, like: torch.Tensor) -> None:
        """At least ``slots`` rows (doubling), with the layout of ``like`` ``[1, kv_heads, m, d]``."""
        have = len(self.length)
        if slots <= have:
            return
        rows = max(slots, 2 * have, 4)
        kv_heads, d = like.shape[1], like.shape[3]
        fresh = {
            "keys": like.new_zeros(rows, kv_heads, self.width, d),
            "values": like.new_zeros(rows, kv_heads, self.width, d),
            "total": torch.zeros(rows, self.width, dtype=torch.float32, device=like.device),
            "held": torch.zeros(rows, self.width, dtype=torch.bool, device=like.device),
            "positions": torch.zeros(rows, self.width, dtype=torch.long, device=like.device),
        }
        for name, tensor in fresh.items():
            if have:
                tensor[:have] = getattr(self, name)
            setattr(self, name, tensor)
        self.length = np.concatenate([self.length, np.zeros(rows - have, dtype=np.int64)])

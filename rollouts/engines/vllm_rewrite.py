"""One decode step's attention-metadata rewrite: the same batch, shorter block tables for the masked rows.

Stock paged-attention kernels read KV through a per-request block table and a sequence length. For each
masked DA decode row, :meth:`AttentionRewrite.apply` hands every backend's ``build()`` a *copy* of vLLM's
``CommonAttentionMetadata`` whose table lists only the blocks the row may see (tail block last) and whose
``seq_lens`` / ``seq_lens_cpu_upper_bound`` are the matching shortened length; ``max_seq_len`` follows, and
the cached ``num_computed_tokens`` is reset so it is derived from the new lengths.

Everything else is left alone: ``slot_mapping`` still points into the real table, so the new token's KV
goes to its real slot; positions are absolute, so RoPE is right (keys were rotated when written). The
persistent block table is never edited: on CPU the "device" table *is* that buffer.

The rows, their visible blocks and lengths come from the worker's plan
(:meth:`~rollouts.engines.vllm_da_worker.DAWorkerState.plan_step`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch


@dataclass
class AttentionRewrite:
    """One step's attention rewrite for the masked rows of the batch."""

    rows: list[int]  # batch rows of masked decode requests
    blocks: list[np.ndarray]  # per row: visible logical block indices, tail last
    kv_tokens: list[int]  # per row: the shortened seq_len
    block_table: np.ndarray  # [max_reqs, max_blocks] int32: the persistent table's host copy
    num_reqs: int  # real (unpadded) rows in the batch
    _last: tuple | None = None

    def apply(self, cm):
        """A copy of ``cm`` (CommonAttentionMetadata) that reads only the visible blocks."""
        if self._last is not None and self._last[0] is cm:
            return self._last[1]  # several attention groups share one metadata object
        table = cm.block_table_tensor
        device = table.device
        rows_np = np.asarray(self.rows, dtype=np.int64)
        host_rows = self.block_table[rows_np, : table.shape[1]].copy()
        for r, visible in enumerate(self.blocks):
            host_rows[r, : len(visible)] = self.block_table[self.rows[r], visible]
        rows = torch.from_numpy(rows_np).to(device)
        kv = torch.tensor(self.kv_tokens, dtype=cm.seq_lens.dtype)

        table = table.clone()
        table[rows] = torch.from_numpy(host_rows).to(device, dtype=table.dtype)
        seq_lens = cm.seq_lens.clone()
        seq_lens[rows] = kv.to(device)
        upper = cm.seq_lens_cpu_upper_bound
        max_seq_len = cm.max_seq_len
        if upper is not None:
            upper = upper.clone()
            upper[torch.from_numpy(rows_np)] = kv.to(upper.dtype)
            max_seq_len = int(upper[: self.num_reqs].max())
        new = replace(
            cm,
            block_table_tensor=table,
            seq_lens=seq_lens,
            seq_lens_cpu_upper_bound=upper,
            max_seq_len=max_seq_len,
            _num_computed_tokens_cache=None,
        )
        self._last = (cm, new)
        return new

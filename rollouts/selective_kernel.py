"""Selective Attention as a fused Triton forward: ``softmax(Q K^T * scale - F) V`` without materialising ``F``.

The dense path (:mod:`rollouts.selective_attention`) builds head 0's ``S`` and ``F`` as ``[b, n, n]`` per
layer and hands ``-F`` to SDPA as a bias. Here ``F`` exists only tile by tile, in two passes over the query
blocks ``I`` (``BLOCK_M`` rows each) of a sequence:

1. **Column sums.** For every query block, the column sums of ``S`` over its rows: ``P`` ``[b, nI, n]``.
   Their exclusive prefix over blocks, ``C[I] = sum_{J < I} P[J]``, is ``F`` at the first row of block
   ``I``, because ``F[i, k] = sum_{j < i} S[j, k]`` (:func:`rollouts.selective.accumulated_mask`).
2. **Attention.** Flash attention's online softmax over key blocks, one program per (query block, head).
   Each key tile recomputes head 0's ``S`` tile and completes ``F`` inside the block::

       F[i, k] = C[I, k] + sum_{j in I, j < i} S[j, k]          (an exclusive cumsum down the tile)

``S`` follows :func:`rollouts.selective.selection_matrix`: ReLU of head 0's logits where the query sees the
key (causal, and the attention mask when given), zero on the diagonal and in each row's <BOS> column (its
first visible key). The running total ``sum_j S[j, k]`` over every row -- the accumulator a decoding loop
continues from -- falls out of pass 1.

Memory per call: ``P`` and ``C``, ``[b, n / BLOCK_M, n]`` float32 (``n / 64`` floats per key instead of
``n``), the output and the ``[b, n]`` total; no ``[b, h, n, n]`` logits and no ``[b, n, n]`` ``F``. An
attention mask other than causal comes in as a ``[b, n, n]`` bool (one byte per entry, shared by every
layer). Cost: every head's program recomputes head 0's logits, so pass 2 does twice the ``Q K^T`` work of
flash attention, and pass 1 once more for head 0 (``(2h + 1) / h`` in all).

This is the forward only. :class:`rollouts.selective_attention.FusedSelectiveAttention` gives it a backward
that recomputes the layer densely (a transient ``[b, n, n]`` for one layer at a time, instead of ``S`` kept
for every layer); a fused backward is the next step. It runs on CUDA, and on CPU only in Triton's
interpreter (``TRITON_INTERPRET=1`` before Triton is first imported), which is how the tests check it
against the dense path -- in fp32 only: the interpreter's ``tl.dot`` on bf16 tiles is wrong, so bf16 is
first checked on a GPU (``bench/selective_kernel.py`` prints the max difference to the dense path).
"""

from __future__ import annotations

import torch

from .selective import _shifted_cumsum

try:
    import triton
    import triton.language as tl
except ImportError:  # a platform without Triton: the dense path only
    triton = None

MIN_BLOCK = 16  # tl.dot's smallest tile


def runs_on(tensor: torch.Tensor) -> bool:
    """Whether the kernels can take ``tensor``: on CUDA, or anywhere under Triton's interpreter."""
    if triton is None:
        return False
    return tensor.is_cuda or bool(triton.knobs.runtime.interpret)


if triton is not None:

    @triton.jit
    def _visible_tile(VIS, vis_b, vis_q, b, rows, cols, N, HAS_MASK: tl.constexpr):
        """``[BLOCK_M, BLOCK_N]`` bool: causal, in bounds, and the attention mask when there is one."""
        vis = (cols[None, :] <= rows[:, None]) & (rows[:, None] < N) & (cols[None, :] < N)
        if HAS_MASK:
            allowed = tl.load(VIS + b * vis_b + rows[:, None] * vis_q + cols[None, :], mask=vis, other=0)
            vis = vis & (allowed != 0)
        return vis

    @triton.jit
    def _selection_tile(q0, k0, vis, rows, cols, bos, scale, IEEE: tl.constexpr):
        """Head 0's ``S`` tile ``[BLOCK_M, BLOCK_N]`` (float32) from its query and key tiles."""
        if IEEE:
            logits = tl.dot(q0, tl.trans(k0), input_precision="ieee") * scale
        else:
            logits = tl.dot(q0, tl.trans(k0)) * scale
        select = vis & (cols[None, :] != bos[:, None]) & (cols[None, :] != rows[:, None])
        return tl.where(select, tl.maximum(logits, 0.0), 0.0)

    @triton.jit
    def _column_sums_kernel(
        Q, K, VIS, BOS, P, scale,
        q_b, q_n, k_b, k_n, vis_b, vis_q, p_b, p_i,
        N, D,
        HAS_MASK: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        """Pass 1, one program per (query block, batch row): ``P[b, I, k] = sum_{i in I} S[i, k]``."""
        block = tl.program_id(0)
        b = tl.program_id(1)
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        q0 = tl.load(
            Q + b * q_b + rows[:, None] * q_n + dims[None, :],
            mask=(rows[:, None] < N) & (dims[None, :] < D),
            other=0.0,
        )
        bos = tl.load(BOS + b * N + rows, mask=rows < N, other=0)
        for start in range(0, (block + 1) * BLOCK_M, BLOCK_N):  # keys after the block's last row: S = 0
            cols = start + tl.arange(0, BLOCK_N)
            k0 = tl.load(
                K + b * k_b + cols[:, None] * k_n + dims[None, :],
                mask=(cols[:, None] < N) & (dims[None, :] < D),
                other=0.0,
            )
            vis = _visible_tile(VIS, vis_b, vis_q, b, rows, cols, N, HAS_MASK)
            s = _selection_tile(q0, k0, vis, rows, cols, bos, scale, IEEE)
            tl.store(P + b * p_b + block * p_i + cols, tl.sum(s, 0), mask=cols < N)

    @triton.jit
    def _attention_kernel(
        Q, K, V, VIS, BOS, C, OUT, MEM, scale, tau,
        q_b, q_h, q_n, k_b, k_h, k_n, v_b, v_h, v_n, vis_b, vis_q, c_b, c_i, o_b, o_n, o_h,
        N, D, H, GROUPS,
        HAS_MASK: tl.constexpr, HAS_TAU: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        """Pass 2, one program per (query block, batch row x head): online softmax of ``logits - F``; head 0's
        programs also write L_mem's effective memory ``M`` per query (``HAS_TAU``)."""
        block = tl.program_id(0)
        b = tl.program_id(1) // H
        h = tl.program_id(1) % H
        kv_head = h // GROUPS  # GQA: query head h reads KV head h // GROUPS; head 0 reads KV head 0
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        q_mask = (rows[:, None] < N) & (dims[None, :] < D)
        q_rows = Q + b * q_b + rows[:, None] * q_n + dims[None, :]
        q0 = tl.load(q_rows, mask=q_mask, other=0.0)
        qh = tl.load(q_rows + h * q_h, mask=q_mask, other=0.0)
        bos = tl.load(BOS + b * N + rows, mask=rows < N, other=0)

        top = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # running row max
        total = tl.zeros([BLOCK_M], dtype=tl.float32)  # running softmax denominator
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        memory = tl.zeros([BLOCK_M], dtype=tl.float32)  # M: keys seen minus keys masked (min(F, tau) / tau)
        for start in range(0, (block + 1) * BLOCK_M, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            kv_mask = (cols[:, None] < N) & (dims[None, :] < D)
            k_cols = K + b * k_b + cols[:, None] * k_n + dims[None, :]
            k0 = tl.load(k_cols, mask=kv_mask, other=0.0)
            kh = tl.load(k_cols + kv_head * k_h, mask=kv_mask, other=0.0)
            vh = tl.load(
                V + b * v_b + kv_head * v_h + cols[:, None] * v_n + dims[None, :], mask=kv_mask, other=0.0
            )
            vis = _visible_tile(VIS, vis_b, vis_q, b, rows, cols, N, HAS_MASK)
            s = _selection_tile(q0, k0, vis, rows, cols, bos, scale, IEEE)
            prior = tl.load(C + b * c_b + block * c_i + cols, mask=cols < N, other=0.0)
            # F of this tile: the earlier blocks' column sums plus this block's earlier rows
            f = prior[None, :] + tl.cumsum(s, 0) - s
            if HAS_TAU:
                memory += tl.sum(tl.where(vis, 1.0 - tl.minimum(f, tau) / tau, 0.0), 1)
            if IEEE:
                logits = tl.dot(qh, tl.trans(kh), input_precision="ieee") * scale - f
            else:
                logits = tl.dot(qh, tl.trans(kh)) * scale - f
            logits = tl.where(vis, logits, -1.0e30)
            new_top = tl.maximum(top, tl.max(logits, 1))
            p = tl.where(vis, tl.exp(logits - new_top[:, None]), 0.0)
            rescale = tl.exp(top - new_top)
            total = total * rescale + tl.sum(p, 1)
            if IEEE:
                acc = acc * rescale[:, None] + tl.dot(p.to(vh.dtype), vh, input_precision="ieee")
            else:
                acc = acc * rescale[:, None] + tl.dot(p.to(vh.dtype), vh)
            top = new_top
        out = acc / tl.where(total > 0, total, 1.0)[:, None]  # a row that sees no key (padding) gives 0
        if HAS_TAU and h == 0:
            tl.store(MEM + b * N + rows, memory, mask=rows < N)
        tl.store(
            OUT + b * o_b + rows[:, None] * o_n + h * o_h + dims[None, :],
            out.to(OUT.dtype.element_ty),
            mask=q_mask,
        )


def fused_selective_attention(
    query: torch.Tensor,  # [b, h, n, d]
    key: torch.Tensor,  # [b, kv_heads, n, d]
    value: torch.Tensor,  # [b, kv_heads, n, d]
    visible: torch.Tensor | None,  # [b|1, n, n] bool attention mask (causality is added), or None: causal
    scaling: float,
    tau: float | None = None,
    block_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(out [b, n, h, d], total [b, n], memory [b, n] or None)``: Selective Attention over one prefill.

    ``total[b, k]`` is ``sum_i S[i, k]`` over every query, the running sum a decoding loop continues from
    (:class:`rollouts.selective.MaskAccumulator`'s ``total``). With ``tau``, ``memory`` is L_mem's
    effective memory per query, :func:`rollouts.selective.effective_memory` of ``F``. Queries and keys
    are the same ``n`` positions (a forward without a KV cache). A query row that sees no key returns zeros.
    """
    if triton is None:
        raise RuntimeError("the fused Selective Attention kernel needs Triton (pip install triton)")
    b, h, n, d = query.shape
    kv_heads = key.shape[1]
    if key.shape != (b, kv_heads, n, d) or value.shape != key.shape or h % kv_heads:
        raise ValueError(
            f"fused Selective Attention takes query [b, h, n, d] and key/value [b, h_kv, n, d] over the same "
            f"n positions with h % h_kv == 0; got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    block = max(MIN_BLOCK, min(block_size, triton.next_power_of_2(n)))
    blocks = triton.cdiv(n, block)
    has_mask = visible is not None
    if has_mask:
        visible = visible.to(device=query.device, dtype=torch.bool).expand(b, n, n).contiguous()
        # <BOS> of a row: its first visible key, causal included (0 for a row that sees nothing)
        bos = (visible & torch.ones(n, n, dtype=torch.bool, device=query.device).tril()).int().argmax(-1)
        mask_arg, vis_strides = visible.view(torch.uint8), visible.stride()[:2]
    else:
        bos = torch.zeros(b, n, dtype=torch.int32, device=query.device)
        mask_arg, vis_strides = bos, (0, 0)  # never read
    bos = bos.to(torch.int32).contiguous()
    ieee = query.dtype == torch.float32  # fp32 in, fp32 products (no TF32), as the dense path computes head 0
    if tau is not None and tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    common = dict(
        HAS_MASK=has_mask, IEEE=ieee, BLOCK_M=block, BLOCK_N=block, BLOCK_D=triton.next_power_of_2(d)
    )

    sums = torch.zeros(b, blocks, n, dtype=torch.float32, device=query.device)  # P: [b, nI, n]
    _column_sums_kernel[(blocks, b)](
        query, key, mask_arg, bos, sums, scaling,
        query.stride(0), query.stride(2), key.stride(0), key.stride(2), *vis_strides,
        sums.stride(0), sums.stride(1),
        n, d, **common,
    )  # fmt: skip
    prior = _shifted_cumsum(sums).contiguous()  # C: [b, nI, n], F at the first row of each block

    out = torch.empty(b, n, h, d, dtype=query.dtype, device=query.device)
    memory = torch.empty(b, n, dtype=torch.float32, device=query.device) if tau is not None else None
    _attention_kernel[(blocks, b * h)](
        query, key, value, mask_arg, bos, prior, out, out if memory is None else memory, scaling,
        1.0 if tau is None else float(tau),
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *vis_strides,
        prior.stride(0), prior.stride(1), out.stride(0), out.stride(1), out.stride(2),
        n, d, h, h // kv_heads, HAS_TAU=tau is not None, **common,
    )  # fmt: skip
    return out, sums.sum(1), memory

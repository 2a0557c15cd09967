"""The GRPO trainer's step with group-shared prompts vs one row per completion, on the same batch.

Each case builds one GRPO step's batch the way the trainer sees it: ``--prompts`` prompts from the data
generator, ``G`` completions each (the prompt's gold DA trace, then random tokens, so every completion
switches modes; lengths spread around ``C``), packed as TRL does (``[B, P + C]``, prompts left-padded,
completions right-padded), with each completion's :class:`~rollouts.masks.CompletionTrace`. Both paths
compute the same log-probs (tests/rl/test_shared_prompt.py); here they are timed:

- ``step``: forward with grad + TRL's clipped token-level GRPO loss (DAPO normalization) + backward, the
  micro-batch being the whole step (the default's ``gradient_accumulation_steps: 1``);
- ``no-grad``: the old-policy forward (TRL runs it on every generation batch for the importance-sampling
  correction; a reference model, ``beta > 0``, would add one more);
- ``tokens/s``: completion tokens (what the loss trains) per second of ``step``; ``fwd tokens``: the positions
  the model runs (padding included), the work sharing removes;
- ``peak MiB``: peak resident memory one step adds, each (case, path) in a fresh process (``--child``), so
  neither path inherits the other's freed pages.

Median of ``--reps`` after a warm-up, the two paths interleaved rep by rep, so a loaded machine slows both
alike. Cases: ``default`` (configs/tiny.yaml's model, tokenizer and data: prompts ~300-330 tokens,
completions ~16, G = 8, 4 prompts); ``pc10`` and ``pc40``: P/C = 10 and 40 at C = 32, G = 8, on a larger
tiny model (hidden 256, 4 layers, 4/2 heads of 64, intermediate 1024); ``selective``: a policy like
configs/tiny-selective.yaml's (the default's model with Selective Attention, KV budgets 256/192/128/192 replayed by the forward,
L_mem at eps 0.1 in the loss) on its data (prompts 300-330 tokens, completions ~32), with a third row: the DA
model (the same weights without Selective Attention) on the same batch, shared, the step Selective
Attention is compared with. Left out: the optimizer step, rollouts, and GPU timings (``bench/gpu_check.py``).

    nice -n 10 .venv/bin/python -m bench.trainer [--cases default pc10 pc40] [--reps 3] [--prompts 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

LARGER = dict(
    hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    intermediate_size=1024,
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    model: dict | None  # TinyModelConfig fields; None: configs/tiny.yaml's
    data: dict | None  # data config overrides; None: configs/tiny.yaml's data.build
    completion_tokens: int  # C: completion lengths spread over [C - 6, C + 6]
    budgets: tuple[int, ...] | None = None  # a Selective Attention policy under these KV budgets


CASES = {
    "default": Case("default", None, None, 16),
    "pc10": Case("pc10", LARGER, {"chunk_tokens": 27, "lengths": [140]}, 32),
    "pc40": Case("pc40", LARGER, {"chunk_tokens": 59, "lengths": [975]}, 32),
    "selective": Case(
        "selective", None, {"chunk_tokens": 27, "lengths": [130, 160]}, 32, (256, 192, 128, 192)
    ),
}
PATHS = ("per-completion", "shared")
DA_SHARED = "DA shared"  # the selective case's reference row
MEMORY_EPS, MEMORY_TAU = 0.1, 1.0  # configs/tiny-selective.yaml's grpo_memory_eps and memory_tau


def paths(case: Case) -> tuple[str, ...]:
    return PATHS + ((DA_SHARED,) if case.budgets else ())


def policy(case: Case, model, path: str):
    """The model ``path`` trains: the case's policy, or the plain DA model for :data:`DA_SHARED`."""
    return model if case.budgets is None or path == DA_SHARED else selective_policy(model, case.budgets)


def build(case: Case, prompts: int, generations: int, seed: int = 0):
    """``(model, input_ids [B, P + C], traces, C)`` for one GRPO step of ``case`` (the plain DA model:
    :func:`policy` makes the case's policy of it)."""
    import numpy as np

    from data.build import generate
    from data.config import parse_config
    from data.prompts import layout_example
    from rl.config import load_run_config
    from rl.model import TinyModelConfig, build_tiny_model
    from rl.run_inputs import local_tokenizer
    from rollouts.masks import trace_completion
    from rollouts.protocol import token_bytes_table

    cfg = load_run_config(None)
    tokenizer = local_tokenizer(cfg)
    table = token_bytes_table(tokenizer)
    data = dict(cfg.data.build) | (case.data or {}) | {"splits": {"train": prompts}, "ood_examples": 0}
    data["tasks"] = [data["tasks"][0]]  # one task: every prompt at the case's length(s)
    rows = [r.to_row() for r in generate(parse_config(data), tokenizer)["train"]][:prompts]
    model_config = cfg.model.tiny if case.model is None else TinyModelConfig(**case.model)
    torch.manual_seed(seed)
    model = build_tiny_model(tokenizer, model_config).train()
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    ordinary = np.array([i for i in range(len(tokenizer)) if i not in special])
    traces, completions = [], []
    for row in rows:
        layout = layout_example(row, tokenizer, cfg.run.prompt_layout())
        gold = tokenizer(row["gold_completion"], add_special_tokens=False)["input_ids"]
        for _ in range(generations):
            n = int(rng.integers(case.completion_tokens - 6, case.completion_tokens + 7))
            ids = (gold + rng.choice(ordinary, max(0, n - len(gold))).tolist())[:n]
            traces.append(trace_completion(layout, ids, table))
            completions.append(ids)
    order = rng.permutation(len(traces))  # TRL shuffles the generation batch
    traces, completions = [traces[i] for i in order], [completions[i] for i in order]
    width = max(t.layout.prompt_len for t in traces)
    c_width = max(map(len, completions))
    input_ids = torch.full((len(traces), width + c_width), tokenizer.pad_token_id)
    for b, (trace, ids) in enumerate(zip(traces, completions)):
        input_ids[b, width - trace.layout.prompt_len : width] = torch.tensor(trace.layout.input_ids)
        input_ids[b, width : width + len(ids)] = torch.tensor(ids)
    return model, input_ids, traces, c_width


def selective_policy(model, budgets):
    """The same weights as a Selective Attention model carrying ``budgets`` (as configs/tiny-selective.yaml
    builds its policy, with budgets given)."""
    import copy

    from transformers import Qwen3ForCausalLM

    from rollouts.selective.attention import enable_selective_attention, register_selective_attention
    from rollouts.selective.eviction import save_budgets

    register_selective_attention("dense")
    config = enable_selective_attention(copy.deepcopy(model.config))
    save_budgets(config, budgets)
    policy = Qwen3ForCausalLM(config)
    policy.load_state_dict(model.state_dict())
    return policy.train()


def padding_mask(input_ids, traces, c_width):
    """TRL's ``[B, P + C]`` attention mask: each row's prompt and completion."""
    width = input_ids.size(1) - c_width
    mask = torch.zeros(input_ids.shape, dtype=torch.bool)
    for b, trace in enumerate(traces):
        mask[b, width - trace.layout.prompt_len : width + len(trace.row_state)] = True
    return mask


def logps(model, path: str, input_ids, traces, c_width):
    """``(log-probs [B, C], L_mem or None)``, as the trainer's forward computes them (rl/grpo.py)."""
    from rl.logprobs import masked_completion_logps, shared_completion_logps
    from rl.selective.losses import recorded_memory_loss
    from rollouts.selective.attention import AttentionState
    from rollouts.selective.eviction import load_budgets

    forward = masked_completion_logps if path == "per-completion" else shared_completion_logps
    if not getattr(model.config, "selective_attention", False):
        return forward(model, input_ids, traces, c_width)[0], None
    padding = padding_mask(input_ids, traces, c_width)
    state = AttentionState(budgets=load_budgets(model.config), padding_mask=padding, tau=MEMORY_TAU)
    new = forward(model, input_ids, traces, c_width, attn_implementation="heed_selective", heed_state=state)[
        0
    ]
    return new, recorded_memory_loss(state, padding.sum(-1), MEMORY_EPS)


def step(model, path: str, input_ids, traces, c_width, advantages, real) -> None:
    """Forward with grad, TRL's clipped token-level GRPO loss over the step's tokens (plus L_mem for a
    Selective Attention policy), backward."""
    model.zero_grad(set_to_none=True)
    new, memory = logps(model, path, input_ids, traces, c_width)
    ratio = torch.exp(new - new.detach())  # one optimizer pass per generation batch: old = new
    a = advantages[:, None]
    per_token = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a)
    loss = (per_token * real).sum() / real.sum()
    (loss if memory is None else loss + memory).backward()


def forward_tokens(path: str, input_ids, traces, c_width) -> int:
    from rl.logprobs import share_prompts

    if path != "per-completion":
        return share_prompts(input_ids, traces, c_width).input_ids.numel()
    return input_ids.numel()


def measure(case: Case, args) -> dict:
    model, input_ids, traces, c_width = build(case, args.prompts, args.generations)
    models = {path: policy(case, model, path) for path in paths(case)}
    lengths = torch.tensor([len(t.row_state) for t in traces])
    real = torch.arange(c_width)[None, :] < lengths[:, None]
    advantages = torch.randn(len(traces), generator=torch.Generator().manual_seed(0))
    times = {p: {"step": [], "nograd": []} for p in paths(case)}
    for rep in range(args.reps + 1):  # rep 0 warms up
        for path in paths(case):
            start = time.perf_counter()
            step(models[path], path, input_ids, traces, c_width, advantages, real)
            mid = time.perf_counter()
            with torch.no_grad():
                logps(models[path], path, input_ids, traces, c_width)
            end = time.perf_counter()
            if rep:
                times[path]["step"].append(mid - start)
                times[path]["nograd"].append(end - mid)
    prompt = statistics.mean(t.layout.prompt_len for t in traces)
    out = {
        "case": case.name,
        "prompt_tokens": prompt,
        "completion_tokens": lengths.float().mean().item(),
        "completions": len(traces),
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }
    for path in paths(case):
        s = statistics.median(times[path]["step"])
        out[path] = {
            "step_s": s,
            "nograd_s": statistics.median(times[path]["nograd"]),
            "tokens_per_s": int(real.sum()) / s,
            "fwd_tokens": forward_tokens(path, input_ids, traces, c_width),
        }
    return out


def child_peak(case: Case, path: str, args) -> int:
    """Peak RSS one step of ``path`` adds, measured in a fresh process."""
    cmd = [sys.executable, "-m", "bench.trainer", "--child", case.name, path, "--prompts", str(args.prompts)]
    cmd += ["--generations", str(args.generations)] + (
        ["--threads", str(args.threads)] if args.threads else []
    )
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def run_child(case: Case, path: str, args) -> None:
    from bench.protocol import PeakRSS

    model, input_ids, traces, c_width = build(case, args.prompts, args.generations)
    model = policy(case, model, path)
    real = torch.arange(c_width)[None, :] < torch.tensor([len(t.row_state) for t in traces])[:, None]
    advantages = torch.randn(len(traces), generator=torch.Generator().manual_seed(0))
    step(model, path, input_ids, traces, c_width, advantages, real)  # first-call allocations
    model.zero_grad(set_to_none=True)
    with PeakRSS() as mem:
        step(model, path, input_ids, traces, c_width, advantages, real)
    print(mem.added)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    # On a shared machine, 1 thread: a descheduled OpenMP thread stalls every op at its barrier, a fixed cost
    # per op that hides the work sharing removes
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        run_child(CASES[args.child[0]], args.child[1], args)
        return
    print(
        f"{datetime.date.today()}  {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, sdpa (dense bool mask)"
    )
    print(f"{args.prompts} prompts x G = {args.generations}, median of {args.reps} reps after a warm-up")
    head = "{:<9} {:>6} {:>5} {:>6} {:<15} {:>10} {:>8} {:>10} {:>9} {:>9}"
    print(head.format("case", "params", "P", "C", "path", "fwd tokens", "step s", "tokens/s", "no-grad s",
                      "peak MiB"))  # fmt: skip
    for name in args.cases:
        case = CASES[name]
        r = measure(case, args)
        peaks = {path: child_peak(case, path, args) / 2**20 for path in paths(case)}
        for path in paths(case):
            m = r[path]
            print(
                head.format(
                    name, f"{r['params_m']:.1f}M", f"{r['prompt_tokens']:.0f}", f"{r['completion_tokens']:.1f}",
                    path, f"{m['fwd_tokens']:,}", f"{m['step_s']:.3f}", f"{m['tokens_per_s']:,.0f}",
                    f"{m['nograd_s']:.3f}", f"{peaks[path]:.0f}",
                )
            )  # fmt: skip
        per, shared = r["per-completion"], r["shared"]
        print(
            f"{'':<9} P/C = {r['prompt_tokens'] / r['completion_tokens']:.1f}: shared is "
            f"{per['step_s'] / shared['step_s']:.2f}x faster per step, {per['nograd_s'] / shared['nograd_s']:.2f}x "
            f"per no-grad forward, {per['fwd_tokens'] / shared['fwd_tokens']:.2f}x fewer forward tokens, "
            f"{peaks['per-completion'] / max(peaks['shared'], 1e-9):.2f}x less peak memory"
        )
        if case.budgets:
            da = r[DA_SHARED]
            print(
                f"{'':<9} Selective Attention, shared: {shared['step_s'] / da['step_s']:.2f}x the DA step "
                f"(one row per completion: {per['step_s'] / da['step_s']:.2f}x)"
            )
        print("RESULT " + json.dumps(r | {"peak_mib": peaks}), file=sys.stderr)


if __name__ == "__main__":
    main()

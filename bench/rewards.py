"""Reward benchmark: how many completions per second the composite reward scores on one core.

The reward runs once per completion per GRPO step, next to generation that takes milliseconds per
token; it has to be negligible (target: > 5,000 rewards/s on one core). Measured on ``--n``
trajectories (default 10,000) built on real DA layouts (``rollouts.protocol.build_prompt`` with the
byte-level BPE tokenizer from ``data.tokenizer``; 8, 16 and 32 magic chunks of about 250 tokens):

1. ``score_trajectories`` in ``tokens`` and in roofline ``time`` units (a Qwen3-8B-like decode cost);
2. ``DAReward.score``, the TRL entry point, on the completion texts with per-step ``kv_tokens`` /
   ``kv_tokens_vanilla`` columns: it parses every completion with ``rollouts.protocol.parse_completion``;
3. the ``math`` metric alone (``math-verify``, sympy), on ``--math-n`` distinct answers.

Completions: a protocol-correct trace and reward-hacking variants (``<local>`` guesses, repeated and
hedged answers, a missing answer tag, violations), spread evenly over the graders ``string_match_all``, ``string_match_part``,
``exact``, ``f1`` and ``numeric``. Every trajectory has its own answer text and references, and the
grader cache is cleared before each timed pass, so no grade is served from cache. Traces (the per-step
KV accounting) are computed once per (layout, template) and shared: scoring only reads them. Building
the trajectories is not timed. One ``time.perf_counter`` span around each whole pass, best of
``--repeats``. The process is pinned to one CPU and numpy to one thread.

Run::

    .venv/bin/python -m bench.rewards            # the recorded run (about 30 s on 2 cores)
    .venv/bin/python -m bench.rewards --n 2000   # quick
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import platform
import random
import time
from collections import Counter

from data.tokenizer import build_tokenizer, word_list
from rewards import DAReward, DecodeCost, RewardConfig, score_trajectories
from rewards.accuracy import _grade, _parse_math, math_match
from rl.environment import this_cpu
from rollouts.masks import KVShape, trace_completion
from rollouts.protocol import build_prompt, parse_completion, token_bytes_table
from rollouts.trajectory import Trajectory

METRICS = ("string_match_all", "string_match_part", "exact", "f1", "numeric")
# A Qwen3-8B-like decode cost: 36 layers, 8 KV heads of 128, 32 query heads, 8B matmul parameters.
COST = DecodeCost(
    KVShape(num_layers=36, num_kv_heads=8, head_dim=128), query_heads=32, matmul_params=8 * 10**9
)

# (name, completion template); {a} is the answer, {f} a chunk holding evidence, {g} another one,
# {r} about 120 words of reasoning (fixed per run).
TEMPLATES = [
    (
        "protocol-correct",
        "<global>The value should be in Magic Chunk {f}; I will read it there. {r}</global>\n"
        '<focus magic_chunks="{f}">The record in this chunk gives the value {a} for the question. {r}</focus>\n'
        "<local>So the answer is {a}. {r}</local>\n<answer>{a}</answer>",
    ),
    ("local guess", "<local>I cannot see the chunks, so I guess. {r}</local><answer>{a}</answer>"),
    (
        "answer repeated",
        '<focus magic_chunks="{f}">The value is {a}.</focus><answer>{a}</answer><answer>{a}</answer>',
    ),
    (
        "focus everywhere",
        '<focus magic_chunks="{f},{g}">The value is {a} here and maybe there.</focus>'
        "<answer>{a} or perhaps something else entirely, I am not sure</answer>",
    ),
    ("no answer tag", '<focus magic_chunks="{f}">The value is {a}.</focus> The answer is {a}.'),
    (
        "violations",
        '<global><focus magic_chunks="99">The value is {a}.</focus><answer><local>{a}</local></answer> done',
    ),
]


def layouts(tokenizer, rng: random.Random):
    words = word_list()
    out = []
    for num_chunks in (8, 16, 32):
        docs = [" ".join(rng.choice(words) for _ in range(200)) + "." for _ in range(num_chunks)]
        out.append(build_prompt("What is the value in the record?", docs, tokenizer, chunk_tokens=4096))
    return out


def answer_and_refs(metric: str, k: int) -> tuple[str, list[str]]:
    """A distinct answer for trajectory ``k`` and references it satisfies (most of the time)."""
    value = f"{k * 7919 % 1_000_003}"
    if metric == "string_match_all":
        return f"{value}, {k}", [value, str(k)]
    if metric == "string_match_part":
        return f"the value {value}", [value, f"alt-{k}"]
    if metric == "exact":
        return f"The record {value}.", [f"record {value}"]
    if metric == "f1":
        return f"record number {value} of the ledger", [f"record {value} ledger"]
    return f"{value} units", [value]


def build_trajectories(n: int, tokenizer, table, rng: random.Random) -> list[Trajectory]:
    reasoning = " ".join(rng.choice(word_list()) for _ in range(120))
    traces = {}
    all_layouts = layouts(tokenizer, rng)
    trajectories = []
    for k in range(n):
        layout = all_layouts[k % len(all_layouts)]
        t = k // len(all_layouts) % len(TEMPLATES)
        metric = METRICS[k % len(METRICS)]
        answer, refs = answer_and_refs(metric, k)
        f, g = (k % layout.num_chunks) + 1, ((k + 3) % layout.num_chunks) + 1
        text = TEMPLATES[t][1].format(a=answer, f=f, g=g, r=reasoning)
        key = (id(layout), t)
        if key not in traces:  # the accounting depends on the template, not on the answer digits
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            traces[key] = (ids, trace_completion(layout, ids, table))
        ids, trace = traces[key]
        example = {
            "id": f"bench-{k}",
            "answers": refs,
            "metric": metric,
            "evidence_chunks": [f],
            "num_chunks": layout.num_chunks,
        }
        parsed = parse_completion(text, layout.num_chunks)
        trajectories.append(Trajectory(example, layout, ids, text, parsed, trace))
    return trajectories


def reasons_of(trajectory: Trajectory) -> set[str]:
    """Answer-count violations, which zero accuracy before any grader runs."""
    return {v.kind for v in trajectory.parsed.violations} & {"multiple_answers", "nested_answer"}


def best_of(repeats: int, run) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        _grade.cache_clear()
        _parse_math.cache_clear()
        t0 = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="trajectories to score")
    parser.add_argument("--math-n", type=int, default=300, help="completions graded with math-verify")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; the best is reported")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    rng = random.Random(args.seed)
    tokenizer = build_tokenizer()
    table = token_bytes_table(tokenizer)
    trajectories = build_trajectories(args.n, tokenizer, table, rng)
    steps = sum(len(t.completion_ids) for t in trajectories) / len(trajectories)
    prompt = sorted({t.layout.prompt_len for t in trajectories})

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"machine: {platform.machine()}, {this_cpu()}, {os.cpu_count()} cores (load average {load}), "
        f"pinned to 1 core, python {platform.python_version()}"
    )
    print(
        f"{args.n} trajectories: prompts {prompt} tokens, {steps:.0f} decoding steps on average, "
        f"{len(TEMPLATES)} completion templates x {len(METRICS)} graders"
    )
    rows = []

    seconds, batch = best_of(args.repeats, lambda: score_trajectories(trajectories))
    rows.append(("score_trajectories, tokens", args.n, seconds))
    reasons = batch.reasons
    seconds, _ = best_of(
        args.repeats, lambda: score_trajectories(trajectories, RewardConfig(efficiency_unit="time"), COST)
    )
    rows.append(("score_trajectories, roofline time", args.n, seconds))

    reward = DAReward()
    columns = {
        "answers": [t.example["answers"] for t in trajectories],
        "metric": [t.example["metric"] for t in trajectories],
        "evidence_chunks": [t.example["evidence_chunks"] for t in trajectories],
        "num_chunks": [t.layout.num_chunks for t in trajectories],
        # as a rollout function holds them (CompletionTrace arrays); Python lists cost ~70 ns per step more
        "kv_tokens": [t.trace.kv_tokens for t in trajectories],
        "kv_tokens_vanilla": [t.trace.kv_tokens_vanilla for t in trajectories],
    }
    texts = [t.completion_text for t in trajectories]
    seconds, trl_batch = best_of(args.repeats, lambda: reward.score([""] * len(texts), texts, **columns))
    rows.append(("DAReward.score (parses the text), tokens", args.n, seconds))
    assert trl_batch.totals == batch.totals, "the TRL path must agree with the trajectory path"

    # completions with one answer, so that every one of them reaches math-verify
    one_answer = [t for t in trajectories if t.parsed.answer is not None and not reasons_of(t)]
    math_trajectories = one_answer[: args.math_n]
    math_n = len(math_trajectories)
    for k, t in enumerate(math_trajectories):
        t.example = t.example | {"metric": "math", "answers": [f"\\frac{{{k + 1}}}{{{k + 2}}}"]}
        t.parsed.answer = f"{k + 1}/{k + 2}" if k % 2 else f"{k + 2}/{k + 1}"
    math_match("1", ["1"])  # import sympy and math-verify outside the timed pass
    seconds, math_batch = best_of(1, lambda: score_trajectories(math_trajectories))
    assert not math_batch.reasons["accuracy/grader_error"]
    rows.append(("score_trajectories, math metric only (math-verify)", math_n, seconds))

    print(f"\n{'':2}{'pass':52}{'rewards':>9}{'seconds':>10}{'rewards/s':>12}{'us/reward':>11}")
    for name, n, s in rows:
        print(f"  {name:52}{n:>9}{s:>10.3f}{n / s:>12,.0f}{s / n * 1e6:>11.1f}")
    per_second = min(n / s for name, n, s in rows if "math" not in name)
    print(
        f"\nslowest non-math pass: {per_second:,.0f} rewards/s (target > 5,000): "
        f"{'met' if per_second > 5000 else 'NOT met'}"
    )
    print(
        f"mean accuracy {sum(batch.column('accuracy')) / len(batch.items):.2f}, "
        f"mean total {sum(batch.totals) / len(batch.items):.2f}"
    )
    common = ", ".join(f"{r} {c}" for r, c in Counter(reasons).most_common(6))
    print(f"most common reasons over the batch: {common}")


if __name__ == "__main__":
    main()

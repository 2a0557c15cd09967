"""A real, tiny run directory without a trainer: scored gold and perturbed traces written over "steps".

This is *not* training. It exists so the dashboard, its tests and the screenshot in docs/dashboards.md have a run
directory made by the real pipeline pieces:

1. ``data`` generators build a small dataset (three tasks, two context lengths) with gold DA traces.
2. Each "step" draws a batch of examples and, for each, either the gold trace or one of four scripted
   perturbations: ``global_only`` (every DA tag turned into ``<global>``: no savings, no compliance),
   ``wrong_chunk`` (focus ids shifted: no evidence coverage), ``wrong_answer`` and ``broken_tags``
   (an out-of-range chunk id and an unclosed answer: violations). The share of gold traces rises
   from 20% to 90% over the steps, so rewards and the mode mix move the way a working run's would.
3. Every completion is laid out with ``rollouts.protocol.build_prompt``, traced with
   ``rollouts.masks.trace_completion`` (the shared visibility code), scored with
   ``rewards.score_trajectories`` and written through :class:`~rl.dashboard.run_dir.RunWriter`.
4. One eval file compares ``da`` (gold trace under the mask), ``da-nm`` (the same trace, full causal
   reads) and ``vanilla`` (the gold trace with its DA tags removed, full causal reads) on the dataset.

What it leaves out: importance ratios (there is no policy), and any model: every completion is scripted.
"""

from __future__ import annotations

import random
import re
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from data.build import generate
from data.config import DataConfig, TaskConfig
from data.tokenizer import build_tokenizer
from rewards import score_trajectories
from rewards.efficiency import DecodeCost
from rollouts.masks import KVShape, trace_completion
from rollouts.protocol import build_prompt, parse_completion, token_bytes_table
from rollouts.trajectory import Trajectory

from .records import length_bin, step_metrics, trajectory_record
from .run_dir import RunWriter

# a Qwen3-1.7B-like decoding cost: 28 layers, 8 KV heads of 128, 16 query heads, 1.4B matmul weights
DECODE_COST = DecodeCost(
    KVShape(num_layers=28, num_kv_heads=8, head_dim=128, dtype_bytes=2), 16, 1_400_000_000
)
PERTURBATIONS = ("global_only", "wrong_chunk", "wrong_answer", "broken_tags")
_FOCUS_TAG = re.compile(r'<focus magic_chunks="([^"]*)">')
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def perturb(gold: str, kind: str, num_chunks: int) -> str:
    """A scripted variant of a gold trace (see the module docstring)."""
    if kind == "gold":
        return gold
    if kind == "global_only":
        text = _FOCUS_TAG.sub("<global>", gold).replace("</focus>", "</global>")
        return text.replace("<local>", "<global>").replace("</local>", "</global>")
    if kind == "wrong_chunk":

        def shift(match: re.Match) -> str:
            ids = [int(c) % num_chunks + 1 for c in re.findall(r"\d+", match.group(1))]
            return f'<focus magic_chunks="{",".join(map(str, ids))}">'

        return _FOCUS_TAG.sub(shift, gold)
    if kind == "wrong_answer":
        return _ANSWER.sub("<answer>I could not find it</answer>", gold)
    if kind == "broken_tags":
        text = _FOCUS_TAG.sub(f'<focus magic_chunks="{num_chunks + 7}">', gold, count=1)
        return text.replace("</answer>", "")
    raise ValueError(f"unknown perturbation {kind!r}; expected 'gold' or one of {PERTURBATIONS}")


def without_da_tags(gold: str, num_chunks: int) -> str:
    """The same trace a model would write without the DA protocol: mode tags removed, answer kept."""
    return parse_completion(gold, num_chunks).without_mode_tags()


def write_sample_run(
    out: str | Path,
    steps: int = 8,
    batch_size: int = 12,
    lengths: tuple[int, ...] = (512, 2048),
    tasks: tuple[str, ...] = ("niah_single", "multi_span", "variable_tracking"),
    block_size: int = 32,
    seed: int = 0,
    rewrite: Callable[[str], str] | None = None,
) -> Path:
    """Write a sample run directory to ``out`` (which must not hold a run yet) and return it.

    ``rewrite`` changes every completion before it is parsed: a test's variant of the protocol, such as
    the tags of a mode it registered (rollouts/protocol/modes.py)."""
    out = Path(out)
    if (out / "metrics.jsonl").exists():
        raise FileExistsError(f"{out} already holds a run; choose an empty directory")
    tokenizer = build_tokenizer()
    table = token_bytes_table(tokenizer)
    config = DataConfig(
        tasks=[TaskConfig(t) for t in tasks],
        seed=seed,
        chunk_tokens=128,
        lengths=list(lengths),
        splits={"train": 4},
    )
    examples = [e.to_row() for e in generate(config, tokenizer)["train"]]
    layouts = [
        build_prompt(
            e["question"], e["documents"], tokenizer, block_size=block_size, chunk_tokens=e["chunk_tokens"]
        )
        for e in examples
    ]

    def rollout(i: int, text: str, mode: str = "da") -> Trajectory:
        layout = layouts[i]
        text = rewrite(text) if rewrite is not None else text
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        trace = trace_completion(layout, ids, table)
        trace.parsed.text = text
        return Trajectory(examples[i], layout, ids, text, trace.parsed, trace, mode=mode)

    def n_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    writer = RunWriter(out)
    rng = random.Random(f"sample-run/{seed}")
    for step in range(steps):
        started = time.perf_counter()
        gold_share = 0.2 + 0.7 * step / max(1, steps - 1)
        picks = [rng.randrange(len(examples)) for _ in range(batch_size)]
        kinds = ["gold" if rng.random() < gold_share else rng.choice(PERTURBATIONS) for _ in picks]
        batch = [
            rollout(i, perturb(examples[i]["gold_completion"], k, layouts[i].num_chunks))
            for i, k in zip(picks, kinds, strict=True)
        ]
        rewards = score_trajectories(batch).items
        vanilla_steps = [
            n_tokens(without_da_tags(examples[i]["gold_completion"], layouts[i].num_chunks)) for i in picks
        ]
        metrics = step_metrics(
            batch,
            rewards,
            DECODE_COST,
            vanilla_steps=vanilla_steps,
            wall_time_s=time.perf_counter() - started,
        )
        writer.log_metrics(step, "sample", metrics)
        writer.log_trajectories(
            [
                trajectory_record(t, r, step, f"s{step:03d}-{j:02d}-{k}")
                for j, (t, r, k) in enumerate(zip(batch, rewards, kinds, strict=True))
            ]
        )
    writer.write_eval("gold_traces", steps - 1, _eval_results(examples, rollout))
    return out


def _eval_results(examples: list[dict], rollout) -> list[dict]:
    """da / da-nm / vanilla on every example, grouped by task and length bin."""
    groups: dict[tuple[str, str, str], list[tuple[float, float, int, int, int]]] = defaultdict(list)
    for i, example in enumerate(examples):
        gold = example["gold_completion"]
        runs = {"da": rollout(i, gold, "da"), "da-nm": rollout(i, gold, "da-nm")}
        runs["vanilla"] = rollout(i, runs["da"].parsed.without_mode_tags(), "vanilla")
        scores = score_trajectories(runs.values()).items
        for (mode, t), score in zip(runs.items(), scores, strict=True):
            read = round(float(t.kv_tokens_read.sum()))  # what this mode's engine read (DA, causal, SA)
            groups[(mode, example["task"], length_bin(example["context_tokens"]))].append(
                (
                    score.accuracy,
                    score.accuracy_ruler,
                    read,
                    int(t.trace.kv_tokens_vanilla.sum()),
                    len(t.completion_ids),
                )
            )
    return [
        {
            "mode": mode,
            "task": task,
            "length_bin": label,
            "n": len(rows),
            "accuracy": float(np.mean([r[0] for r in rows])),
            "accuracy_ruler": float(np.mean([r[1] for r in rows])),
            "kv_tokens": sum(r[2] for r in rows),
            "kv_tokens_vanilla": sum(r[3] for r in rows),
            "decode_steps": float(np.mean([r[4] for r in rows])),
        }
        for (mode, task, label), rows in sorted(groups.items())
    ]

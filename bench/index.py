"""KV tokens read by gold traces that navigate by the index, by gold traces that navigate in global, and by
vanilla decoding, side by side on the same examples.

For every generator and context length, each example is drafted once from a seeded rng and its gold
trace rendered twice from the same plan and the same wording draws (``data.traces.render_trace``), once
planning in ``<global>`` and once in ``<index>``. The global trace is laid out as today (no index), the
index trace with an index of ``--entry-tokens`` tokens per chunk (protocol v3); both with the protocol
instructions and the local BPE tokenizer, block size ``--block-size``. Each completion is replayed
through ``rollouts.masks.trace_completion`` (the engines' own accounting, contract 7), which also gives
vanilla causal attention's reads of the same tokens. Vanilla here is the global trace on the prompt
without an index: what a model without Declarative Attention reads. Savings are ``1 - DA / vanilla``,
summed over the examples of a cell.

Left out: the model (the traces are gold, not sampled) and time (KV tokens read is what the mask
saves; ``bench/rollouts.py`` times decoding).

    .venv/bin/python -m bench.index                        # the recorded run (4K, 16K, 32K; a few minutes)
    .venv/bin/python -m bench.index --lengths 4096 --examples 1   # quick
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

import numpy as np

from data.filler import TokenCounter
from data.tasks import TASKS, make_task
from data.tokenizer import build_tokenizer
from data.traces import render_trace
from rollouts.masks import trace_completion
from rollouts.protocol import build_prompt, token_bytes_table


@dataclass
class Cell:
    vanilla: int = 0  # causal reads of the global trace on the prompt without an index
    da_global: int = 0
    da_index: int = 0
    index_tokens: int = 0  # the index region's tokens, summed over examples
    prompt_tokens: int = 0  # prompt tokens of the index layout, summed
    n: int = 0

    def saving(self, da: int) -> float:
        return 1.0 - da / self.vanilla if self.vanilla else 0.0


def measure(task_name: str, target: int, n: int, args, tokenizer, count, table) -> Cell:
    task = make_task(task_name)
    target = target if task.length_targeted else 0
    cell = Cell()
    for i in range(n):
        rng = random.Random(f"bench-index/{task_name}/{target}/{i}")
        draft = task.draft(rng, count, target, args.chunk_tokens, ood=False)
        traces = {}
        for navigation in ("global", "index"):
            wording = random.Random(
                f"bench-index/{task_name}/{target}/{i}/wording"
            )  # the same draws for both
            traces[navigation] = render_trace(draft.plan, wording, False, "verbose", navigation)
        common = dict(block_size=args.block_size, chunk_tokens=args.chunk_tokens)
        plain = build_prompt(draft.question, draft.documents, tokenizer, **common)
        indexed = build_prompt(
            draft.question, draft.documents, tokenizer, index_entry_tokens=args.entry_tokens, **common
        )
        encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        by_global = trace_completion(plain, encode(traces["global"]), table)
        by_index = trace_completion(indexed, encode(traces["index"]), table)
        cell.vanilla += int(by_global.kv_tokens_vanilla.sum())
        cell.da_global += int(by_global.kv_tokens.sum())
        cell.da_index += int(by_index.kv_tokens.sum())
        cell.index_tokens += indexed.index_span[1] - indexed.index_span[0]
        cell.prompt_tokens += indexed.prompt_len
        cell.n += 1
    return cell


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    parser.add_argument("--examples", type=int, default=3, help="examples per task and length")
    parser.add_argument("--chunk-tokens", type=int, default=2048)
    parser.add_argument("--entry-tokens", type=int, default=32, help="tokens per index entry")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    args = parser.parse_args(argv)

    tokenizer = build_tokenizer()
    count, table = TokenCounter(tokenizer), token_bytes_table(tokenizer)
    print(
        f"KV tokens read over gold traces (verbose, non-thinking), {args.examples} examples per cell, "
        f"chunks of {args.chunk_tokens} tokens, index entries of {args.entry_tokens}, block {args.block_size}, "
        "local BPE tokenizer, protocol instructions on\n"
    )
    print(
        "| task | context | n | index tokens | vanilla KV | DA global KV | DA index KV | saved: global | saved: index |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    totals: dict[int, list[Cell]] = {}
    for target in args.lengths:
        for name in args.tasks:
            cell = measure(name, target, args.examples, args, tokenizer, count, table)
            if make_task(name).length_targeted:
                totals.setdefault(target, []).append(cell)
            context = f"{target // 1024}K" if make_task(name).length_targeted else "own"
            print(
                f"| {name} | {context} | {cell.n} | {cell.index_tokens // cell.n} | {cell.vanilla:,} | "
                f"{cell.da_global:,} | {cell.da_index:,} | {cell.saving(cell.da_global):.1%} | "
                f"{cell.saving(cell.da_index):.1%} |"
            )
    print()
    for target, cells in totals.items():
        vanilla = sum(c.vanilla for c in cells)
        g, x = (sum(getattr(c, k) for c in cells) for k in ("da_global", "da_index"))
        savings = np.array([c.saving(c.da_index) for c in cells])
        print(
            f"{target // 1024}K, every length-targeted task: saved {1 - g / vanilla:.1%} navigating in global, "
            f"{1 - x / vanilla:.1%} by the index (per task: min {savings.min():.1%}, max {savings.max():.1%})"
        )


if __name__ == "__main__":
    main()

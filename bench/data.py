"""Examples generated per second, per task, at 4K and 32K context tokens, with the local BPE tokenizer.

Each example is made as ``heed data build`` makes it (draft from a seeded rng, then token counts,
length check and both gold traces), one at a time on one process. The tokenizer is the project's
byte-level BPE built locally (``data/tokenizer.py``), so nothing is downloaded. Prints a markdown
table; ``bench/BENCHMARKS.md`` records it with the command that produced it.

    .venv/bin/python -m bench.data [--examples-4k 40] [--examples-32k 10] [--chunk-tokens 2048]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time

from data.filler import TokenCounter
from data.tasks import TASKS, finalize, make_task
from data.tokenizer import build_tokenizer


def examples_per_second(task_name: str, target: int, n: int, count: TokenCounter, chunk_tokens: int) -> float:
    task = make_task(task_name)
    target = target if task.length_targeted else 0
    start = time.perf_counter()
    for i in range(n):
        rng = random.Random(f"bench/{task_name}/{target}/{i}")
        draft = task.draft(rng, count, target, chunk_tokens, ood=False)
        finalize(
            task_name,
            draft,
            example_id=str(i),
            count=count,
            chunk_tokens=chunk_tokens,
            target_tokens=target,
            rng=rng,
        )
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples-4k", type=int, default=40)
    parser.add_argument("--examples-32k", type=int, default=10)
    parser.add_argument("--chunk-tokens", type=int, default=2048)
    args = parser.parse_args()

    count = TokenCounter(build_tokenizer())
    examples_per_second("niah_single", 4096, 3, count, args.chunk_tokens)  # warm the word-count memo
    print(
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, chunk_tokens={args.chunk_tokens}, "
        f"local BPE (vocabulary {len(count.tokenizer)})\n"
    )
    print("| task | examples/s at 4K tokens | examples/s at 32K tokens |")
    print("| --- | ---: | ---: |")
    for name in TASKS:
        short = examples_per_second(name, 4096, args.examples_4k, count, args.chunk_tokens)
        long = examples_per_second(name, 32768, args.examples_32k, count, args.chunk_tokens)
        print(f"| {name} | {short:,.1f} | {long:,.1f} |")
    print("\nvariable_assignment has no length target (16 assignments, about 90 tokens) in both columns.")


if __name__ == "__main__":
    main()

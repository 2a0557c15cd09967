"""An eval's completions by chunk count and by task: where a policy stops answering as contexts grow.

    .venv/bin/heed eval RUN/export --data DATA --split test --modes da --completions F.jsonl
    .venv/bin/python -m bench.by_chunks F.jsonl DATA

``DATA`` is the dataset the eval read (``configs/data/tiny-range.yaml`` built with ``heed data build``): each
completion's chunk count comes from its row. Per group it prints accuracy with its standard error, compliance,
and the KV tokens read per example beside what causal decoding of the same completions reads (the eval's own
accounting, ``kv_tokens`` and ``kv_tokens_vanilla``). What is left out: pairing across checkpoints (one file).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict


def summary(rows: list[dict]) -> str:
    """One group's line.

    >>> summary([{"accuracy": 1.0, "compliance": 1.0, "kv_tokens": 100, "kv_tokens_vanilla": 400},
    ...          {"accuracy": 0.0, "compliance": 0.0, "kv_tokens": 300, "kv_tokens_vanilla": 400}])
    'n=2 acc 0.500 ± 0.354 compliance 0.500 KV read/ex 200 causal 400 saving 0.500'
    """
    n = len(rows)
    acc = sum(r["accuracy"] for r in rows) / n
    kv = sum(r["kv_tokens"] for r in rows) / n
    causal = sum(r["kv_tokens_vanilla"] for r in rows) / n
    return (
        f"n={n} acc {acc:.3f} ± {math.sqrt(acc * (1 - acc) / n):.3f} "
        f"compliance {sum(r['compliance'] for r in rows) / n:.3f} "
        f"KV read/ex {kv:,.0f} causal {causal:,.0f} saving {1 - kv / causal:.3f}"
    )


def main(completions: str, data: str) -> None:
    from datasets import load_from_disk

    test = load_from_disk(data)["test"]
    chunks = dict(zip(test["id"], test["num_chunks"], strict=True))
    with open(completions) as f:
        rows = [json.loads(line) for line in f]
    for name, key in (("chunks", lambda r: chunks[r["id"]]), ("task", lambda r: r["task"])):
        groups = defaultdict(list)
        for row in rows:
            groups[key(row)].append(row)
        for value in sorted(groups):
            print(f"{name} {value}: {summary(groups[value])}")
    print(f"all: {summary(rows)}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

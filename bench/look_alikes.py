"""Multikey answers split by the look-alike beside the asked key: does it share the key's adjective or its noun?

    .venv/bin/heed eval RUN/export --data RUN/data --modes da --completions F.jsonl
    .venv/bin/python -m bench.look_alikes F.jsonl RUN/data

A multikey example asks one key among look-alikes (data/tasks/niah.py): one distractor key shares the asked
key's adjective (``silver-owl`` beside ``silver-fox``) or its noun (``weak-church`` beside ``cold-church``),
drawn evenly. A noun twin is the harder one for a small model: the words right before each value are then the
same, and only the adjective several tokens back tells the facts apart. For each kind it prints how many
answers were right and how often the focus had the evidence in view, the two ways a `keyed` reading fails.
What is left out: other tasks, and sampled completions (pass greedy ones).
"""

from __future__ import annotations

import json
import sys
from collections import Counter


def twin(asked: str, others: list[str]) -> str:
    """The word ``asked`` shares with the other keys: ``adjective``, ``noun``, ``both`` or ``none``.

    >>> twin("weak-church", ["cold-church", "true-duck"]), twin("silver-owl", ["silver-fox", "red-owl"])
    ('noun', 'both')
    """
    adj, noun = asked.split("-")
    shared = {
        ("adjective", "noun")[i] for k in others for i, w in enumerate(k.split("-")) if w == (adj, noun)[i]
    }
    return "both" if len(shared) == 2 else shared.pop() if shared else "none"


def main(completions: str, data: str) -> None:
    from datasets import load_from_disk

    meta = {row["id"]: json.loads(row["meta"]) for row in load_from_disk(data)["test"]}
    right, in_view, total = Counter(), Counter(), Counter()
    with open(completions) as f:
        rows = [json.loads(line) for line in f]
    for c in rows:
        if c["task"] != "niah_multikey":
            continue
        m = meta[c["id"]]
        kind = twin(m["keys"][0], m["distractor_keys"])
        total[kind] += 1
        right[kind] += int(c["correct"])
        in_view[kind] += int(set(c["evidence_chunks"]) <= set(c["focused_chunks"] or []))
    for kind in sorted(total):
        n = total[kind]
        print(
            f"{kind} twin: {right[kind]}/{n} right ({right[kind] / n:.2f}), evidence in view {in_view[kind]}/{n}"
        )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

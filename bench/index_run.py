"""Two finished ``heed train`` runs side by side on the same held-out split: does the index save KV reads at
equal accuracy?

    .venv/bin/python -m bench.index_run runs/r4 runs/idx1      # the default, then configs/tiny-index.yaml

For the greedy ``da`` eval after SFT and after GRPO: each run's accuracy, KV tokens read per example (what
its engine read: the index run's prompts are longer, so its own ``kv_saving`` against vanilla decoding of
its own prompt is printed too), and mode mix; then the paired accuracy difference (second run minus
first, over the examples both evaluated, with its standard error) and the ratio of KV tokens read. The
runs must have evaluated the same examples: their test splits are compared question by question first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from datasets import load_from_disk

from rl.summary import STAGES, paired_difference
from rollouts.protocol import mode_table


def _split(run_dir: Path, name: str) -> dict[str, tuple]:
    data = load_from_disk(str(run_dir / "data"))[name]
    return {row["id"]: (row["question"], tuple(row["documents"])) for row in data}


def main(first: Path, second: Path) -> None:
    states = [json.loads((r / "state.json").read_text()) for r in (first, second)]
    split = yaml.safe_load((first / "config.yaml").read_text())["data"]["eval_split"]
    a, b = (_split(r, split) for r in (first, second))
    if a != b:
        sys.exit(f"{first} and {second} did not evaluate the same {split!r} examples")
    print(f"held-out {split!r}: {len(a)} examples, the same in both runs")
    print(f"A = {first}, B = {second}\n")
    print(
        "| stage | run | accuracy | KV tokens / example | KV saving (own vanilla) | global / focus / local / index |"
    )
    print("|---|---|---|---|---|---|")
    for stage, label in STAGES:
        rows = [s["eval"].get(stage, {}).get("da") for s in states]
        if None in rows:
            continue
        for name, row in zip("AB", rows):
            mix = " / ".join(f"{(row.get(m.eval_key) or 0):.0%}" for m in mode_table())
            print(
                f"| {label} | {name} | {row['accuracy']:.3f} | {row['kv_tokens'] / row['n']:,.0f} | "
                f"{row['kv_saving']:.1%} | {mix} |"
            )
    print()
    for stage, label in STAGES:
        examples = [s["eval_examples"].get(stage) for s in states]
        rows = [s["eval"].get(stage, {}).get("da") for s in states]
        if None in examples or None in rows:
            continue
        mean, se, n = paired_difference(*examples, metric=0)  # accuracy
        ratio = (rows[1]["kv_tokens"] / rows[1]["n"]) / (rows[0]["kv_tokens"] / rows[0]["n"])
        print(
            f"{label}: accuracy B - A {mean:+.3f} ± {se:.3f} (paired, n = {n}); "
            f"KV tokens read B / A {ratio:.2f} ({abs(1 - ratio):.1%} {'fewer' if ratio < 1 else 'more'})"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

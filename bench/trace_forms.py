"""What each gold-trace strategy costs, before anything is trained: KV tokens read per example and the share
of tokens predicted in ``global``, per task, for a run config's tasks and protocol.

    .venv/bin/python -m bench.trace_forms [--config configs/tiny.yaml] [--examples 24] [OVERRIDE ...]

For every strategy the run's config accepts (``data/traces.py``; ``direct`` not under v5), it builds the
config's test split with that one strategy (``--examples`` per task and length) and replays each gold trace
through the accounting every eval uses (``trace_completion``, the end-of-sequence step included; the mode
of each token as the dashboards count it). GRPO moves a policy between these forms, so the table says, for
a recipe, where its reads can go and whether the ``global`` share falls on the way: the cheapest form is
the floor of reads, and its share is where the share ends. Overrides are ``heed train``'s
(``run.protocol_version=5``, ``data.build.tasks=[...]``).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from data.traces import STRATEGIES


def form_costs(
    config_path: str, overrides: list[str], examples: int
) -> list[tuple[str, str, float, float, float]]:
    """``(strategy, task, KV tokens read per example, tokens per completion, global share)`` rows."""
    import tempfile
    from pathlib import Path

    from data.build import generate
    from data.config import parse_config
    from data.prompts import layout_example
    from rl.config import ConfigError, load_run_config
    from rl.run_inputs import run_tokenizer
    from rollouts.masks import trace_completion
    from rollouts.protocol import token_bytes_table

    base = load_run_config(config_path, [*overrides, "data.build.trace_strategies={plan: 1.0}"])
    with tempfile.TemporaryDirectory() as scratch:  # the run's tokenizer, as heed train makes it
        tokenizer = run_tokenizer(base, Path(scratch))
    table = token_bytes_table(tokenizer)
    rows = []
    for strategy in [s for s in STRATEGIES if s != "global"]:  # `global` declares no focus: not compliant
        try:
            config = load_run_config(
                config_path, [*overrides, f"data.build.trace_strategies={{{strategy}: 1.0}}"]
            )
        except ConfigError as err:  # a strategy the run's protocol refuses (direct under v5)
            if f"trace_strategies.{strategy}" not in str(err):
                raise
            continue
        build = parse_config({**config.data.build, "splits": {"train": 0, "validation": 0, "test": examples}})
        settings = config.run.prompt_layout()
        by_task: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        gold_key = "gold_completion_thinking" if settings.thinking else "gold_completion"
        for example in generate(build, tokenizer)["test"]:
            row = example.to_row()
            layout = layout_example(row, tokenizer, settings)
            ids = tokenizer(row[gold_key], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            trace = trace_completion(layout, ids, table)
            if trace.parsed.violations:
                raise ValueError(
                    f"{row['id']}: the {strategy} gold breaks the protocol: {trace.parsed.violations}"
                )
            by_task[row["task"]].append(
                (int(trace.kv_tokens.sum()), len(ids), trace.predicted_modes.count("global"))
            )
        for task, cells in sorted(by_task.items()):
            n = len(cells)
            rows.append(
                (
                    strategy,
                    task,
                    sum(c[0] for c in cells) / n,
                    sum(c[1] for c in cells) / n,
                    sum(c[2] for c in cells) / sum(c[1] for c in cells),
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--examples", type=int, default=24, help="test examples per task and length")
    parser.add_argument("overrides", nargs="*", help="heed train overrides, key=value")
    args = parser.parse_args()
    print(f"config: {args.config} {' '.join(args.overrides)}".rstrip())
    print(f"{'strategy':<12}{'task':<18}{'KV read/ex':>11}{'tokens':>8}{'global share':>14}")
    for strategy, task, reads, tokens, share in form_costs(args.config, args.overrides, args.examples):
        print(f"{strategy:<12}{task:<18}{reads:>11,.0f}{tokens:>8.1f}{share:>14.3f}")


if __name__ == "__main__":
    main()

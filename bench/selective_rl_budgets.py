"""Does RL lower the KV budgets a Selective Attention policy reaches? The SFT and the GRPO policy of one run.

A `heed train` run with ``selective.search_budgets: true`` (``configs/tiny-selective.yaml`` with
``selective.budgets=null selective.search_budgets=true``) searched per-layer budgets for its SFT policy
(``RUN_DIR/budget_search/search.json``: the paper's greedy search down to the SFT policy's own full-cache
loss on gold traces of the search split) and then trained GRPO under them, with the efficiency reward
counting what each layer read and L_mem in the loss. This script runs the same search, on the same rows
with the same tolerance, for the SFT policy (``RUN_DIR/budget_search``) and the GRPO policy
(``RUN_DIR/final``), and measures each policy's loss under both sets of budgets, side by side:

- budgets and mean budget of each search (``--step`` and ``--min-step``, default the run's own: a finer
  search than the run's resolves budgets the coarse one rounds up to the same value);
- each policy's full-cache loss (its own target) and its loss under the SFT budgets and under the GRPO
  budgets (nats per gold completion token, under the DA mask, eviction replayed);
- the run's own held-out evals after SFT and after GRPO (accuracy, KV-read saving), from state.json.

RL "lowers the budgets reachable at equal quality" if the GRPO search ends lower while the GRPO policy's
loss target is not worse than the SFT one's.

Run::

    .venv/bin/python -m bench.selective_rl_budgets runs/sel-search
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _load(folder: Path):
    from transformers import AutoModelForCausalLM

    from rollouts.selective.attention import SELECTIVE, register_selective_attention

    register_selective_attention()
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation=SELECTIVE).eval()


def main() -> None:
    import torch

    from rl.config import load_run_config
    from rl.evaluate import load_split
    from rl.selective.budgets import gold_batches, search_split_budgets
    from rl.selective.losses import completion_loss_under_budgets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--step", type=int, default=None, help="default: the run's selective.search_step")
    parser.add_argument("--min-step", type=int, default=None, help="default: the run's search_min_step")
    args = parser.parse_args()
    run_dir = args.run_dir
    config = load_run_config(run_dir / "config.yaml")
    selective = config.selective
    step = args.step or selective.search_step
    min_step = args.min_step or selective.search_min_step
    sft, grpo = _load(run_dir / "budget_search"), _load(run_dir / "final")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "final")
    rows = load_split(run_dir / "data", selective.search_split)[: selective.search_examples]
    layout = config.run.prompt_layout()
    batches = gold_batches(tokenizer, rows, layout)
    print(
        f"{run_dir}: {len(rows)} gold traces of {selective.search_split!r}, step {step} down to "
        f"{min_step or step}, tolerance {selective.search_tolerance}"
    )
    with torch.no_grad():
        searches = {
            name: search_split_budgets(
                model,
                tokenizer,
                rows,
                layout,
                step=step,
                tolerance=selective.search_tolerance,
                label=f"{name} policy",
                min_step=min_step,
            )
            for name, model in (("SFT", sft), ("GRPO", grpo))
        }
        found = searches["GRPO"]
        budgets = {name: search.budgets for name, search in searches.items()}
        print(f"{'policy':<6} {'budgets':<26} {'mean':>6} {'full-cache loss':>16} "
              f"{'loss @ SFT budgets':>19} {'loss @ GRPO budgets':>20}")  # fmt: skip
        for name, model in (("SFT", sft), ("GRPO", grpo)):
            full = completion_loss_under_budgets(model, batches, None)
            under = [completion_loss_under_budgets(model, batches, b) for b in budgets.values()]
            mean = sum(budgets[name]) / len(budgets[name])
            print(f"{name:<6} {list(budgets[name])!s:<26} {mean:>6.1f} {full:>16.4f} "
                  f"{under[0]:>19.4f} {under[1]:>20.4f}")  # fmt: skip
    print(
        f"context (the longest search row): {found.context} tokens; evaluations: SFT "
        f"{searches['SFT'].evaluations}, GRPO {found.evaluations}"
    )
    state = json.loads((run_dir / "state.json").read_text())
    for phase in ("sft", "grpo"):
        da = state.get("eval", {}).get(phase, {}).get("da")
        if da:
            print(
                f"held-out eval after {phase.upper()} (da, under the searched budgets): accuracy "
                f"{da['accuracy']:.3f}, compliance {da['compliance']:.3f}, coverage {da['coverage']:.3f}, "
                f"KV-read saving {da['kv_saving']:.3f} (n={da['n']})"
            )


if __name__ == "__main__":
    main()

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
- the run's own held-out evals after SFT and after GRPO (accuracy, KV-read saving), from state.json;
- with ``--positions K``: the K completion positions whose loss decides the search, each policy's mean loss
  there with the full cache, under the SFT policy's searched budgets and under the budgets GRPO trained
  under (``grpo_budgets``, when the run scaled them), and the first row's token at that position: which
  tokens eviction takes away (a chunk number the plan wrote, the value the answer copies, ...).

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
    from rl.eval_requests import spread_rows
    from rl.evaluate import load_split
    from rl.selective.budgets import gold_batches, search_split_budgets
    from rl.selective.losses import completion_loss_under_budgets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--step", type=int, default=None, help="default: the run's selective.search_step")
    parser.add_argument("--min-step", type=int, default=None, help="default: the run's search_min_step")
    parser.add_argument("--positions", type=int, default=0, help="print the K costliest completion positions")
    args = parser.parse_args()
    run_dir = args.run_dir
    config = load_run_config(run_dir / "config.yaml")
    selective = config.selective
    step = args.step or selective.search_step
    min_step = args.min_step or selective.search_min_step
    sft, grpo = _load(run_dir / "budget_search"), _load(run_dir / "final")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "final")
    rows = spread_rows(load_split(run_dir / "data", selective.search_split), selective.search_examples)
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
    if args.positions:
        columns = {"full": None, "SFT budgets": budgets["SFT"]}
        if state.get("grpo_budgets"):
            columns["GRPO's training budgets"] = tuple(state["grpo_budgets"])
        _print_positions({"SFT": sft, "GRPO": grpo}, batches, columns, tokenizer, args.positions)
    for phase in ("sft", "grpo"):
        da = state.get("eval", {}).get(phase, {}).get("da")
        if da:
            print(
                f"held-out eval after {phase.upper()} (da, under its own budgets): accuracy "
                f"{da['accuracy']:.3f}, compliance {da['compliance']:.3f}, coverage {da['coverage']:.3f}, "
                f"KV-read saving {da['kv_saving']:.3f} (n={da['n']})"
            )


def loss_by_position(model, batches, budgets) -> list[float]:
    """Mean cross-entropy (nats) at each completion position over the rows that reach it, with every layer
    holding at most ``budgets[l]`` tokens (``None``: no eviction), the DA mask on. Position 0 is the first
    completion token."""
    import torch

    from rollouts.selective.attention import AttentionState

    totals, counts = [], []
    with torch.no_grad():
        for batch in batches:
            inputs = dict(batch)
            labels = inputs.pop("labels")[:, 1:]  # [b, n-1]: the model predicts token t+1 at t
            state = AttentionState(budgets=budgets, padding_mask=inputs.pop("padding_mask"))
            logits = model(**inputs, heed_state=state).logits[:, :-1].float()  # [b, n-1, V]
            nll = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), labels.clamp_min(0), reduction="none"
            )
            for row, predicted in zip(nll, labels != -100):
                for k, value in enumerate(row[predicted].tolist()):
                    if k == len(totals):
                        totals.append(0.0)
                        counts.append(0)
                    totals[k] += value
                    counts[k] += 1
    return [t / c for t, c in zip(totals, counts)]


def _print_positions(models: dict, batches, columns: dict, tokenizer, k: int) -> None:
    """The ``k`` completion positions with the largest loss under any of ``columns``' budgets, per policy."""
    first = batches[0]["labels"][0, 1:]
    tokens = [tokenizer.decode([t]) for t in first[first != -100].tolist()]
    print("completion positions by loss (nats, mean over the gold traces); token: the first trace's")
    for name, model in models.items():
        losses = {column: loss_by_position(model, batches, b) for column, b in columns.items()}
        worst = sorted(range(len(tokens)), key=lambda p: -max(v[p] for v in losses.values()))[:k]
        print(f"{name} policy   " + "".join(f"{column:>24}" for column in columns))
        for p in sorted(worst):
            print(f"  {p:>3} {tokens[p]!r:<10}" + "".join(f"{losses[c][p]:>24.3f}" for c in columns))


if __name__ == "__main__":
    main()

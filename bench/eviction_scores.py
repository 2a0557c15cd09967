"""What decides a Selective Attention policy's evictions: each layer's ``F`` at the moment it evicts.

Under a budget ``K_l`` every token arriving at a full layer evicts the held token with the largest ``F``
(head 0's accumulated selections; ties go to the oldest, rollouts/selective/eviction.py). If a layer's
head 0 selects nothing, every held token has ``F = 0`` and the rule is a sliding window: the layer keeps the
last ``K_l`` tokens, and its budget is then the distance from the needle to the end of the prompt, whatever
the policy learned. This script runs the policy's budgeted forward over the prompts of a split and prints,
per layer, over every eviction the prompts cause:

- the evicted token's ``F`` (median), and the share of evictions where it was 0 (no selection: a window);
- the gap between the evicted token's ``F`` and the next-largest evictable one (median, 10th and 90th
  percentile): how far the rule is from a tie, the scale a sampled eviction's temperature would act on.

The eviction sequence is worked out here from each layer's ``F`` (captured from the forward, which replays
the same rule), one arriving token at a time, independently of ``replay_evictions``. Prompts only: what
decoding evicts is not counted.

Run::

    .venv/bin/python -m bench.eviction_scores RUN_DIR/export --data RUN_DIR/data --examples 8
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import numpy as np


@contextlib.contextmanager
def captured_masks():
    """Each layer's ``F`` ``[n, n]`` (first row of the batch) as the budgeted forward computes it, in layer
    order, while the context is open."""
    import rollouts.selective.attention as attention

    masks: list[np.ndarray] = []
    replay = attention.selective_keep_mask

    def capture(mask, budget, padding_mask=None, branches=None):
        masks.append(mask[0].detach().float().cpu().numpy())
        return replay(mask, budget, padding_mask, branches)

    attention.selective_keep_mask = capture
    try:
        yield masks
    finally:
        attention.selective_keep_mask = replay


def eviction_scores(f: np.ndarray, budget: int) -> list[tuple[float, float]]:
    """``(F of the evicted token, gap to the next-largest evictable F)`` for each eviction of one layer over
    a prompt whose ``F`` is ``f`` ``[n, n]``: token ``i`` arriving at ``budget`` held tokens evicts the
    largest ``f[i, k]`` over the held ``k`` other than the first (<BOS>), the oldest on ties.

    >>> f = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 5.0, 0]])
    >>> eviction_scores(f, 2)  # token 2 evicts token 1 (F 2 alone), token 3 evicts token 2 (F 5 alone)
    [(2.0, inf), (5.0, inf)]
    >>> eviction_scores(np.zeros((4, 4)), 3)  # no selection: the oldest goes, at a tie
    [(0.0, 0.0)]
    """
    held = list(range(min(budget, len(f))))
    events = []
    for i in range(budget, len(f)):
        candidates = np.array(held[1:])
        scores = f[i, candidates]
        victim = int(np.argmax(scores))  # the first maximum: the oldest of the most masked
        rest = np.delete(scores, victim)
        gap = float(scores[victim] - rest.max()) if len(rest) else float("inf")
        events.append((float(scores[victim]), gap))
        held.remove(int(candidates[victim]))
        held.append(i)
    return events


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoint", help="a `heed export` folder of a Selective Attention policy with budgets"
    )
    parser.add_argument("--data", required=True, help="dataset folder from `heed data build`")
    parser.add_argument("--split", default="validation")
    parser.add_argument("--examples", type=int, default=8, help="prompts, spread over the tasks and lengths")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data.prompts import layout_example
    from rl.eval_requests import spread_rows
    from rl.evaluate import load_split
    from rl.policy_settings import layout_settings, read_heed_json
    from rollouts.selective.attention import SELECTIVE, AttentionState, register_selective_attention
    from rollouts.selective.eviction import load_budgets

    checkpoint = Path(args.checkpoint)
    info = read_heed_json(checkpoint)
    if info is None:
        raise SystemExit(f"{checkpoint} has no heed.json: pass a `heed export` folder")
    register_selective_attention()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation=SELECTIVE).eval()
    budgets = load_budgets(model.config)
    if budgets is None:
        raise SystemExit(f"{checkpoint} carries no selective_budgets: nothing is evicted")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    layout = layout_settings(checkpoint, info)
    events: list[list[tuple[float, float]]] = [[] for _ in budgets]
    for row in spread_rows(load_split(args.data, args.split), args.examples):
        ids = torch.tensor([layout_example(row, tokenizer, layout).input_ids])
        with captured_masks() as masks, torch.no_grad():
            model(input_ids=ids, heed_state=AttentionState(budgets=budgets))
        for layer, f in enumerate(masks):
            events[layer] += eviction_scores(f, budgets[layer])
    print(f"{checkpoint}: {args.examples} prompts of {args.data} ({args.split}), budgets {list(budgets)}")
    print("layer  budget  evictions  F evicted (median)  F = 0  gap to next: median   p10    p90")
    for layer, (budget, rows) in enumerate(zip(budgets, events)):
        if not rows:
            print(f"{layer:>5}  {budget:>6}  {0:>9}")
            continue
        evicted, gap = np.array(rows).T
        gap = gap[np.isfinite(gap)]
        print(
            f"{layer:>5}  {budget:>6}  {len(rows):>9}  {np.median(evicted):>18.2f}  {np.mean(evicted == 0):>5.0%}"
            f"  {np.median(gap):>18.3f}  {np.percentile(gap, 10):>5.3f}  {np.percentile(gap, 90):>5.3f}"
        )


if __name__ == "__main__":
    main()

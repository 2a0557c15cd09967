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

Which token each arrival evicted comes from the forward's own replay (``selective_keep_mask``, captured
with each layer's ``F``); this script only reads the scores off. Prompts only: what decoding evicts is not
counted.

Run::

    .venv/bin/python -m bench.eviction_scores RUN_DIR/export --data RUN_DIR/data --examples 8
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import numpy as np


@contextlib.contextmanager
def captured_layers():
    """Each layer's ``(F, held)`` as the budgeted forward computes them, in layer order, while the context is
    open: ``F`` ``[n, n]`` and the held sets ``[n, n]`` (row ``i``: what the layer holds when token ``i``
    attends) that the forward's own replay (``selective_keep_mask``) returns, for the first row of the batch."""
    import rollouts.selective.attention as attention

    layers: list[tuple[np.ndarray, np.ndarray]] = []
    replay = attention.selective_keep_mask

    def capture(mask, budget, padding_mask=None, branches=None):
        keep = replay(mask, budget, padding_mask, branches)
        layers.append((mask[0].detach().float().cpu().numpy(), keep[0].cpu().numpy()))
        return keep

    attention.selective_keep_mask = capture
    try:
        yield layers
    finally:
        attention.selective_keep_mask = replay


def eviction_scores(f: np.ndarray, held: np.ndarray) -> list[tuple[float, float]]:
    """``(F of the evicted token, gap to the next-largest evictable F)`` for each eviction of one layer over
    a prompt: ``f`` its ``F`` ``[n, n]``, ``held`` its held sets ``[n, n]`` (the replay's). Token ``i``
    evicted what was held when ``i - 1`` attended and is not when ``i`` does; it chose among those tokens
    but the first (<BOS>), by ``f[i]``.

    >>> import torch
    >>> from rollouts.selective.eviction import selective_keep_mask
    >>> f = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 5.0, 0]])
    >>> held = selective_keep_mask(torch.tensor(f)[None], 2)[0].numpy()
    >>> eviction_scores(f, held)  # token 2 evicts token 1 (F 2 alone), token 3 evicts token 2 (F 5 alone)
    [(2.0, inf), (5.0, inf)]
    >>> zeros = np.zeros((4, 4))
    >>> eviction_scores(zeros, selective_keep_mask(torch.tensor(zeros)[None], 3)[0].numpy())  # a tie
    [(0.0, 0.0)]
    """
    events = []
    for i in range(1, len(f)):
        before, after = held[i - 1, :i], held[i, :i]
        victims = np.flatnonzero(before & ~after)
        if len(victims) == 0:
            continue
        candidates = np.flatnonzero(before)[1:]  # never <BOS>, the first held
        scores = f[i, candidates]
        rest = scores[candidates != victims[0]]
        gap = float(f[i, victims[0]] - rest.max()) if len(rest) else float("inf")
        events.append((float(f[i, victims[0]]), gap))
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
        with captured_layers() as layers, torch.no_grad():
            model(input_ids=ids, heed_state=AttentionState(budgets=budgets))
        for layer, (f, held) in enumerate(layers):
            events[layer] += eviction_scores(f, held)
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

"""Per-layer KV budgets by greedy search (Selective Attention paper §4).

Layers need very different amounts of context (the paper's 12-layer model ends at
``[8, 48, 8, 8, 24, 8, 168, 16, 8, 64, 8, 8]`` for context 512), so budgets are searched per layer:

    K = [N] * L                                      # every layer holds the whole context
    repeat:
        for each layer m: loss_m = loss(K with K_m lowered by C)     # C = 8
        m* = argmin loss_m
        if loss_m* > target: stop                    # target: the baseline model's loss
        K[m*] -= C

``loss`` is measured on a search split with the eviction replayed (:func:`rl.selective_model.loss_under_budgets`);
the result is to be evaluated on a separate test split. A budget never goes below 2 (<BOS> and the newest
token): the last reduction of a layer may be smaller than ``C``. Cost: ``L`` evaluations per accepted
step. Store the result with :func:`rollouts.eviction.save_budgets` (the model config's
``selective_budgets``, which ``save_pretrained`` keeps and the engines read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rollouts.eviction import MIN_BUDGET, check_budgets


@dataclass
class BudgetSearch:
    """The outcome of :func:`greedy_budget_search`."""

    budgets: tuple[int, ...]  # the smallest budgets found whose loss stayed within the target
    loss: float  # their loss on the search split
    target: float
    evaluations: int  # how many times the loss was measured
    steps: list[tuple[tuple[int, ...], float]] = field(default_factory=list)  # every accepted (budgets, loss)

    @property
    def mean_budget(self) -> float:
        return sum(self.budgets) / len(self.budgets)


def greedy_budget_search(
    loss: Callable[[tuple[int, ...]], float],
    num_layers: int,
    context: int,
    target: float,
    step: int = 8,
) -> BudgetSearch:
    """Lower one layer's budget by ``step`` at a time, always the layer whose reduction costs least, while
    the loss stays ``<= target``. ``loss(budgets)`` measures a candidate; ``context`` is the full length."""
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    budgets = check_budgets(context, num_layers)
    current = loss(budgets)
    result = BudgetSearch(budgets, current, target, evaluations=1)
    if current > target:
        return result  # even the full context misses the target: nothing to reduce
    while True:
        candidates = []
        for layer in range(num_layers):
            if budgets[layer] == MIN_BUDGET:
                continue
            smaller = list(budgets)
            smaller[layer] = max(budgets[layer] - step, MIN_BUDGET)
            candidates.append((loss(tuple(smaller)), layer, tuple(smaller)))
        result.evaluations += len(candidates)
        if not candidates:
            break
        best_loss, _, best = min(candidates)  # ties: the lower layer
        if best_loss > target:
            break
        budgets = best
        result.budgets, result.loss = best, best_loss
        result.steps.append((best, best_loss))
    return result

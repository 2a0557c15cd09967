"""Per-layer KV budgets by greedy search (Selective Attention paper §4).

Layers need very different amounts of context (the paper's 12-layer model ends at
``[8, 48, 8, 8, 24, 8, 168, 16, 8, 64, 8, 8]`` for context 512), so budgets are searched per layer:

    K = [N] * L                                      # every layer holds the whole context
    repeat:
        for each layer m: loss_m = loss(K with K_m lowered by C)     # C = 8
        m* = argmin loss_m
        if loss_m* > target: stop                    # target: the baseline model's loss
        K[m*] -= C

``loss`` is measured on a search split with the eviction replayed
(:func:`rl.selective.losses.loss_under_budgets`); the result is to be evaluated on a separate test split. A
budget never goes below 2 (<BOS> and the newest token): the last reduction of a layer may be smaller than
``C``. Cost: ``L`` evaluations per accepted step. With ``min_step`` below ``C`` the search goes on where it
stopped with ``C`` halved, down to ``min_step``: budgets to the token (``min_step = 1``) for little more than
the coarse search costs, where one fine step from the full context would take ``N / min_step`` rounds.
Store the result with :func:`rollouts.selective.eviction.save_budgets` (the model config's
``selective_budgets``, which ``save_pretrained`` keeps and the engines read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rollouts.selective.eviction import MIN_BUDGET, check_budgets


@dataclass
class BudgetSearch:
    """The outcome of :func:`greedy_budget_search`."""

    budgets: tuple[int, ...]  # the smallest budgets found whose loss stayed within the target
    loss: float  # their loss on the search split
    target: float
    evaluations: int  # how many times the loss was measured
    context: int = 0  # the full length: every layer's budget before the search
    steps: list[tuple[tuple[int, ...], float]] = field(default_factory=list)  # every accepted (budgets, loss)

    @property
    def mean_budget(self) -> float:
        return sum(self.budgets) / len(self.budgets)

    def as_dict(self) -> dict:
        """Plain JSON: the budgets, their loss and target, and every accepted step."""
        return {
            "budgets": list(self.budgets),
            "loss": self.loss,
            "target": self.target,
            "evaluations": self.evaluations,
            "context": self.context,
            "steps": [{"budgets": list(b), "loss": loss} for b, loss in self.steps],
        }


def greedy_budget_search(
    loss: Callable[[tuple[int, ...]], float],
    num_layers: int,
    context: int,
    target: float,
    step: int = 8,
    min_step: int | None = None,
) -> BudgetSearch:
    """Lower one layer's budget by ``step`` at a time, always the layer whose reduction costs least, while
    the loss stays ``<= target``; then, down to ``min_step`` (default: ``step``, no refinement), go on
    with the step halved. ``loss(budgets)`` measures a candidate; ``context`` is the full length."""
    min_step = step if min_step is None else min_step
    if not 1 <= min_step <= step:
        raise ValueError(f"need 1 <= min_step <= step, got step {step}, min_step {min_step}")
    budgets = check_budgets(context, num_layers)
    current = loss(budgets)
    result = BudgetSearch(budgets, current, target, evaluations=1, context=context)
    if current > target:
        return result  # even the full context misses the target: nothing to reduce
    while True:
        budgets = _lower_while_within(loss, budgets, target, step, result)
        if step == min_step:
            return result
        step = max(step // 2, min_step)


def _lower_while_within(loss, budgets: tuple[int, ...], target: float, step: int, result: BudgetSearch):
    """One resolution of the greedy search: accept the cheapest reduction by ``step`` while within target."""
    num_layers = len(budgets)
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
            return budgets
        best_loss, _, best = min(candidates)  # ties: the lower layer
        if best_loss > target:
            return budgets
        budgets = best
        result.budgets, result.loss = best, best_loss
        result.steps.append((best, best_loss))


def search_policy_budgets(
    model, batches, step: int = 32, tolerance: float = 0.0, progress=None, min_step: int | None = None
) -> BudgetSearch:
    """Budgets for a Selective Attention policy of the DA protocol: the greedy search on the loss of gold
    completions under their DA mask (:func:`rl.selective.losses.completion_loss_under_budgets`), down to
    the policy's own full-cache loss times ``1 + tolerance``. ``batches``: :class:`rl.sft.DACollator`
    batches with ``padding_mask``; ``progress(budgets, loss)`` is called after every evaluation."""
    from rl.selective.losses import completion_loss_under_budgets

    batches = list(batches)
    context = max(int(batch["padding_mask"].sum(-1).max()) for batch in batches)

    def loss(budgets):
        value = completion_loss_under_budgets(model, batches, budgets)
        if progress is not None:
            progress(budgets, value)
        return value

    full = loss(None)
    layers = model.config.num_hidden_layers
    return greedy_budget_search(loss, layers, context, full * (1 + tolerance), step, min_step)


def gold_batches(tokenizer, rows, layout, batch_size: int = 4) -> list[dict]:
    """The gold traces of data ``rows`` as :class:`rl.sft.DACollator` batches (with ``padding_mask``), the
    input of :func:`rl.selective.losses.completion_loss_under_budgets`."""
    from rl.sft import DACollator, encode_sft_row
    from rollouts.selective.constants import SELECTIVE

    rows = [encode_sft_row(row, tokenizer, layout) for row in rows]
    if not rows:
        raise ValueError("the budget search got no examples")
    collate = DACollator(tokenizer, SELECTIVE, padding_mask=True)
    return [collate(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]


def search_split_budgets(
    model,
    tokenizer,
    rows,
    layout: dict,
    batch_size: int = 4,
    step: int = 32,
    tolerance: float = 0.0,
    label: str = "budget search",
    min_step: int | None = None,
) -> BudgetSearch:
    """:func:`search_policy_budgets` on the gold traces of data ``rows`` (laid out as ``layout`` says:
    ``block_size``, ``thinking``, ``style``, ``instructions``), with a progress line. What `heed budgets`
    and the ``budget_search`` phase of `heed train` both run."""
    from rich.progress import Progress, TextColumn

    batches = gold_batches(tokenizer, rows, layout, batch_size)
    with Progress(TextColumn(f"[bold]{label}[/] {{task.description}}")) as bar:
        task = bar.add_task("")

        def show(budgets, loss):
            bar.update(task, description=f"{list(budgets) if budgets else 'full cache'}: loss {loss:.4f}")

        return search_policy_budgets(
            model, batches, step=step, tolerance=tolerance, progress=show, min_step=min_step
        )


def search_export_budgets(
    export_dir,
    data_dir,
    split: str = "validation",
    examples: int = 16,
    batch_size: int = 4,
    step: int = 32,
    tolerance: float = 0.0,
    write: bool = False,
    min_step: int | None = None,
) -> BudgetSearch:
    """``heed budgets``: search the KV budgets of an exported Selective Attention policy on ``examples``
    gold traces of ``split`` (laid out as the export's ``heed.json`` says), and with ``write`` store them in
    its ``config.json`` and ``heed.json``, where the engines and ``heed eval`` read them."""
    import json
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.evaluate import load_split
    from rl.policy_settings import HEED_JSON, layout_settings, read_heed_json
    from rollouts.selective.attention import SELECTIVE, register_selective_attention
    from rollouts.selective.eviction import save_budgets

    export_dir = Path(export_dir)
    info = read_heed_json(export_dir)
    if info is None:
        raise ValueError(f"{export_dir} has no heed.json: search the budgets of a `heed export` output")
    config = json.loads((export_dir / "config.json").read_text())
    if not config.get("selective_attention"):
        raise ValueError(
            f"{export_dir} is not a Selective Attention model (config.json: selective_attention)"
        )
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    register_selective_attention()  # the search replays budgets, which run on the dense kernel anyway
    model = AutoModelForCausalLM.from_pretrained(export_dir, attn_implementation=SELECTIVE).eval()
    layout = layout_settings(export_dir, info)
    rows = load_split(data_dir, split)[:examples]
    if not rows:
        raise ValueError(f"{data_dir} split {split!r} holds no examples")
    result = search_split_budgets(
        model, tokenizer, rows, layout, batch_size, step, tolerance, min_step=min_step
    )
    if write:
        save_budgets(model.config, result.budgets)
        model.config.to_json_file(export_dir / "config.json")
        info["selective_budgets"] = list(result.budgets)
        (export_dir / HEED_JSON).write_text(json.dumps(info, indent=2) + "\n")
    return result

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

Two judges decide what "within target" means (``heed budgets --judge``):

- ``loss``: the loss of the split's gold DA traces, teacher-forced under the candidate's evictions, at most
  the full cache's times ``1 + tolerance``. Cheap (one forward per batch), but it charges a policy for every
  gold token it would not write, a chunk number it no longer copies included, and says nothing of the answer.
- ``accuracy``: the policy's own greedy completions (``da``, evicting as the candidate says), graded as
  ``heed eval`` grades them, an answer counted only when its trace keeps the DA protocol (compliance 1);
  the error ``1 - accuracy`` at most the full cache's plus ``tolerance`` (accuracy points). What users get,
  at the cost of a batched forward of every example per candidate and a token-by-token decode of each
  completion the candidate changed (:mod:`rl.selective.verified_greedy`). Compliance counts because
  budgets are searched for a policy that declares its reads: a policy that, under tight budgets, answers
  without declaring a read still answers single-needle rows from what ``global`` kept, so plain accuracy
  would accept budgets at which the protocol, and the reads it saves, are gone.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from rollouts.selective.constants import BUDGET_JUDGES, check_accuracy_tolerance
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
    # what `loss` is (BUDGET_JUDGES): the gold traces' loss, or the greedy error 1 - accuracy
    judge: str = "loss"
    full: float | None = None  # the judge's value with the full cache (every layer at `context`)

    @property
    def mean_budget(self) -> float:
        return sum(self.budgets) / len(self.budgets)

    @property
    def measure(self) -> str:
        """What the judge measured, as a person reads it: ``accuracy`` (shown as accuracy, not as the error
        the search minimised) or ``loss``."""
        return "accuracy" if self.judge == "accuracy" else "loss"

    def shown(self, value: float) -> float:
        """``value`` as :attr:`measure` names it: the accuracy judge's errors as accuracies."""
        return 1.0 - value if self.judge == "accuracy" else value

    def summary(self) -> str:
        """One line: the budgets, what they keep and the bound it met.

        >>> BudgetSearch((4, 2), 0.25, 0.3, 9, judge="accuracy").summary()
        'budgets [4, 2] (mean 3.0): compliant greedy accuracy 0.7500 >= target 0.7000, 9 evaluations'
        """
        by_accuracy = self.judge == "accuracy"
        measure, bound = (
            ("compliant greedy accuracy", ">=") if by_accuracy else ("gold-completion loss", "<=")
        )
        return (
            f"budgets {list(self.budgets)} (mean {self.mean_budget:.1f}): {measure} {self.shown(self.loss):.4f} "
            f"{bound} target {max(0.0, self.shown(self.target)):.4f}, {self.evaluations} evaluations"
        )

    def as_dict(self) -> dict:
        """Plain JSON: the budgets, their loss and target, and every accepted step (under the ``accuracy``
        judge ``loss``, ``target`` and ``full`` are errors, ``1 - accuracy``)."""
        return {
            "judge": self.judge,
            "budgets": list(self.budgets),
            "loss": self.loss,
            "target": self.target,
            "evaluations": self.evaluations,
            "context": self.context,
            "full": self.full,
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
    result = BudgetSearch(budgets, current, target, evaluations=1, context=context, full=current)
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


def check_judge(judge: str, tolerance: float) -> None:
    """A judge of BUDGET_JUDGES, with a tolerance it can take."""
    if judge not in BUDGET_JUDGES:
        raise ValueError(f"unknown budget judge {judge!r}; choose one of {', '.join(BUDGET_JUDGES)}")
    if judge == "accuracy":
        check_accuracy_tolerance(tolerance)


def accuracy_budget_search(
    accuracy: Callable[[tuple[int, ...]], float],
    num_layers: int,
    context: int,
    tolerance: float = 0.0,
    step: int = 32,
    min_step: int | None = None,
) -> BudgetSearch:
    """The greedy search judged by accuracy: the smallest budgets whose ``accuracy(budgets)`` is at least
    the full cache's minus ``tolerance``. It minimises the error ``1 - accuracy`` (the result's ``loss``);
    each candidate is measured once, the full cache (every layer at ``context``) included.

    >>> def accuracy(budgets):  # three examples, answered while the two layers hold 4 and 9, 6 and 9, 4 and 1
    ...     return sum(budgets[0] >= a and budgets[1] >= b for a, b in ((4, 9), (6, 9), (4, 1))) / 3
    >>> accuracy_budget_search(accuracy, num_layers=2, context=16, step=4).budgets  # every example kept
    (8, 12)
    >>> accuracy_budget_search(accuracy, num_layers=2, context=16, tolerance=0.34, step=4).budgets  # one lost
    (4, 12)
    """
    check_accuracy_tolerance(tolerance)
    measured: dict[tuple[int, ...], float] = {}

    def error(budgets: tuple[int, ...]) -> float:
        if budgets not in measured:
            measured[budgets] = 1.0 - accuracy(budgets)
        return measured[budgets]

    full = error(check_budgets(context, num_layers))
    target = full + tolerance + 1e-9  # float slack: an error equal to full + tolerance passes
    result = greedy_budget_search(error, num_layers, context, target, step, min_step)
    result.evaluations = len(measured)
    result.judge = "accuracy"
    return result


@dataclass
class GreedyAccuracy:
    """The ``accuracy`` judge's measure, for :func:`accuracy_budget_search`: the policy's greedy ``da``
    completions of ``requests`` under the candidate's budgets, graded as ``heed eval`` grades them
    (:func:`rl.evaluate.run_requests`), each answer counted only when its trace complies
    (:func:`compliant_accuracy`). They are decoded by checking the completions of the nearest budgets
    already measured, the reference engine decoding only what changed
    (:class:`rl.selective.verified_greedy.VerifiedGreedy`). ``progress(budgets, accuracy)`` after each.
    """

    model: object
    tokenizer: object
    requests: list  # greedy `da` RolloutRequests, one per example
    progress: Callable[[tuple[int, ...], float], None] | None = None
    decoder: object = field(init=False, repr=False)

    def __post_init__(self):
        from rl.selective.verified_greedy import VerifiedGreedy

        self.decoder = VerifiedGreedy(self.model, self.tokenizer, self.requests)

    @classmethod
    def of(cls, model, tokenizer, rows, layout, max_tokens: int = 64, progress=None) -> GreedyAccuracy:
        """Requests for data ``rows`` laid out as ``layout`` says, at most ``max_tokens`` generated each."""
        from rl.eval_requests import build_requests

        requests = build_requests(rows, tokenizer, layout=layout, modes=("da",), max_tokens=max_tokens)
        if not requests:
            raise ValueError("the budget search got no examples")
        return cls(model, tokenizer, requests, progress)

    @property
    def context(self) -> int:
        """The longest prompt plus its completion: a budget this large evicts nothing."""
        return max(r.layout.prompt_len + r.max_tokens for r in self.requests)

    def report(self, budgets: tuple[int, ...]):
        """The :class:`rl.evaluate.EvalReport` of the requests decoded under ``budgets``."""
        from rl.evaluate import run_requests

        return run_requests(self.requests, lambda requests: self.decoder.generate(budgets), modes=("da",))

    def __call__(self, budgets: tuple[int, ...]) -> float:
        accuracy = compliant_accuracy(self.report(budgets).rewards)
        if self.progress is not None:
            self.progress(budgets, accuracy)
        return accuracy


def compliant_accuracy(rewards) -> float:
    """The mean accuracy of ``rewards`` (:class:`rewards.RewardBreakdown`), an answer counting only where
    its trace kept the protocol (``compliance == 1``): a right answer that declared no read scores 0.

    >>> from types import SimpleNamespace as R
    >>> compliant_accuracy([R(accuracy=1.0, compliance=1.0), R(accuracy=1.0, compliance=0.0),
    ...                     R(accuracy=0.5, compliance=1.0), R(accuracy=0.0, compliance=1.0)])
    0.375
    """
    if not rewards:
        raise ValueError("compliant_accuracy got no graded completions")
    return sum(r.accuracy for r in rewards if r.compliance == 1.0) / len(rewards)


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


@contextmanager
def progress_line(label: str, measure: str):
    """One live line, ``label [budgets]: measure value``, and the ``progress(budgets, value)`` that updates it."""
    from rich.progress import Progress, TextColumn

    with Progress(TextColumn(f"[bold]{label}[/] {{task.description}}")) as bar:
        task = bar.add_task("")

        def show(budgets, value):
            bar.update(
                task, description=f"{list(budgets) if budgets else 'full cache'}: {measure} {value:.4f}"
            )

        yield show


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
    batches = gold_batches(tokenizer, rows, layout, batch_size)
    with progress_line(label, "loss") as show:
        return search_policy_budgets(
            model, batches, step=step, tolerance=tolerance, progress=show, min_step=min_step
        )


def search_split_accuracy(
    model, tokenizer, rows, layout, max_tokens: int = 64, step: int = 32, tolerance: float = 0.0,
    min_step: int | None = None, label: str = "budget search",
) -> BudgetSearch:  # fmt: skip
    """:func:`accuracy_budget_search` on the policy's greedy completions of data ``rows``, with a progress
    line: the ``accuracy`` judge of `heed budgets`."""
    with progress_line(label, "accuracy") as show:
        accuracy = GreedyAccuracy.of(model, tokenizer, rows, layout, max_tokens, progress=show)
        layers = model.config.num_hidden_layers
        return accuracy_budget_search(accuracy, layers, accuracy.context, tolerance, step, min_step)


def search_rows(
    model, tokenizer, rows, layout: dict, judge: str = "loss", *, step: int = 32, tolerance: float = 0.0,
    min_step: int | None = None, batch_size: int = 4, max_tokens: int = 64, label: str = "budget search",
) -> BudgetSearch:  # fmt: skip
    """The search on data ``rows`` by ``judge`` (module docstring): what `heed budgets` and the
    ``budget_search`` phase of `heed train` both run. ``batch_size``: gold traces per forward (``loss``);
    ``max_tokens``: completion length (``accuracy``)."""
    check_judge(judge, tolerance)
    if judge == "accuracy":
        return search_split_accuracy(
            model, tokenizer, rows, layout, max_tokens, step, tolerance, min_step, label
        )
    return search_split_budgets(model, tokenizer, rows, layout, batch_size, step, tolerance, label, min_step)


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
    judge: str = "loss",
    max_tokens: int = 64,
) -> BudgetSearch:
    """``heed budgets``: search the KV budgets of an exported Selective Attention policy on ``examples`` of
    ``split`` (laid out as the export's ``heed.json`` says) by ``judge`` (module docstring: ``loss``, the
    gold traces', or ``accuracy``, the policy's greedy completions of at most ``max_tokens``), and with
    ``write`` store them in its ``config.json`` and ``heed.json``, where the engines and ``heed eval`` read
    them."""
    import json
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.eval_requests import spread_rows
    from rl.evaluate import load_split
    from rl.policy_settings import HEED_JSON, layout_settings, read_heed_json
    from rollouts.selective.attention import SELECTIVE, register_selective_attention
    from rollouts.selective.eviction import save_budgets

    check_judge(judge, tolerance)  # before the model loads
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
    rows = spread_rows(load_split(data_dir, split), examples)
    if not rows:
        raise ValueError(f"{data_dir} split {split!r} holds no examples")
    result = search_rows(
        model, tokenizer, rows, layout, judge, step=step, tolerance=tolerance, min_step=min_step,
        batch_size=batch_size, max_tokens=max_tokens,
    )  # fmt: skip
    if write:
        save_budgets(model.config, result.budgets)
        model.config.to_json_file(export_dir / "config.json")
        info["selective_budgets"] = list(result.budgets)
        (export_dir / HEED_JSON).write_text(json.dumps(info, indent=2) + "\n")
    return result

"""The composite DA reward: accuracy, gated KV-read efficiency, compliance and coverage, itemized.

One function, :func:`score_parsed`, combines the components for one completion; everything else feeds
it (:func:`score_trajectory` from a rollout's :class:`~rollouts.trajectory.Trajectory`, and the TRL
reward functions in ``rewards/trl_rewards.py`` from dataset columns)::

    total = accuracy_weight   * accuracy                       graded <answer>, in [0, 1], gated (below)
          + efficiency_weight * efficiency                     1 - attended/budget, gated (below)
          + compliance_weight * compliance                     0 or 1
          + coverage_weight   * coverage                       evidence chunks focused, 0 when unknown

The efficiency term measures the completion's KV reads against a per-example budget (what vanilla
attention reads over ``efficiency_reference_tokens`` steps from this prompt,
``rewards.efficiency.budget_efficiency``), so appending text never raises the total;
``efficiency_reference="completion"`` pays the paper's relative saving instead. It is *gated*: it pays
only when the answer is right (``accuracy >= efficiency_min_accuracy``), the completion follows the
protocol (``efficiency_requires_compliance``) and, optionally, the evidence was focused
(``efficiency_min_coverage``); otherwise it pays 0. Without the gates the cheapest policy is to read
nothing and guess. The accuracy term can be gated on coverage too (``accuracy_min_coverage``, off by
default). ``kv_saving`` reports the ungated relative saving (the paper's) for dashboards, and
``accuracy_ruler`` the answer graded by RULER's own metric (recall only, no length guard) for evals.

Bad input never raises; it gets a defined score and a reason (``RewardBreakdown.reasons``, counted
over a batch in ``RewardBatch.reasons``):

- ``input/truncated`` (finish reason ``length``), ``input/rollout_error``, ``input/empty_completion``,
  ``input/bad_completion_type``, ``input/missing_column:<name>``, ``input/bad_column:<name>``: every
  component 0 except where noted (a missing ``evidence_chunks`` only makes coverage unknown).
- ``accuracy/<why>``: the grader's reason (``no_answer``, ``multiple_answers``, ``answer_too_long``,
  ``no_number``, ...); accuracy 0.
- ``compliance/<violation kind>`` or ``compliance/no_focus``; compliance 0.
- ``efficiency/no_kv_accounting``, ``efficiency/bad_kv_accounting``: saving unknown, efficiency 0;
  ``efficiency/no_prompt_len``: the budget needs the prompt length and the accounting lacks it,
  efficiency 0; ``efficiency/gated:accuracy|compliance|coverage``: the efficiency was withheld;
  ``accuracy/gated:coverage``: a right answer that did not focus its evidence earned no accuracy in the
  total (``accuracy_min_coverage``; the breakdown's ``accuracy`` stays the grade).
- ``internal_error``: a bug in this package; everything 0 (and logged).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from numbers import Integral

from rollouts.protocol import ParsedCompletion
from rollouts.trajectory import Trajectory

from .accuracy import grade, ruler_grade
from .compliance import compliance, evidence_coverage
from .config import DEFAULT_CONFIG, RewardConfig
from .efficiency import DecodeCost, KVReads, budget_efficiency, kv_saving
from .terms import extra_terms

logger = logging.getLogger(__name__)

_ANSWER_COUNT_VIOLATIONS = frozenset({"multiple_answers", "nested_answer"})


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one completion: the total, every component, and why anything scored 0."""

    total: float
    accuracy: float
    efficiency: float  # the gated efficiency the total pays (RewardConfig.efficiency_reference)
    compliance: float
    coverage: float | None  # None: the example does not know its evidence chunks
    kv_saving: float | None  # ungated 1 - attended/vanilla in the configured unit; None: unknown
    reasons: tuple[str, ...] = ()
    accuracy_ruler: float = 0.0  # the answer under RULER's own metric (recall only, no length guard); unpaid
    extra: tuple[tuple[str, float | None], ...] = ()  # (name, value) of each registered term (terms.py)

    def value(self, name: str) -> float | None:
        """A term (built in or registered), ``total``, ``kv_saving`` or ``accuracy_ruler`` by name."""
        if name in _FIELDS:
            return getattr(self, name)
        for term, value in self.extra:
            if term == name:
                return value
        raise KeyError(f"no reward term {name!r}; terms: {', '.join(n for n in _FIELDS if n != 'reasons')}")


_FIELDS = tuple(f for f in RewardBreakdown.__dataclass_fields__ if f != "extra")


@dataclass
class RewardBatch:
    """Rewards of a batch, in order, with the reasons counted over it."""

    items: list[RewardBreakdown]
    reasons: Counter = field(default_factory=Counter)  # reason -> completions it applies to

    @property
    def totals(self) -> list[float]:
        return [r.total for r in self.items]

    def column(self, name: str) -> list:
        """One term (or ``total`` / ``kv_saving``) over the batch."""
        return [r.value(name) for r in self.items]

    @classmethod
    def of(cls, items: Iterable[RewardBreakdown]) -> RewardBatch:
        items = list(items)
        return cls(items, Counter(reason for r in items for reason in r.reasons))


def check_cost(config: RewardConfig, cost: DecodeCost | None) -> None:
    """Raise (at setup, not per completion) when the efficiency unit needs a model cost that is missing."""
    if config.efficiency_unit in ("bytes", "time") and cost is None:
        raise ValueError(
            f"RewardConfig.efficiency_unit={config.efficiency_unit!r} needs the model's decode cost: pass "
            "cost=DecodeCost.from_config(model.config), or use efficiency_unit='tokens'"
        )


def score_parsed(
    parsed: ParsedCompletion | None,
    example: Mapping,
    reads: KVReads | None,
    *,
    num_chunks: int,
    finish_reason: str = "stop",
    config: RewardConfig = DEFAULT_CONFIG,
    cost: DecodeCost | None = None,
    reasons: list[str] | None = None,
) -> RewardBreakdown:
    """Score one parsed completion (``None``: nothing to parse) of ``example`` (a dataset row).

    ``reads`` is the KV accounting (``None`` when unknown: the caller records why in ``reasons``);
    ``reasons`` holds what the caller already found, and the returned breakdown carries them all.

    >>> import numpy as np
    >>> from rollouts.protocol import parse_completion
    >>> example = {"answers": ["8"], "metric": "numeric", "evidence_chunks": [2, 7]}
    >>> reads = KVReads(np.array([100, 21, 22, 60]), np.array([100, 101, 102, 103]), prompt_len=100)
    >>> parsed = parse_completion('<focus magic_chunks="2,7">2003, 2011</focus><answer>8 years</answer>', 7)
    >>> config = RewardConfig(efficiency_reference_tokens=4)  # a budget of 4 vanilla steps: 406 KV tokens
    >>> score_parsed(parsed, example, reads, num_chunks=7, config=config)
    RewardBreakdown(total=1.75, accuracy=1.0, efficiency=0.5, compliance=1.0, coverage=1.0, kv_saving=0.5, reasons=(), accuracy_ruler=1.0, extra=())
    >>> score_parsed(parse_completion("<answer>9 years</answer>", 7), example, reads, num_chunks=7).reasons
    ('compliance/no_focus', 'efficiency/gated:accuracy')
    """
    reasons = [] if reasons is None else reasons
    saving = _saving(reads, config, cost, reasons)
    measured = _efficiency(reads, saving, config, cost, reasons)
    evidence = _evidence(example, num_chunks, reasons)
    if finish_reason != "stop":
        reasons.append("input/truncated" if finish_reason == "length" else "input/rollout_error")
        parsed = None
    if parsed is None:
        return zero_reward(reasons, saving, 0.0 if evidence else None)

    missing = [name for name in ("answers", "metric") if example.get(name) is None]
    ruler = 0.0
    if missing:
        accuracy, why = 0.0, None
        reasons += [f"input/missing_column:{name}" for name in missing]
    else:
        ruler = ruler_grade(parsed.answer, example["answers"], example["metric"], config.grader_options).score
        if _ANSWER_COUNT_VIOLATIONS.intersection(v.kind for v in parsed.violations):
            accuracy, why = 0.0, "multiple_answers"  # the first of two answers must not count
        else:
            accuracy, why = grade(parsed.answer, example["answers"], example["metric"], config.grader_options)
    if why:
        reasons.append(f"accuracy/{why}")

    follows, broken = compliance(parsed, evidence, num_chunks)
    reasons += [f"compliance/{b}" for b in broken]
    coverage = evidence_coverage(parsed, evidence, num_chunks)

    efficiency = measured or 0.0
    if accuracy < config.efficiency_min_accuracy:
        efficiency, gate = 0.0, "accuracy"
    elif config.efficiency_requires_compliance and follows < 1.0:
        efficiency, gate = 0.0, "compliance"
    elif coverage is not None and coverage < config.efficiency_min_coverage:
        efficiency, gate = 0.0, "coverage"
    else:
        gate = None
    if gate and measured:
        reasons.append(f"efficiency/gated:{gate}")

    paid = accuracy
    if accuracy and coverage is not None and coverage < config.accuracy_min_coverage:
        paid = 0.0
        reasons.append("accuracy/gated:coverage")
    total = (
        config.accuracy_weight * paid
        + config.efficiency_weight * efficiency
        + config.compliance_weight * follows
        + config.coverage_weight * (coverage or 0.0)
    )
    terms = extra_terms()  # registered terms (terms.py): scored after the built-in ones, ungated
    extra = tuple((term.name, term.value(parsed, example, reads, reasons)) for term in terms)
    total += sum(term.weight_in(config) * (value or 0.0) for term, (_, value) in zip(terms, extra))
    return RewardBreakdown(
        total, accuracy, efficiency, follows, coverage, saving, tuple(reasons), ruler, extra
    )


def score_trajectory(
    trajectory: Trajectory, config: RewardConfig = DEFAULT_CONFIG, cost: DecodeCost | None = None
) -> RewardBreakdown:
    """Score a rollout's trajectory: its parse, its per-step KV accounting and its dataset row."""
    check_cost(config, cost)
    try:
        empty = not trajectory.completion_text.strip()
        reasons, reads = (["input/empty_completion"] if empty else []), None
        if not empty:
            try:
                reads = KVReads.from_trajectory(trajectory)
            except (ValueError, TypeError):
                reasons.append("efficiency/bad_kv_accounting")
        example = trajectory.example if isinstance(trajectory.example, Mapping) else {}
        return score_parsed(
            None if empty else trajectory.parsed,
            example,
            reads,
            num_chunks=trajectory.layout.num_chunks,
            finish_reason="error" if trajectory.error else trajectory.finish_reason,
            config=config,
            cost=cost,
            reasons=reasons,
        )
    except Exception:
        logger.exception("scoring a trajectory failed; it scores 0")
        return zero_reward(["internal_error"])


def score_trajectories(
    trajectories: Iterable[Trajectory], config: RewardConfig = DEFAULT_CONFIG, cost: DecodeCost | None = None
) -> RewardBatch:
    """Score every trajectory; the batch counts the reasons."""
    check_cost(config, cost)
    return RewardBatch.of(score_trajectory(t, config, cost) for t in trajectories)


def zero_reward(
    reasons: Iterable[str], kv_saving: float | None = None, coverage: float | None = None
) -> RewardBreakdown:
    """Nothing gradable: every term 0 (coverage 0 where the evidence is known, else ``None``)."""
    extra = tuple((term.name, 0.0) for term in extra_terms())
    return RewardBreakdown(0.0, 0.0, 0.0, 0.0, coverage, kv_saving, tuple(reasons), extra=extra)


def _saving(
    reads: KVReads | None, config: RewardConfig, cost: DecodeCost | None, reasons: list[str]
) -> float | None:
    if reads is None:  # the caller said why
        return None
    try:
        return kv_saving(reads, config.efficiency_unit, cost, config.roofline)
    except ValueError:
        reasons.append("efficiency/bad_kv_accounting")
        return None


def _efficiency(
    reads: KVReads | None,
    saving: float | None,
    config: RewardConfig,
    cost: DecodeCost | None,
    reasons: list[str],
) -> float | None:
    """The ungated efficiency term: the budget efficiency, or the relative ``saving`` (``"completion"``)."""
    if config.efficiency_reference == "completion" or saving is None:  # unknown saving: the caller said why
        return saving
    if reads.prompt_len is None:
        reasons.append("efficiency/no_prompt_len")
        return None
    steps = int(config.efficiency_reference_tokens)
    return budget_efficiency(reads, steps, config.efficiency_unit, cost, config.roofline)


def _evidence(example: Mapping, num_chunks: int, reasons: list[str]) -> tuple[int, ...]:
    """The example's evidence chunk ids; ``()`` (unknown) when missing or unusable, with a reason."""
    if "evidence_chunks" not in example:
        reasons.append("input/missing_column:evidence_chunks")
        return ()
    value = example["evidence_chunks"]
    if (
        isinstance(value, list | tuple)
        and all(isinstance(c, Integral) and not isinstance(c, bool) for c in value)
        and all(1 <= c <= num_chunks for c in value)
    ):
        return tuple(int(c) for c in value)
    reasons.append("input/bad_column:evidence_chunks")
    return ()

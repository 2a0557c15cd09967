"""The DA reward as TRL reward functions: ``reward(prompts, completions, **columns) -> list[float]``.

TRL's ``GRPOTrainer`` calls each reward function with the batch's ``prompts`` and ``completions``
(strings, or chat message lists whose assistant ``content`` is joined), the ``completion_ids``, and
every dataset column as a keyword holding one value per completion (``answers``, ``metric``,
``evidence_chunks``, ``num_chunks``, ...; see the example schema in ``data/``). It sums the functions'
outputs with ``GRPOConfig.reward_weights`` and logs each function's mean as ``rewards/<name>/mean``.
:func:`trl_reward_functions` returns the total plus one function per component, with weights that
let the total drive learning and the components only be logged::

    funcs, weights = trl_reward_functions(RewardConfig(), cost=DecodeCost.from_config(model.config))
    trainer = GRPOTrainer(..., reward_funcs=funcs, args=GRPOConfig(..., reward_weights=weights))

**Where the KV accounting comes from.** Dataset columns do not hold it: the rollout function adds it,
and TRL forwards every extra key a ``rollout_func`` returns to the reward functions, one value per
completion. In order of preference:

0. ``reward_breakdown`` (``REWARD_COLUMN``): the :class:`~rewards.composite.RewardBreakdown` the rollout
   function already computed for the completion (Heed's GRPO scores each completion once, when it is
   generated, with :meth:`DAReward.score_trajectories`); returned as it is.
1. ``trajectory``: the :class:`~rollouts.trajectory.Trajectory` itself; scored by
   :func:`~rewards.composite.score_trajectory` (its parse, accounting and ``example`` row).
2. ``kv_tokens`` and ``kv_tokens_vanilla``: per-step KV tokens the engine read (``CompletionTrace
   .kv_tokens``, or ``kv_tokens_vanilla`` again for ``da-nm``/``vanilla`` rollouts) and the causal
   count; ``kv_tokens_per_layer`` (``[n][layers]``) replaces ``kv_tokens`` under SA eviction. Numpy
   arrays (as the trace holds them) or lists; a single total per completion also works for the
   ``tokens`` and ``bytes`` units. The efficiency's budget (``RewardConfig.efficiency_reference``)
   needs the prompt length: from ``layout``, else a ``prompt_len`` column, else the first entry of a
   per-step ``kv_tokens_vanilla`` (the prefill's last row reads exactly the prompt; "per step": more
   than one entry, or as many as ``completion_ids``). A single total without either scores efficiency
   0 with the reason ``efficiency/no_prompt_len``.
3. ``layout``: the :class:`~rollouts.protocol.PromptLayout`; the completion is re-traced with
   :func:`~rollouts.masks.trace_completion` from ``completion_ids`` (needs ``token_table``).

Without any of them the saving is unknown: efficiency scores 0 with the reason
``efficiency/no_kv_accounting``. Text completions are parsed with the layout's protocol version, else
``RewardConfig.protocol_version``. A ``finish_reason`` column (``stop``/``length``/``error``) marks
cut-off completions. Columns missing from the batch, wrong types and empty completions score 0 with a
reason; nothing raises inside a training step. The total function also logs each reason's share of
the batch as ``reward_reasons/<reason>`` and a ``reward_reasons`` column in the completions table.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from numbers import Integral

import numpy as np

from rollouts.masks import trace_completion
from rollouts.protocol import PromptLayout, parse_completion
from rollouts.trajectory import Trajectory

from .composite import (
    RewardBatch,
    RewardBreakdown,
    check_cost,
    score_parsed,
    score_trajectory,
    zero_reward,
)
from .config import RewardConfig
from .efficiency import DecodeCost, KVReads
from .terms import term_names

logger = logging.getLogger(__name__)

REWARD_COLUMN = "reward_breakdown"  # a rollout function's precomputed scores, one per completion


def completion_text(completion: object) -> str | None:
    """The generated text of a TRL completion: a string, or the assistant messages' content joined.

    >>> completion_text([{"role": "assistant", "content": "<answer>8</answer>"}])
    '<answer>8</answer>'
    >>> completion_text(8) is None
    True
    """
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, list | tuple):
        return None
    parts = []
    for message in completion:
        if not isinstance(message, Mapping):
            return None
        if message.get("role", "assistant") != "assistant":
            continue  # tool results and the like are not the model's text
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):  # content blocks: [{"type": "text", "text": ...}]
            texts = [b.get("text") for b in content if isinstance(b, Mapping) and b.get("type") == "text"]
            if not all(isinstance(t, str) for t in texts):
                return None
            parts += texts
        elif content is not None:
            return None
    return "".join(parts)


class DAReward:
    """The composite DA reward as a TRL reward function (the total), with per-component views.

    A callable class rather than a closure so that it pickles (TRL's async rollout workers send reward
    functions to other processes).

    >>> reward = DAReward()
    >>> completion = (
    ...     "<global>The founding is in Magic Chunk 2, the listing in Magic Chunk 7.</global>"
    ...     '<focus magic_chunks="2">Founded in 2003.</focus><focus magic_chunks="7">Public in 2011.</focus>'
    ...     "<local>2011 - 2003 = 8 years.</local><answer>8 years</answer>"
    ... )
    >>> columns = dict(answers=[["8"]], metric=["numeric"], evidence_chunks=[[2, 7]], num_chunks=[7],
    ...                kv_tokens=[[100, 21, 22, 60]], kv_tokens_vanilla=[[100, 101, 102, 103]])
    >>> reward(["How many years after Acme Corp was founded did it go public?"], [completion], **columns)
    [1.995...]
    >>> batch = reward.score(["..."], ["<answer>8</answer> is my guess"], **columns)
    >>> batch.totals, sorted(batch.reasons)
    ([1.0], ['compliance/no_focus', 'compliance/text_after_answer', 'efficiency/gated:compliance'])

    (The 4-step completion read 203 KV tokens; vanilla reads 20,928 over the default 128-step budget
    from this 100-token prompt: efficiency 0.990.)
    """

    __name__ = "da_reward"

    def __init__(
        self,
        config: RewardConfig | None = None,
        cost: DecodeCost | None = None,
        token_table: list[bytes] | None = None,
    ):
        self.config = config or RewardConfig()
        check_cost(self.config, cost)
        self.cost = cost
        self.token_table = token_table
        self._seen_reasons: set[str] = set()
        self._last: tuple[list, RewardBatch] | None = None  # (trajectories, their scores): the latest batch

    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list[float]:
        batch = self.score(prompts, completions, completion_ids, **columns)
        log_metric, log_extra = columns.get("log_metric"), columns.get("log_extra")
        self._seen_reasons.update(batch.reasons)
        if callable(log_metric) and batch.items:
            for reason in sorted(self._seen_reasons):  # absent reasons log 0, so means stay honest
                log_metric(f"reward_reasons/{reason}", batch.reasons[reason] / len(batch.items))
        if callable(log_extra):
            log_extra("reward_reasons", [", ".join(r.reasons) for r in batch.items])
        return batch.totals

    def score(self, prompts, completions, completion_ids=None, **columns) -> RewardBatch:
        """Every component of every completion, and the reasons counted over the batch.

        TRL calls the total and each component on the same batch: a batch of rollout ``trajectory``
        objects is scored once and the result reused for the identical objects.
        """
        trajectories = columns.get("trajectory")
        if isinstance(trajectories, list | tuple) and trajectories and self._last is not None:
            seen, batch = self._last
            if len(seen) == len(trajectories) and all(a is b for a, b in zip(seen, trajectories)):
                return batch
        batch = self._score(prompts, completions, completion_ids, **columns)
        if isinstance(trajectories, list | tuple) and trajectories:
            self._last = (list(trajectories), batch)
        return batch

    def _score(self, prompts, completions, completion_ids=None, **columns) -> RewardBatch:
        n = len(completions)
        rows = [{} for _ in range(n)]
        for name, values in columns.items():
            if isinstance(values, list | tuple) and len(values) == n:
                for row, value in zip(rows, values):
                    row[name] = value
        ids = (
            completion_ids if isinstance(completion_ids, list | tuple) and len(completion_ids) == n else None
        )
        return RewardBatch.of(
            self._score_row(completion, None if ids is None else ids[i], rows[i])
            for i, completion in enumerate(completions)
        )

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> RewardBatch:
        """Rollout trajectories scored under this reward's config and decode cost (what the rollout
        function hands on as ``REWARD_COLUMN``)."""
        return RewardBatch.of(self._score_row(None, None, {"trajectory": t}) for t in trajectories)

    def component(self, name: str) -> ComponentReward:
        """A TRL reward function returning one component (``None`` where coverage is unknown)."""
        return ComponentReward(self, name)

    def components(self) -> list[ComponentReward]:
        return [ComponentReward(self, name) for name in term_names()]  # registered terms too

    def _score_row(self, completion, ids, row: dict) -> RewardBreakdown:
        try:
            if isinstance(row.get(REWARD_COLUMN), RewardBreakdown):
                return row[REWARD_COLUMN]  # scored where it was generated
            trajectory = row.get("trajectory")
            if isinstance(trajectory, Trajectory):
                return score_trajectory(trajectory, self.config, self.cost)
            reasons: list[str] = []
            text = completion_text(completion)
            layout = row.get("layout") if isinstance(row.get("layout"), PromptLayout) else None
            num_chunks = layout.num_chunks if layout else row.get("num_chunks")
            if not isinstance(num_chunks, Integral) or isinstance(num_chunks, bool) or num_chunks < 0:
                kind = "missing_column" if num_chunks is None else "bad_column"
                return zero_reward([f"input/{kind}:num_chunks"])  # nothing can be parsed without it
            if text is None:
                reasons.append("input/bad_completion_type")
            elif not text.strip():
                reasons.append("input/empty_completion")
                text = None
            thinking = layout.thinking if layout else self.config.thinking
            version = layout.protocol_version if layout else int(self.config.protocol_version)
            has_index = layout.has_index if layout else False
            parsed = (
                None
                if text is None
                else parse_completion(text, int(num_chunks), thinking, version, has_index)
            )
            reads = self._reads(row, ids, layout, reasons) if parsed is not None else None
            finish = row.get("finish_reason") or "stop"  # absent or None: the engine did not say
            return score_parsed(
                parsed,
                row,
                reads,
                num_chunks=int(num_chunks),
                finish_reason=finish if isinstance(finish, str) else "error",
                config=self.config,
                cost=self.cost,
                reasons=reasons,
            )
        except Exception:
            logger.exception("scoring a completion failed; it scores 0")
            return zero_reward(["internal_error"])

    def _reads(self, row: dict, ids, layout: PromptLayout | None, reasons: list[str]) -> KVReads | None:
        read = row.get("kv_tokens_per_layer")
        if read is None:
            read = row.get("kv_tokens")
        if read is not None:
            try:
                vanilla = np.atleast_1d(np.asarray(row.get("kv_tokens_vanilla")))
                prompt_len = _prompt_len(row, layout, vanilla, ids)
                return KVReads(np.atleast_1d(np.asarray(read)), vanilla, prompt_len)
            except (ValueError, TypeError, OverflowError):
                reasons.append("efficiency/bad_kv_accounting")
                return None
        if layout is not None and self.token_table is not None and isinstance(ids, Sequence) and ids:
            try:
                trace = trace_completion(layout, ids, self.token_table)
                return KVReads(trace.kv_tokens, trace.kv_tokens_vanilla, layout.prompt_len)
            except (ValueError, TypeError):
                reasons.append("efficiency/bad_kv_accounting")
                return None
        reasons.append("efficiency/no_kv_accounting")
        return None


def _prompt_len(row: dict, layout: PromptLayout | None, vanilla: np.ndarray, ids) -> int | None:
    """The prompt length the completion decoded from (see the module docstring), ``None`` if unknown."""
    if layout is not None:
        return layout.prompt_len
    given = row.get("prompt_len")
    if isinstance(given, Integral) and not isinstance(given, bool):
        return int(given)
    per_step = len(vanilla) > 1 or (isinstance(ids, Sequence) and len(ids) == len(vanilla))
    return int(vanilla[0]) if per_step and vanilla.ndim == 1 and len(vanilla) else None


class ComponentReward:
    """One component of a :class:`DAReward` as its own TRL reward function, named ``<component>_reward``."""

    def __init__(self, reward: DAReward, name: str):
        if name not in term_names():
            raise ValueError(f"component must be one of {term_names()}, got {name!r}")
        self.reward, self.name = reward, name
        self.__name__ = f"{name}_reward"

    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list[float | None]:
        return self.reward.score(prompts, completions, completion_ids, **columns).column(self.name)


def trl_reward_functions(
    config: RewardConfig | None = None, cost: DecodeCost | None = None, token_table: list[bytes] | None = None
) -> tuple[list, list[float]]:
    """``(reward_funcs, reward_weights)`` for ``GRPOTrainer``: the total (weight 1) and each component
    (weight 0: logged, not added twice).

    >>> funcs, weights = trl_reward_functions()
    >>> [f.__name__ for f in funcs], weights
    (['da_reward', 'accuracy_reward', 'efficiency_reward', 'compliance_reward', 'coverage_reward'], [1.0, 0.0, 0.0, 0.0, 0.0])
    """
    total = DAReward(config, cost, token_table)
    components = total.components()
    return [total, *components], [1.0] + [0.0] * len(components)


_DEFAULT = DAReward()


def da_reward(prompts, completions, **columns) -> list[float]:
    """The total DA reward with the default :class:`RewardConfig`.

    >>> da_reward(["Q"], ["<answer>Paris</answer>"], answers=[["Paris"]], metric=["exact"],
    ...           evidence_chunks=[[]], num_chunks=[3], kv_tokens=[[10]], kv_tokens_vanilla=[[10]])
    [1.25]
    """
    return _DEFAULT(prompts, completions, **columns)


def accuracy_reward(prompts, completions, **columns) -> list[float]:
    """Accuracy of the parsed ``<answer>`` under the example's metric; text outside it earns nothing.

    >>> accuracy_reward(["Q", "Q"], ["<answer>8 years</answer>", "8 years"],
    ...                 answers=[["8"], ["8"]], metric=["numeric", "numeric"], num_chunks=[7, 7])
    [1.0, 0.0]
    """
    return _DEFAULT.component("accuracy")(prompts, completions, **columns)


def efficiency_reward(prompts, completions, **columns) -> list[float]:
    """Gated KV-read efficiency ``1 - attended / budget``: 0 unless the answer is right and compliant.

    >>> efficiency_reward(["Q", "Q"], ['<focus magic_chunks="1">x</focus><answer>8</answer>'] * 2,
    ...                   answers=[["8"], ["9"]], metric=["exact", "exact"], num_chunks=[3, 3],
    ...                   kv_tokens=[[60, 30], [60, 30]], kv_tokens_vanilla=[[60, 61], [60, 61]])
    [0.994..., 0.0]

    (90 KV tokens read against the default budget, 128 vanilla steps from this 60-token prompt: 15,808.)
    """
    return _DEFAULT.component("efficiency")(prompts, completions, **columns)


def compliance_reward(prompts, completions, **columns) -> list[float]:
    """1.0 for a protocol-compliant completion (no violations, a focus where evidence exists, one answer).

    >>> compliance_reward(["Q", "Q"], ['<focus magic_chunks="2">x</focus><answer>8</answer>',
    ...                                '<local>x</local><answer>8</answer>'],
    ...                   evidence_chunks=[[2], [2]], num_chunks=[7, 7])
    [1.0, 0.0]
    """
    return _DEFAULT.component("compliance")(prompts, completions, **columns)


def coverage_reward(prompts, completions, **columns) -> list[float | None]:
    """Fraction of the evidence chunks some focus made visible (``None``: evidence unknown).

    >>> coverage_reward(["Q", "Q"], ['<focus magic_chunks="2">x</focus><answer>8</answer>'] * 2,
    ...                 evidence_chunks=[[2, 7], []], num_chunks=[7, 7])
    [0.5, None]
    """
    return _DEFAULT.component("coverage")(prompts, completions, **columns)

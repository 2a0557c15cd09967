"""What every task generator returns, and how a draft becomes a dataset row.

A task is a small frozen dataclass whose fields are its documented parameters (they come from the
``params`` of a task in the data config). Its ``draft`` method builds one example from a seeded
``random.Random``: question, documents, answers, the needles and where they went, and a
``TracePlan``. ``finalize`` then does what is the same for every task: count tokens, check the
length promise, write both gold traces, and fill the schema's bookkeeping columns.

Every random choice goes through the ``rng`` handed in, so an example is a pure function of
(seed, task, target, split, index): the same seed gives the same bytes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import ClassVar

from ..filler import TokenCounter
from ..packing import LENGTH_TOLERANCE
from ..schema import DataError, Example
from ..traces import Read, TracePlan, render_traces


@dataclass
class Draft:
    """A task's example before bookkeeping. ``leak_keys`` identify its content for split hygiene: no key
    appears in two splits (so no needle or question of a test example was trained on); within a split
    keys may recur (a question asked again, in another context, with its own value)."""

    question: str
    documents: list[str]
    answers: list[str]
    metric: str
    evidence_chunks: list[int]
    plan: TracePlan
    leak_keys: frozenset[str]
    needles: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """Base of the generators. Subclasses add parameters as fields with a comment each."""

    name: str = ""
    length_targeted: ClassVar[bool] = True  # False: the task sets its own length (Variable Assignment)
    has_ood: ClassVar[bool] = False  # True: the builder also writes an "ood" split

    def draft(
        self, rng: random.Random, count: TokenCounter, target_tokens: int, chunk_tokens: int, ood: bool
    ) -> Draft:
        raise NotImplementedError

    def check(self, field_name: str, value, ok: bool, hint: str) -> None:
        """Raise a ``DataError`` naming the parameter when ``ok`` is false."""
        if not ok:
            raise DataError(f"task {self.name}: params.{field_name}={value!r} is invalid: {hint}")


def finalize(
    task: str,
    draft: Draft,
    *,
    example_id: str,
    count: TokenCounter,
    chunk_tokens: int,
    target_tokens: int,
    rng: random.Random,
    trace_style: str = "verbose",
    trace_navigation: str = "global",
    trace_strategies: dict[str, float] | None = None,
    trace_chunk_ids: str = "digits",
) -> Example:
    """Turn a draft into a validated ``Example`` with token counts and gold traces."""
    context_tokens = sum(count(draft.documents))
    if target_tokens and abs(context_tokens - target_tokens) > LENGTH_TOLERANCE * target_tokens:
        raise DataError(
            f"{task}: generated {context_tokens} context tokens for target_tokens={target_tokens} "
            f"(outside ±{LENGTH_TOLERANCE:.0%}); this tokenizer may count text non-additively"
        )
    if trace_navigation == "mixed":  # both forms in one dataset, so RL can choose between them
        trace_navigation = rng.choice(("global", "index"))
    strategy = draw_strategy(rng, trace_strategies)
    gold, gold_thinking = render_traces(
        draft.plan, rng, trace_style, trace_navigation, strategy, trace_chunk_ids
    )
    example = Example(
        id=example_id,
        task=task,
        question=draft.question,
        documents=draft.documents,
        answers=draft.answers,
        metric=draft.metric,
        evidence_chunks=sorted(draft.evidence_chunks),
        context_tokens=context_tokens,
        num_chunks=len(draft.documents),
        gold_completion=gold,
        gold_completion_thinking=gold_thinking,
        source="synthetic",
        needles=draft.needles,
        chunk_tokens=chunk_tokens,
        target_tokens=target_tokens,
        meta=json.dumps(draft.meta, sort_keys=True),
    )
    example.validate()
    return example


def draw_strategy(rng: random.Random, weights: dict[str, float] | None) -> str:
    """A trace strategy drawn by ``weights`` (data/traces.py ``STRATEGIES``); a single strategy draws
    nothing from ``rng``, so a dataset with one strategy is the same bytes as before strategies existed."""
    named = sorted((name, w) for name, w in (weights or {"plan": 1.0}).items() if w > 0)
    if len(named) == 1:
        return named[0][0]
    return rng.choices([name for name, _ in named], weights=[w for _, w in named])[0]


def reads_in_document_order(
    documents: list[str], needles: list[str], values: list[str] | None = None, keys: list[str] | None = None
) -> tuple[Read, ...]:
    """One ``Read`` per chunk holding needles, quoting them in the order they appear there;
    ``values[i]`` is the value-bearing part of ``needles[i]`` (what a terse trace copies), ``keys[i]`` the
    key it states (kept for a chunk of one needle: what a ``keyed`` focus writes before the value)."""
    by_chunk: dict[int, list[tuple[int, str, str, str]]] = {}
    for i, text in enumerate(needles):
        for chunk, doc in enumerate(documents, start=1):
            at = doc.find(text)
            if at >= 0:
                found = (at, text, values[i] if values else "", keys[i] if keys else "")
                by_chunk.setdefault(chunk, []).append(found)
                break
    reads = []
    for c in sorted(by_chunk):
        found = sorted(by_chunk[c])
        value = ", ".join(v for _, _, v, _ in found) if values else ""
        key = found[0][3] if len(found) == 1 else ""
        reads.append(Read((c,), " ".join(t for _, t, _, _ in found), value, key))
    return tuple(reads)


def spread(rng: random.Random, k: int, num_docs: int) -> list[int]:
    """``k`` document indices, distinct while there are enough documents, in random order."""
    if k <= num_docs:
        return rng.sample(range(num_docs), k)
    return [rng.randrange(num_docs) for _ in range(k)]

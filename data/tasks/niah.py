"""Needle in a haystack, in RULER's four variants, with optional distractor needles.

A needle is ``One of the special magic numbers for silver-owl is: 4715293.`` hidden in filler. The
variants differ in what is asked (RULER, Hsieh et al. 2024):

- ``niah_single``: one key, one value.
- ``niah_multikey``: one key asked, other keys' needles around it (``num_distractors``); half of them
  are near misses that share a word with the real key.
- ``niah_multivalue``: one key with ``num_values`` values, all of them wanted.
- ``niah_multiquery``: ``num_queries`` keys asked at once, every value wanted.

Graded with ``string_match_all``: every value must appear in the answer. The evidence chunks are the
chunks holding needles of the asked keys; a distractor's chunk is evidence only if it also holds a
real needle. The gold trace focuses on the evidence chunks and copies the needles.

``phrasing`` names a family of wordings (data/phrasings.py): ``ruler`` writes RULER's one needle sentence
and question; ``train`` draws each needle's and the question's template from several; ``heldout`` from
templates no training row uses.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .. import phrasings
from ..filler import TokenCounter
from ..packing import Needle, num_docs_for, pack_documents
from ..traces import TracePlan
from .base import Draft, Task, reads_in_document_order, spread
from .names import distinct_numbers, magic_keys


def check_needle_params(task) -> None:
    """The parameters every magic-number task shares: distractors, value digits, phrasing family."""
    task.check("num_distractors", task.num_distractors, task.num_distractors >= 0, "must be >= 0")
    task.check("value_digits", task.value_digits, 2 <= task.value_digits <= 12, "must be in 2..12")
    task.check("phrasing", task.phrasing, task.phrasing in phrasings.FAMILIES, f"one of {phrasings.FAMILIES}")


def needle_text(key: str, value: int) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


@dataclass(frozen=True)
class NeedleInHaystack(Task):
    name: str = "niah_single"
    num_queries: int = 1  # keys asked about in one question (RULER multi-query: 4)
    num_values: int = 1  # values per asked key, all wanted (RULER multi-value: 4)
    num_distractors: int = 0  # needles of keys nobody asks about (RULER multi-key: 3)
    value_digits: int = 7  # digits of each magic number (RULER: 7; fewer make copying easier for tiny models)
    phrasing: str = "ruler"  # family of needle and question wordings (data/phrasings.py)

    def __post_init__(self):
        self.check("num_queries", self.num_queries, self.num_queries >= 1, "must be at least 1")
        self.check("num_values", self.num_values, self.num_values >= 1, "must be at least 1")
        check_needle_params(self)

    def draft(
        self, rng: random.Random, count: TokenCounter, target_tokens: int, chunk_tokens: int, ood: bool
    ) -> Draft:
        keys = magic_keys(rng, self.num_queries + self.num_distractors, near=(self.num_distractors + 1) // 2)
        asked, others = keys[: self.num_queries], keys[self.num_queries :]
        n_real = self.num_queries * self.num_values
        low = 10 ** (self.value_digits - 1)
        values = distinct_numbers(rng, n_real + len(others), low, 10 * low - 1)
        real = [
            self._needle(rng, k, v)
            for k, v in zip([k for k in asked for _ in range(self.num_values)], values)
        ]
        fake = [self._needle(rng, k, v) for k, v in zip(others, values[n_real:])]

        num_docs = num_docs_for(target_tokens, chunk_tokens, min_docs=2)
        docs_of = spread(rng, len(real) + len(fake), num_docs)
        needles = [Needle(t, d) for t, d in zip(real + fake, docs_of)]
        rng.shuffle(needles)  # placement order inside a document is free
        documents = pack_documents(rng, count, needles, num_docs, target_tokens, chunk_tokens, self.name)

        answers = [str(v) for v in values[:n_real]]
        question = self._question(rng, asked)
        return Draft(
            question=question,
            documents=documents,
            answers=answers,
            metric="string_match_all",
            evidence_chunks=sorted({d + 1 for d in docs_of[:n_real]}),
            plan=self._plan(
                documents, real, answers, fake, [k for k in asked for _ in range(self.num_values)]
            ),
            leak_keys=frozenset([question, *real, *fake]),
            needles=real,
            meta={"keys": asked, "distractor_keys": others, "distractor_needles": fake},
        )

    def _needle(self, rng: random.Random, key: str, value: int) -> str:
        if self.phrasing == "ruler":  # draws nothing: datasets built before families stay the same bytes
            return needle_text(key, value)
        return phrasings.needle(rng, self.phrasing, key, value)

    def _question(self, rng: random.Random, asked: list[str]) -> str:
        if len(asked) == 1 and self.num_values == 1 and self.phrasing != "ruler":
            return phrasings.question(rng, self.phrasing, asked[0])
        if len(asked) > 1:
            listed = ", ".join(asked[:-1]) + f" and {asked[-1]}"
            return f"What are all the special magic numbers for {listed} mentioned in the provided text?"
        if self.num_values > 1:
            return f"What are all the special magic numbers for {asked[0]} mentioned in the provided text?"
        return f"What is the special magic number for {asked[0]} mentioned in the provided text?"

    def _plan(
        self, documents: list[str], real: list[str], answers: list[str], fake: list[str], keys: list[str]
    ) -> TracePlan:
        if self.num_queries > 1:
            need = "the special magic numbers of each key"
        elif self.num_values > 1:
            need = "every special magic number of the key"
        else:
            need = "the special magic number"
        combine = f"The numbers are {', '.join(answers)}." if len(answers) > 1 else ""
        reads = reads_in_document_order(documents, real, answers, keys)
        # every chunk holding a needle, asked or not: what a reader lists when keys look alike
        candidates = {c for r in (*reads, *reads_in_document_order(documents, fake)) for c in r.chunks}
        return TracePlan(
            answer=", ".join(answers),
            need=need,
            reads=reads,
            combine=combine,
            candidates=tuple(sorted(candidates)),
        )

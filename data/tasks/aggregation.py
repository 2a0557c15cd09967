"""Aggregation (RULER's common- and frequent-word extraction): tasks whose evidence is everywhere.

No chunk holds the answer; every chunk holds a little of it. A model must learn that such questions
need ``global`` and that focusing would only lose counts, which is why the gold trace is a single
global survey and ``evidence_chunks`` lists every chunk.

- ``aggregation_cwe``: a numbered list of words (``1. owl 2. bread ...``). ``num_common`` words
  appear ``ratio`` times as often as any other; name them (RULER: 10 words, 30 vs 3 times).
- ``aggregation_fwe``: a text of made-up "coded words" whose frequencies follow a Zipf law with
  exponent ``alpha``, sprinkled with ``....``; name the ``num_answers`` most frequent (RULER: 3).

Length: the number of list items is chosen so the context hits the target; the token count per
item is measured, then the item count is rescaled until the measured length is within 2%.
"""

from __future__ import annotations

import hashlib
import math
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from ..filler import TokenCounter
from ..packing import CHUNK_FILL, num_docs_for
from ..schema import DataError
from ..tokenizer import word_list
from ..traces import TracePlan
from .base import Draft, Task


def _fit_items(
    make: Callable[[int], list[str]], count: TokenCounter, target: int, task: str, minimum: int
) -> tuple[list[str], list[int]]:
    """Items from ``make(n)`` whose rendered tokens come within 2% of ``target``; and their counts."""
    n = max(minimum, target // 4)
    for _ in range(6):
        items = make(n)
        counts = count.words(items)
        total = sum(counts)
        if abs(total - target) <= 0.02 * target:
            return items, counts
        n = max(minimum, round(n * target / total))
    if abs(total - target) <= 0.05 * target:
        return items, counts
    raise DataError(f"{task}: target_tokens={target} is too short for {minimum} list items ({total} tokens)")


def _split(items: list[str], counts: list[int], target: int, chunk_tokens: int) -> list[str]:
    """Cut the item sequence into documents of about equal tokens, each within a chunk."""
    num_docs = num_docs_for(target, chunk_tokens, min_docs=2)
    per_doc = min(sum(counts) / num_docs, CHUNK_FILL * chunk_tokens)
    docs: list[list[str]] = [[]]
    size = 0
    for item, n in zip(items, counts):
        if docs[-1] and size + n / 2 > per_doc * len(docs):
            docs.append([])
        docs[-1].append(item)
        size += n
    return [" ".join(d) for d in docs]


def _context_key(task: str, documents: list[str]) -> str:
    return f"{task}:" + hashlib.sha256("\n".join(documents).encode()).hexdigest()


@dataclass(frozen=True)
class CommonWords(Task):
    name: str = "aggregation_cwe"
    num_common: int = 10  # words to name
    ratio: float = 2.0  # each common word appears at least this many times as often as any other word

    def __post_init__(self):
        self.check("num_common", self.num_common, 1 <= self.num_common <= 50, "must be 1..50")
        self.check("ratio", self.ratio, self.ratio > 1, "must be > 1 so the common words stand out")

    def draft(
        self, rng: random.Random, count: TokenCounter, target_tokens: int, chunk_tokens: int, ood: bool
    ) -> Draft:
        vocab = word_list()
        common = rng.sample(vocab, self.num_common)
        rest = [w for w in vocab if w not in set(common)]
        rng.shuffle(rest)
        shuffle_seed = rng.random()  # every attempt at a length shuffles the same way

        def make(n: int) -> list[str]:
            freq = 1
            while freq < self.ratio * math.ceil(max(n - self.num_common * freq, 0) / len(rest)):
                freq += 1
            others = n - self.num_common * freq
            words = common * freq + [rest[i % len(rest)] for i in range(max(others, 0))]
            random.Random(shuffle_seed).shuffle(words)
            return [f"{i}. {w}" for i, w in enumerate(words, start=1)]

        items, counts = _fit_items(make, count, target_tokens, self.name, minimum=2 * self.num_common)
        documents = _split(items, counts, target_tokens, chunk_tokens)
        freq = sum(it.endswith(f" {common[0]}") for it in items)
        answers = sorted(common)
        question = f"What are the {self.num_common} most common words in the numbered list?"
        survey = f"Each of {', '.join(answers)} appears {freq} times; every other word appears less often."
        return Draft(
            question=question,
            documents=documents,
            answers=answers,
            metric="string_match_all",
            evidence_chunks=list(range(1, len(documents) + 1)),
            plan=TracePlan(answer=", ".join(answers), need="the most common words", survey=survey),
            leak_keys=frozenset([_context_key(self.name, documents)]),
            meta={"frequency": freq, "items": len(items)},
        )


@dataclass(frozen=True)
class FrequentWords(Task):
    name: str = "aggregation_fwe"
    num_answers: int = 3  # most frequent coded words to name
    alpha: float = 2.0  # Zipf exponent: the word of rank r appears about n1 / r**alpha times
    noise: float = 0.2  # share of "...." items between the coded words

    def __post_init__(self):
        self.check("num_answers", self.num_answers, 1 <= self.num_answers <= 10, "must be 1..10")
        self.check("alpha", self.alpha, self.alpha >= 1.0, "must be >= 1 so the top ranks are distinct")
        self.check("noise", self.noise, 0 <= self.noise < 0.9, "must be in [0, 0.9)")

    def draft(
        self, rng: random.Random, count: TokenCounter, target_tokens: int, chunk_tokens: int, ood: bool
    ) -> Draft:
        vocab_size = max(4 * (self.num_answers + 1), target_tokens // 8)
        coded: dict[str, None] = {}  # distinct made-up words, in rank order
        while len(coded) < vocab_size:
            coded["".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 6)))] = None
        ranked = list(coded)
        shuffle_seed = rng.random()

        def make(n: int) -> list[str]:
            words_n = max(1, round(n * (1 - self.noise)))
            harmonic = sum(r**-self.alpha for r in range(1, len(ranked) + 1))
            words: list[str] = []
            for rank, w in enumerate(ranked, start=1):
                if len(words) >= words_n:
                    break
                words += [w] * max(1, round(words_n * rank**-self.alpha / harmonic))
            words += ["...."] * (n - len(words))
            random.Random(shuffle_seed).shuffle(words)
            return words

        minimum = 2 * (self.num_answers + 1) ** 2
        items, counts = _fit_items(make, count, target_tokens, self.name, minimum=minimum)
        freq = {w: items.count(w) for w in ranked[: self.num_answers + 1]}
        top = ranked[: self.num_answers]
        if freq[top[-1]] <= freq[ranked[self.num_answers]]:
            raise DataError(
                f"{self.name}: target_tokens={target_tokens} is too short to rank {self.num_answers} words"
            )
        documents = _split(items, counts, target_tokens, chunk_tokens)
        question = (
            f"What are the {self.num_answers} most frequently appearing coded words in the coded text? "
            "Ignore the dots '....'."
        )
        survey = "The most frequent coded words are " + ", ".join(f"{w} ({freq[w]} times)" for w in top) + "."
        return Draft(
            question=question,
            documents=documents,
            answers=top,
            metric="string_match_all",
            evidence_chunks=list(range(1, len(documents) + 1)),
            plan=TracePlan(answer=", ".join(top), need="the most frequent coded words", survey=survey),
            leak_keys=frozenset([_context_key(self.name, documents)]),
            meta={"frequencies": freq, "items": len(items)},
        )

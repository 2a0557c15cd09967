"""Offline filler text: sentences from shipped templates and word categories, and token counting.

Generators need pages of plausible, fact-free text around their needles, and nothing may be
downloaded. ``resources/filler_templates.txt`` holds sentence templates with slots such as
``{person}`` or ``{place}``; ``resources/lexicon.txt`` holds the words for each slot (nearly all
from ``words.txt``, so the local BPE tokenizer reads them as single tokens). The same categories
name the needle keys and entities of the tasks, which is why they live here.

Filler never contains digits, ``=`` or hyphenated words, so no filler sentence can be mistaken for a
needle (``VAR X = 1``, ``for silver-owl is: 1234567``) by a model or by the tests' solvers.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from importlib import resources

_SLOT = re.compile(r"\{(\w+)\}")
_ARTICLE = re.compile(r"\b([Aa]) (?=[aeiou])")  # "a early pig" -> "an early pig"


def _resource_lines(name: str) -> list[str]:
    text = resources.files("data").joinpath(f"resources/{name}").read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@lru_cache(maxsize=1)
def lexicon() -> dict[str, tuple[str, ...]]:
    """Word categories: ``{"person": ("baker", ...), "animal": (...), ...}``."""
    categories = {}
    for line in _resource_lines("lexicon.txt"):
        name, _, words = line.partition(":")
        categories[name.strip()] = tuple(words.split())
    return categories


@lru_cache(maxsize=1)
def templates() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each template split once into (format string, slot names), so filling is one ``format``."""
    cats = lexicon()
    out = []
    for line in _resource_lines("filler_templates.txt"):
        slots = tuple(_SLOT.findall(line))
        unknown = sorted(set(slots) - cats.keys())
        if unknown:
            raise ValueError(f"filler template {line!r} uses unknown slots {unknown}")
        out.append((_SLOT.sub("{}", line), slots))
    return tuple(out)


def filler_sentence(rng: random.Random) -> str:
    """One filler sentence, e.g. ``"The miller walked quietly to the harbor in the autumn."``."""
    fmt, slots = rng.choice(templates())
    cats = lexicon()
    text = _ARTICLE.sub(r"\1n ", fmt.format(*(rng.choice(cats[s]) for s in slots)))
    return text[0].upper() + text[1:]


class TokenCounter:
    """Counts tokens exactly as the prompt layout encodes documents.

    ``rollouts.protocol.build_prompt`` encodes each chunk with ``add_special_tokens=False`` and
    ``split_special_tokens=True``; ``__call__`` counts the same way, so ``context_tokens`` equals the
    chunk text tokens of the real prompt. ``words`` is the fast path for filler: the count of
    ``" " + sentence`` as the sum of its memoized ``" " + word`` counts. That sum is exact for
    byte-level BPE (its pre-tokenizer splits before every space, and merges never cross a split)
    and close for other tokenizers; documents are always re-counted exactly at the end.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        self._word_tokens: dict[str, int] = {}
        self._recent: dict[str, int] = {}  # documents are counted twice (packing, then the row)
        self._mean_sentence: float | None = None

    def __call__(self, texts: list[str]) -> list[int]:
        if len(self._recent) > 4096:
            self._recent.clear()
        todo = list(dict.fromkeys(t for t in texts if t not in self._recent))
        if todo:
            enc = self.tokenizer(
                todo, add_special_tokens=False, split_special_tokens=True, return_attention_mask=False
            )
            self._recent.update((t, len(ids)) for t, ids in zip(todo, enc["input_ids"]))
        return [self._recent[t] for t in texts]

    def one(self, text: str) -> int:
        return self([text])[0]

    def words(self, sentences: list[str]) -> list[int]:
        """Tokens of ``" " + sentence`` for each sentence, summed from memoized word counts."""
        split = [s.split(" ") for s in sentences]
        if len(self._word_tokens) > 200_000:  # coded words (aggregation_fwe) are new every example
            self._word_tokens.clear()
        new = sorted({w for words in split for w in words} - self._word_tokens.keys())
        if new:
            self._word_tokens.update(zip(new, self([" " + w for w in new])))
        return [sum(self._word_tokens[w] for w in words) for words in split]

    def mean_sentence_tokens(self) -> float:
        """Average tokens of a filler sentence (with its leading space), to size sentence pools."""
        if self._mean_sentence is None:
            rng = random.Random(0)
            counts = self.words([filler_sentence(rng) for _ in range(256)])
            self._mean_sentence = sum(counts) / len(counts)
        return self._mean_sentence

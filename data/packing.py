"""Lay needles into filler documents so the context hits a token target and each document is a chunk.

The context of ``target_tokens`` is split into ``num_docs`` documents of about ``target / num_docs``
tokens, each within ``chunk_tokens`` so the prompt layout keeps it as exactly one magic chunk (then a
needle's document index *is* its evidence chunk id). Each document gets its needles at random
sentence positions (in the order given, which keeps a variable chain readable front to back), and
filler sentences up to its share of the target.

Hitting the target: documents are filled against *cumulative* quotas, so a document that ends a few
tokens short is made up by the next one and errors never accumulate; the last sentence of a
document is cut to the words that fit. Filler sentences are sized by ``TokenCounter.words`` (memoized
per-word counts: exact for byte-level BPE, close for others); the finished documents are tokenized
for real, a document that spills over its chunk loses filler, and those exact counts are what the
example reports.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .filler import TokenCounter, filler_sentence
from .schema import DataError

# Share of a chunk a generated document aims to fill: headroom for a tokenizer whose counts are not
# exactly additive, so a document never spills into a second chunk.
CHUNK_FILL = 0.92
LENGTH_TOLERANCE = 0.05  # the promise: context within ±5% of the target


@dataclass(frozen=True)
class Needle:
    """Text that must appear verbatim in document ``doc`` (0-based)."""

    text: str
    doc: int


def num_docs_for(target_tokens: int, chunk_tokens: int, min_docs: int = 1) -> int:
    """How many chunk-sized documents a context of ``target_tokens`` needs."""
    return max(min_docs, math.ceil(target_tokens / (CHUNK_FILL * chunk_tokens)))


def pack_documents(
    rng: random.Random,
    count: TokenCounter,
    needles: list[Needle],
    num_docs: int,
    target_tokens: int,
    chunk_tokens: int,
    task: str,
) -> list[str]:
    """Documents of filler with ``needles`` placed in their documents; see the module docstring."""
    needle_tokens = count([" " + n.text for n in needles])
    per_doc = [0] * num_docs
    for needle, n in zip(needles, needle_tokens):
        per_doc[needle.doc] += n
    total_needles = sum(needle_tokens)
    if total_needles >= target_tokens * (1 - LENGTH_TOLERANCE):
        raise DataError(
            f"{task}: target_tokens={target_tokens} is too short: its needles alone take "
            f"{total_needles} tokens; raise the length or lower the number of needles"
        )
    if max(per_doc) > CHUNK_FILL * chunk_tokens:
        raise DataError(
            f"{task}: chunk_tokens={chunk_tokens} is too small: one chunk's needles take {max(per_doc)} tokens"
        )

    pool = _SentencePool(rng, count, expected_tokens=target_tokens - total_needles)
    docs: list[list[str]] = []
    produced, cap = 0, int(CHUNK_FILL * chunk_tokens)  # a document's share, with room to spare
    for i in range(num_docs):
        quota = round(target_tokens * (i + 1) / num_docs) - produced
        quota = min(quota, cap)
        sentences, size = pool.fill(quota - per_doc[i], require_one=per_doc[i] == 0)
        mine = [n.text for n in needles if n.doc == i]
        slots = sorted(rng.randint(0, len(sentences)) for _ in mine)
        for offset, (slot, text) in enumerate(zip(slots, mine)):
            sentences.insert(slot + offset, text)
        docs.append(sentences)
        produced += size + per_doc[i]
    # Each document's filler stops short of its quota by a word or two, and a document's first word has no
    # leading space (so it may count one token less than its memoized count); with small chunks that adds
    # up to more than the tolerance, so documents with room left, counted exactly, take more filler.
    real = count([" ".join(d) for d in docs])
    for i in sorted(range(num_docs), key=lambda i: real[i]):
        missing = target_tokens - sum(real)
        if missing <= 0:
            break
        more, _ = pool.fill(min(chunk_tokens - 1 - real[i], missing), require_one=False)
        if more:
            docs[i].extend(more)
            real[i] = count.one(" ".join(docs[i]))
    if produced > target_tokens * (1 + LENGTH_TOLERANCE):
        # filler is always cut to its quota, so only needles crowding a document's share get here
        raise DataError(
            f"{task}: target_tokens={target_tokens} is too short for its needles spread over {num_docs} "
            f"documents (they force {produced} tokens); raise the length or lower the number of needles"
        )
    return _fit_chunks(docs, count, chunk_tokens, {n.text for n in needles})


class _SentencePool:
    """Filler sentences with their token counts, generated and counted in batches."""

    def __init__(self, rng: random.Random, count: TokenCounter, expected_tokens: int):
        self.rng, self.count = rng, count
        self.batch = max(16, int(1.1 * expected_tokens / count.mean_sentence_tokens()) + 8)
        self.items: list[tuple[str, int]] = []

    def _next(self) -> tuple[str, int]:
        if not self.items:
            texts = [filler_sentence(self.rng) for _ in range(self.batch)]
            self.items = list(zip(texts, self.count.words(texts)))[::-1]
            self.batch = max(16, self.batch // 4)  # a refill only tops up rounding
        return self.items.pop()

    def fill(self, tokens: int, require_one: bool) -> tuple[list[str], int]:
        """Sentences totalling at most ``tokens`` (short of it by at most a word or two)."""
        out, size = [], 0
        while True:
            text, n = self._next()
            if size + n <= tokens:
                out.append(text)
                size += n
                continue
            cut = self._cut(text, tokens - size)
            if cut is not None:
                out.append(cut[0])
                size += cut[1]
            elif require_one and not out:
                out.append(text)  # a needle-free document must not be empty
                size += n
            return out, size

    def _cut(self, text: str, room: int) -> tuple[str, int] | None:
        """The longest word prefix of ``text`` (closed with a period) within ``room`` tokens."""
        words = text.rstrip(".").split()
        if room < 2 or len(words) < 2:
            return None
        prefixes = [" ".join(words[:k]).rstrip(",") + "." for k in range(1, len(words))]
        counts = self.count.words(prefixes)
        fitting = [(p, n) for p, n in zip(prefixes, counts) if n <= room]
        return fitting[-1] if fitting else None


def _fit_chunks(docs: list[list[str]], count: TokenCounter, chunk_tokens: int, keep: set[str]) -> list[str]:
    """Drop filler from any document whose real count exceeds the chunk (non-additive tokenizers)."""
    texts = [" ".join(d) for d in docs]
    for i, n in enumerate(count(texts)):
        while n > chunk_tokens:
            filler = [j for j, s in enumerate(docs[i]) if s not in keep]
            if not filler:
                raise DataError(
                    f"document {i + 1} cannot fit chunk_tokens={chunk_tokens} even without filler"
                )
            del docs[i][filler[-1]]
            texts[i] = " ".join(docs[i])
            n = count.one(texts[i])
    return texts

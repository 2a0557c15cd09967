"""The index: one short entry per magic chunk, what navigation needs without reading the chunk.

Declarative Attention's ``global`` mode reads the whole context to decide where to look; the index lets
a model decide that from a few tokens per chunk instead (``<index>`` mode, protocol v3), so a
navigation step costs O(number of chunks), not O(context).

An entry is the chunk's number and its most distinctive sentences, chosen offline and deterministically
from the texts alone (no model, no randomness):

1. Split each chunk into sentences (at ``. ! ? ;`` and line breaks).
2. Rank a chunk's sentences: *key-value-looking* ones first (a digit, an ``=``, an upper-case identifier
   or a hyphenated word: ``for silver-owl is: 4715293``, ``VAR QXZ = 12``), then by rarity, the mean
   over the sentence's distinct words of ``1 / df``, where ``df`` is how many of the example's chunks
   contain the word (filler shared by every chunk scores low), then by position.
3. Take the best sentence, then each next one that still fits the entry's token budget whole, and write
   them in the order they stand in the chunk. When the best sentence alone overflows, drop its most
   common words until it fits (``for golden-wine is: 47`` keeps ``golden-wine 47.``).

Left out: learned summaries (they need a model at layout time) and per-entry block alignment (the
index is one block-aligned region; the mask shows it whole).

>>> entries = index_entries(["The baker sang. For owl is: 47.", "The baker slept."], lambda t: len(t.split()), 8)
>>> entries
('Chunk 1: For owl is: 47.', 'Chunk 2: The baker slept.')
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'-]*")
_KEY_VALUE = re.compile(r"\d|=|\b[A-Z][A-Z0-9_]+\b|[A-Za-z0-9]-[A-Za-z0-9]")


def entry_header(chunk_id: int) -> str:
    """The label that starts chunk ``chunk_id``'s entry."""
    return f"Chunk {chunk_id}: "


def index_entries(
    chunks: Sequence[str], count_tokens: Callable[[str], int], entry_tokens: int
) -> tuple[str, ...]:
    """One entry per chunk, each at most ``entry_tokens`` tokens by ``count_tokens`` (header included).

    Raises ``ValueError`` when ``entry_tokens`` cannot hold even a header.
    """
    words = [{w.lower() for w in _WORD.findall(text)} for text in chunks]
    df: dict[str, int] = {}
    for seen in words:
        for w in seen:
            df[w] = df.get(w, 0) + 1
    return tuple(
        _entry(chunk_id, text, df, count_tokens, entry_tokens)
        for chunk_id, text in enumerate(chunks, start=1)
    )


def _entry(chunk_id: int, text: str, df: dict[str, int], count_tokens, entry_tokens: int) -> str:
    header = entry_header(chunk_id)
    budget = entry_tokens - count_tokens(header)
    if budget < 1:
        raise ValueError(
            f"index entries of {entry_tokens} tokens cannot hold the header {header!r} and any text; "
            "raise index_entry_tokens"
        )
    sentences = [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]

    def rank(i: int) -> tuple:
        s = sentences[i]
        distinct = {w.lower() for w in _WORD.findall(s)}
        rarity = sum(1 / df[w] for w in distinct) / len(distinct) if distinct else 0.0
        return (not _KEY_VALUE.search(s), -rarity, i)

    if not sentences:
        return header
    best, *rest = sorted(range(len(sentences)), key=rank)
    if count_tokens(sentences[best]) > budget:
        return header + _rarest_words(sentences[best], df, count_tokens, budget)
    chosen, used = [best], count_tokens(sentences[best])
    for i in rest:
        cost = count_tokens(" " + sentences[i])
        if used + cost <= budget:
            chosen.append(i)
            used += cost
    return header + " ".join(sentences[i] for i in sorted(chosen))


def _rarest_words(sentence: str, df: dict[str, int], count_tokens, budget: int) -> str:
    """``sentence`` without its most common words, in order, until it fits ``budget`` tokens: what is left
    is what tells the chunk apart. Dropped first: the highest ``df``; of equal ones, words that do not
    look like a key or a value; then the last."""
    words = sentence.split()

    def commonness(i: int) -> tuple:
        found = _WORD.findall(words[i])
        return (max((df.get(w.lower(), 0) for w in found), default=0), not _KEY_VALUE.search(words[i]), i)

    keep = list(range(len(words)))
    for i in sorted(keep, key=commonness, reverse=True):
        if count_tokens(" ".join(words[k] for k in keep)) <= budget:
            break
        keep.remove(i)
    return " ".join(words[k] for k in keep)

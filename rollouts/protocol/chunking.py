"""Segment raw context into magic chunks of about a target token count, losslessly.

A chunk boundary is placed at the coarsest natural boundary that keeps chunks within the target:
paragraphs first, then lines, sentences, words, and only as a last resort inside a word. Each level
splits *after* its separator, so ``"".join(chunks) == text`` always holds. The paper reports that
accuracy collapses when a table straddles a chunk boundary, hence the preference for coarse breaks.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# Each level splits after its separator (lookbehind keeps the separator with the left piece).
_LEVELS = (
    re.compile(r"(?<=\n\n)(?=[^\n])"),  # paragraph: after a blank-line run
    re.compile(r"(?<=\n)(?=[^\n])"),  # line
    re.compile(r"(?<=[.!?;:])(?=\s)|(?<=[.!?;:][\"')\]])(?=\s)"),  # sentence (space stays right)
    re.compile(r"(?<=\S)(?=\s)"),  # word
)


def split_text(text: str, target_tokens: int, count_tokens: Callable[[list[str]], list[int]]) -> list[str]:
    """Split ``text`` into pieces of at most ``target_tokens`` (as counted), joined back losslessly.

    ``count_tokens`` maps a list of strings to their token counts (one batched tokenizer call).
    Empty or whitespace-only text gives no chunk.
    """
    if target_tokens < 1:
        raise ValueError(f"chunk target must be >= 1 token, got {target_tokens}")
    if not text.strip():
        return []
    units = _units(text, 0, target_tokens, count_tokens)
    chunks: list[str] = []
    current, size = [], 0
    for unit, n in units:
        if current and size + n > target_tokens:
            chunks.append("".join(current))
            current, size = [], 0
        current.append(unit)
        size += n
    if current:
        chunks.append("".join(current))
    # Whitespace-only leftovers (a trailing newline run) join the chunk before them.
    merged: list[str] = []
    for chunk in chunks:
        if (merged and not chunk.strip()) or (merged and not merged[-1].strip()):
            merged[-1] += chunk
        else:
            merged.append(chunk)
    return merged


def _units(text: str, level: int, target: int, count_tokens) -> list[tuple[str, int]]:
    """Pieces of ``text`` no longer than ``target`` tokens, split at the coarsest level that works."""
    if level == len(_LEVELS):
        return _hard_split(text, target, count_tokens)
    pieces = [p for p in _LEVELS[level].split(text) if p]
    counts = count_tokens(pieces)
    out: list[tuple[str, int]] = []
    for piece, n in zip(pieces, counts):
        if n <= target:
            out.append((piece, n))
        else:
            out.extend(_units(piece, level + 1, target, count_tokens))
    return out


def _hard_split(text: str, target: int, count_tokens) -> list[tuple[str, int]]:
    """Cut an unbreakable run (a huge word) by characters, each cut within the target."""
    out = []
    while text:
        lo, hi = 1, len(text)
        while lo < hi:  # longest prefix within the target
            mid = (lo + hi + 1) // 2
            if count_tokens([text[:mid]])[0] <= target:
                lo = mid
            else:
                hi = mid - 1
        out.append((text[:lo], count_tokens([text[:lo]])[0]))
        text = text[lo:]
    return out

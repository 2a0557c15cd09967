"""Names for what needles talk about: magic-number keys, places and companies, variables, numbers.

Names are built from the shipped lexicon so they are cheap to tokenize, and are shaped so that
filler can never produce them (hyphenated keys, capitalized compounds, upper-case variable names).
Every sampler draws distinct names, because a question whose key has two needles is ambiguous.
"""

from __future__ import annotations

import random
import string

from ..filler import lexicon

_KEY_NOUNS = ("animal", "thing", "food", "place")
_COMPOUND_TAILS = ("field", "ford", "gate", "brook", "stone", "wood", "bury", "mouth", "haven", "moor")


def magic_keys(rng: random.Random, k: int, near: int = 0, share: str = "either") -> list[str]:
    """``k`` distinct ``adjective-noun`` keys such as ``"silver-owl"``.

    The last ``near`` keys are near misses of the first: they share its adjective or its noun (``share``:
    ``"either"``, each drawn, or always ``"noun"``), which is what makes a distractor needle hard to tell
    apart from the real one. A key that shares the noun is the harder twin: in ``weak-church is: 63`` and
    ``cold-church is: 17`` the value follows the same words, and only the adjective several tokens back
    tells them apart.
    """
    if share not in ("either", "noun"):
        raise ValueError(f"magic_keys(share={share!r}): use 'either' or 'noun'")
    cats = lexicon()
    nouns = [w for c in _KEY_NOUNS for w in cats[c]]
    adjectives = cats["adjective"]
    keys: list[str] = []
    while len(keys) < k:
        adj, noun = rng.choice(adjectives), rng.choice(nouns)
        if keys and len(keys) >= k - near:
            first_adj, first_noun = keys[0].split("-")
            if share == "noun" or rng.random() >= 0.5:
                noun = first_noun
            else:
                adj = first_adj
        key = f"{adj}-{noun}"
        if key not in keys:
            keys.append(key)
    return keys


def proper_names(rng: random.Random, k: int) -> list[str]:
    """``k`` distinct invented proper names such as ``"Rivergate"`` or ``"Owlbrook"``."""
    cats = lexicon()
    stems = [w for c in ("place", "animal", "thing", "adjective") for w in cats[c]]
    out: list[str] = []
    while len(out) < k:
        stem, tail = rng.choice(stems), rng.choice(_COMPOUND_TAILS)
        name = (stem + tail).capitalize()
        if stem != tail and name not in out:
            out.append(name)
    return out


def variable_names(rng: random.Random, k: int, length: int = 5) -> list[str]:
    """``k`` distinct upper-case variable names such as ``"QXWRT"`` (RULER's variable tracking)."""
    out: list[str] = []
    while len(out) < k:
        name = "".join(rng.choices(string.ascii_uppercase, k=length))
        if name not in out:
            out.append(name)
    return out


def distinct_numbers(rng: random.Random, k: int, low: int, high: int) -> list[int]:
    """``k`` distinct integers in ``[low, high]``."""
    return rng.sample(range(low, high + 1), k)

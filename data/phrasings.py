"""Families of wording for the magic-number facts and questions, so a model learns the fact, not a sentence.

RULER writes every needle one way (``One of the special magic numbers for silver-owl is: 4715293.``) and asks
one question. A model trained on that one sentence answers it and loops on any other. A *family* is a set of
needle and question templates; a task draws one template of its family per example (or per needle). The
``train`` family (a few written sentences) is what the pretraining corpus uses; ``varied`` composes over a
hundred from parts, for training rows whose only constant is the key and what follows it; ``heldout`` is
used for no training row (configs/data/tiny-phrasing.yaml), so an eval can tell reading from recall of a
template. ``ruler`` is RULER's single wording, the default, which keeps datasets built before families
existed byte-identical.

Every template writes the value after a space (`` 63``), as RULER's does, so the value is the same token in
the document, the trace and the answer; and every needle names its key, so ``data.tasks.base`` can find the
chunk holding it by the needle's text.
"""

from __future__ import annotations

import random

FAMILIES = ("ruler", "train", "heldout", "varied")

# {key}, {value}: one needle (a fact). Two-hop links add {other}: the key whose number is the answer.
NEEDLES: dict[str, tuple[str, ...]] = {
    "ruler": ("One of the special magic numbers for {key} is: {value}.",),
    "train": (
        "One of the special magic numbers for {key} is: {value}.",
        "The special magic number for {key} is {value}.",
        "Remember that the magic number of {key} is {value}.",
        "The magic number kept for {key} is {value}.",
        "Write this down: {key} has the magic number {value}.",
        "In the old book the number of {key} is {value}.",
    ),
    "heldout": (
        "A clerk noted that {key} goes with the number {value}.",
        "Beside the name {key} someone wrote {value}.",
        "Ask anyone and they will tell you {key} means {value}.",
    ),
}
LINKS: dict[str, tuple[str, ...]] = {
    "ruler": ("The magic number of {key} is that of {other}.",),
    "train": (
        "The magic number of {key} is that of {other}.",
        "For {key} use the magic number of {other}.",
        "The key {key} shares its number with {other}.",
        "The number of {key} equals that of {other}.",
    ),
    "heldout": (
        "For {key}, look up {other}.",
        "Beside the name {key} someone wrote: see {other}.",
        "A clerk noted that {key} copies {other}.",
    ),
}
# {key}: the question about one key's number.
QUESTIONS: dict[str, tuple[str, ...]] = {
    "ruler": ("What is the special magic number for {key} mentioned in the provided text?",),
    "train": (
        "What is the special magic number for {key} mentioned in the provided text?",
        "What is the magic number of {key}?",
        "Which number is the special magic number for {key}?",
        "Find the magic number for {key} in the text.",
        "Tell me the magic number kept for {key}.",
    ),
    "heldout": (
        "Which number goes with {key}?",
        "What did they write beside {key}?",
        "What does {key} mean, as a number?",
    ),
}


# ``varied``: templates composed from parts (145 needles, 12 links, 29 questions), so that what every training
# row shares is the key and what follows it, not a sentence to recall. Its parts use no word of ``heldout``'s
# own ("clerk", "beside", "wrote", "goes with", "means", "look up", "see", "copies"), and it repeats no
# template of another family (tests/data/test_phrasings.py).
_LEADS = ("", "Note: ", "Remember: ", "Today ", "Also, ")
_HOLDERS = (
    "the magic number of {key}",
    "the number kept for {key}",
    "the number of {key}",
    "{key}'s magic number",
    "{key}'s number",
)
_LINK_HOLDERS = _HOLDERS[2:]  # the shorter ones, no lead: a link names two keys (up to 6 tokens each) and
# must fit one chunk's needle room (tests/data/test_phrasings.py)
_IS = (" is", " is:", " was set to", " stays", " reads")
_KEY_FIRST = (
    "{key} has the magic number",
    "{key} holds the number",
    "{key} was given the number",
    "{key} keeps the number",
)
_SAME_AS = (
    " is that of {other}",
    " matches that of {other}",
    " was copied from {other}",
    " is the number of {other}",
)
_ASK = (
    "What is {h}?",
    "Which number is {h}?",
    "Tell me {h}.",
    "Give {h}.",
    "Find {h} in the text.",
    "What is {h} in the text?",
)


def _composed(parts: list[str], taken) -> tuple[str, ...]:
    """``parts`` capitalised, in order, without any template another family already has."""
    return tuple(dict.fromkeys(t for t in map(_capital, parts) if t not in taken))


def _varied() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    def fixed(table: dict[str, tuple[str, ...]]) -> set[str]:
        return {t for templates in table.values() for t in templates}

    needles = [f"{lead}{h}{v} {{value}}." for lead in _LEADS for h in _HOLDERS for v in _IS]
    needles += [f"{lead}{k} {{value}}." for lead in _LEADS for k in _KEY_FIRST]
    links = [f"{h}{same}." for h in _LINK_HOLDERS for same in _SAME_AS]
    questions = [a.format(h=h) for a in _ASK for h in _HOLDERS]
    return (
        _composed(needles, fixed(NEEDLES)),
        _composed(links, fixed(LINKS)),
        _composed(questions, fixed(QUESTIONS)),
    )


def needle(rng: random.Random, family: str, key: str, value) -> str:
    """One fact of ``family``: ``key``'s number is ``value``.

    >>> needle(random.Random(0), "ruler", "silver-owl", 63)
    'One of the special magic numbers for silver-owl is: 63.'
    """
    return rng.choice(NEEDLES[family]).format(key=key, value=value)


def link(rng: random.Random, family: str, key: str, other: str) -> str:
    """One link of ``family``: ``key``'s number is ``other``'s (the first hop of a two-hop question)."""
    return rng.choice(LINKS[family]).format(key=key, other=other)


def question(rng: random.Random, family: str, key: str) -> str:
    """A question of ``family`` about ``key``'s number."""
    return rng.choice(QUESTIONS[family]).format(key=key)


def restated(fact: str, key: str, value) -> str:
    """``fact`` from its key through its value, what a reader restates to bind the two (a ``keyed`` trace's
    focus, the base's sentence recall tables); "" when either is missing from it.

    >>> restated("One of the special magic numbers for silver-owl is: 63.", "silver-owl", 63)
    'silver-owl is: 63'
    >>> restated("Write this down: silver-owl has the magic number 63.", "silver-owl", "63")
    'silver-owl has the magic number 63'
    >>> restated("The magic number of silver-owl is that of red-fox.", "silver-owl", 63)
    ''
    """
    value = str(value)
    start = fact.find(key) if key and value else -1
    end = fact.find(value, start + len(key)) if start >= 0 else -1
    return fact[start : end + len(value)] if end >= 0 else ""


def _capital(template: str) -> str:
    """A template's first letter in capitals; a key that opens it stays as written ("{key}'s number ...")."""
    return template[0].upper() + template[1:]


NEEDLES["varied"], LINKS["varied"], QUESTIONS["varied"] = _varied()

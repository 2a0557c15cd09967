"""Accuracy: grade the parsed ``<answer>`` against the example's answers with the example's metric.

Each example names its grader in its ``metric`` column; the grader sees only the text inside
``<answer>...</answer>`` (the parser's ``ParsedCompletion.answer``), never the rest of the completion,
so an answer written anywhere else earns nothing. Scores are in ``[0, 1]``.

- ``string_match_all`` / ``string_match_part``: RULER's metrics (NVIDIA/RULER,
  ``scripts/eval/synthetic/constants.py``, after ``postprocess_pred`` in ``scripts/eval/evaluate.py``).
  The prediction is stripped, control characters ``\\x00-\\x1f`` become newlines, it is stripped again;
  a reference counts as found when ``ref.lower() in pred.lower()`` (references are used as given).
  ``all`` is the fraction of references found (every listed value is required), ``part`` is 1 when any
  is found (the references are alternatives). RULER reports the batch mean times 100; here one example
  scores in ``[0, 1]``.
- ``exact``: SQuAD's normalized exact match (lower case, ASCII punctuation and the articles a/an/the
  removed, whitespace collapsed), the best over the acceptable answers.
- ``f1``: SQuAD's token F1 on the same normalization, the best over the acceptable answers.
- ``numeric``: the answer must hold exactly one number; units, currency and percent signs around it
  are ignored ("8 years" = 8, "$1,234.5" = 1234.5, "45%" = 45); thousands separators, decimals,
  exponents and a plain fraction ``a/b`` are read. It matches a reference number within
  ``math.isclose(rel_tol, abs_tol)``. Two numbers ("8 or 9", "2011 - 2003 = 8") are ambiguous and
  score 0; so do number words ("eight").
- ``math``: Hugging Face's ``math-verify`` (LaTeX or plain expressions, symbolic equivalence).

Substring metrics only measure recall, so a policy could stuff every candidate into its answer
("1 2 3 ... 100" contains any reference number, "2003 2011 8" contains the year asked for). RULER is an
evaluation metric for free-form output, protected by its tiny generation budget (32-128 tokens); as an
RL reward it pays for listing every value the policy saw. So the reward adds two guards:

- **precision** (``GraderOptions.strict``, on by default): for ``string_match_all`` / ``string_match_part``
  an answer that holds a *candidate* which is not a reference scores 0 (reason ``extra_candidates``),
  and a reference with a shape counts as found only as one of the candidates.
  A candidate is a substring of the answer with the shape of the references: a number (a maximal run
  of ASCII digits, with an optional decimal part) when some reference is a number (needles, RULER's
  magic numbers), an upper-case identifier (a whole word of at least two characters from ``A-Z``,
  digits and ``_``, starting with a letter: ``QXWRT``, and also ``VAR``) when some reference is one
  (variable tracking). Template words ("The special magic number is") have neither shape, so they are
  never candidates. A candidate equals a reference ignoring case: ``"4715293 (1234567)"`` against
  ``["4715293"]`` scores 0, and so does a numbered list ``"1. 4715293"``. References of other shapes
  (words, phrases, uuids) define no candidates: those are graded by recall alone, as RULER grades
  them, within the length guard.
- **length** (every grader): an answer longer than ``length_factor x reference length + length_slack``
  characters scores 0 (reference length: the longest acceptable answer, or for ``string_match_all`` all
  required values joined by ``", "``).

:func:`ruler_grade` grades without either guard: RULER's own metric, which evaluation reports beside the
reward's accuracy (``accuracy_ruler``) so results stay comparable with RULER's.

A grader signals an answer it cannot grade by raising :class:`Ungradable` with a short reason;
:func:`grade` turns that (and any other error) into a score of 0 and the reason, and never raises.
"""

from __future__ import annotations

import logging
import math
import re
import string
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

from .settings import at_least, setting

METRICS = ("string_match_all", "string_match_part", "exact", "f1", "numeric", "math")


class Ungradable(ValueError):
    """The answer (or the reference) cannot be graded; ``reason`` says why, in a few words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Grade(NamedTuple):
    """A score in ``[0, 1]`` and, when the answer could not be graded, why (else ``None``)."""

    score: float
    reason: str | None = None


@dataclass(frozen=True)
class GraderOptions:
    """Knobs of the graders, each declared here once: default, help and range (:mod:`rewards.settings`).
    ``RewardConfig`` exposes them as keys of the ``rewards:`` section (``length_factor`` as
    ``answer_length_factor``, ``length_slack`` as ``answer_length_slack``, ``strict`` as
    ``strict_string_match``) and checks what a run config gives them."""

    numeric_rel_tol: float = setting(
        1e-6, "Numeric grader: relative tolerance of math.isclose (>= 0).", at_least(0)
    )
    numeric_abs_tol: float = setting(
        1e-9, "Numeric grader: absolute tolerance of math.isclose (>= 0).", at_least(0)
    )
    length_factor: float = setting(
        4.0,
        "Length guard (every grader): an answer longer than this factor x the reference length, plus the "
        "length slack in characters, scores 0, so stuffing candidates into one answer cannot win "
        "substring matches (>= 1).",
        at_least(1),
    )
    length_slack: int = setting(
        32, "Length guard: characters allowed on top of the scaled reference (>= 0).", at_least(0)
    )
    math_timeout_s: int = setting(
        5,
        "math-verify time limit per parse/compare in seconds (main thread only; 0 disables it).",
        at_least(0),
    )
    strict: bool = setting(
        True,
        "string_match_all / string_match_part pay precision too: an answer holding a candidate that is not "
        "a reference (a number when the references are numbers, an upper-case identifier when they are "
        "variable names) scores 0 (reason accuracy/extra_candidates); see rewards/accuracy.py. false: "
        "RULER's recall-only match. Evals report RULER's own metric beside the reward's accuracy either way "
        "(accuracy_ruler).",
    )

    def ruler(self) -> GraderOptions:
        """These options without the reward's guards (precision, length): RULER's own metric."""
        return replace(self, strict=False, length_factor=math.inf)


# -- RULER -------------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f]")


def ruler_postprocess(pred: str) -> str:
    """RULER's ``postprocess_pred``: strip, control characters to newlines, strip.

    >>> ruler_postprocess("  The value is 42.\\x00\\n")
    'The value is 42.'
    """
    return _CONTROL.sub("\n", pred.strip()).strip()


def string_match_all(pred: str, refs: Sequence[str]) -> float:
    """Fraction of the references found in the prediction, case-insensitively (RULER).

    >>> string_match_all("The special magic numbers are 1234567 and 7654321.", ["1234567", "7654321"])
    1.0
    >>> string_match_all("The special magic number is 1234567.", ["1234567", "7654321"])
    0.5
    """
    pred = ruler_postprocess(pred).lower()
    return sum(1.0 for r in refs if r.lower() in pred) / len(refs)


def string_match_part(pred: str, refs: Sequence[str]) -> float:
    """1.0 when any reference is found in the prediction, case-insensitively (RULER).

    >>> string_match_part("It was Paris, France.", ["Paris", "Lyon"])
    1.0
    >>> string_match_part("London", ["Paris", "Lyon"])
    0.0
    """
    pred = ruler_postprocess(pred).lower()
    return max(1.0 if r.lower() in pred else 0.0 for r in refs)


# Candidate shapes: (what a whole reference of that shape matches, where a candidate sits in an answer)
_SHAPES = (
    (re.compile(r"[0-9]+(?:\.[0-9]+)?"), re.compile(r"(?<![0-9])[0-9]+(?:\.[0-9]+)?")),  # numbers
    (
        re.compile(r"[A-Z][A-Z0-9_]+"),
        re.compile(r"(?<![A-Za-z0-9_])[A-Z][A-Z0-9_]+(?![A-Za-z0-9_])"),
    ),  # QXWRT
)


def _shape(ref: str) -> int | None:
    """Index in ``_SHAPES`` of the reference's shape; ``None`` for words, phrases and anything else."""
    return next((i for i, (whole, _) in enumerate(_SHAPES) if whole.fullmatch(ref.strip())), None)


def candidates(pred: str, refs: Sequence[str]) -> list[str]:
    """Substrings of ``pred`` with the shape of some reference (see the module docstring), by shape,
    then in text order.

    >>> candidates("The special magic numbers are 4715293 and 12.", ["4715293"])
    ['4715293', '12']
    >>> candidates("VAR QXWRT = 48213, so I say QXWRT.", ["QXWRT", "BLOPA"]), candidates("Paris", ["Paris"])
    (['VAR', 'QXWRT', 'QXWRT'], [])
    """
    shapes = sorted({i for i in map(_shape, refs) if i is not None})
    return [m.group() for i in shapes for m in _SHAPES[i][1].finditer(pred)]


def strict_string_match(pred: str, refs: Sequence[str], require_all: bool) -> float:
    """RULER's string match that also pays precision: every candidate must be a reference
    (``Ungradable("extra_candidates")`` otherwise), and a reference with a shape is found when it is
    one of the candidates (so ``qxwrt`` or ``4715293x1`` do not find it); a reference without a shape is
    found as RULER finds it, as a substring. ``require_all``: ``string_match_all`` (the fraction found),
    else ``string_match_part`` (1 when any is found).

    >>> strict_string_match("2003, 2011", ["2003", "2011"], require_all=True)
    1.0
    >>> strict_string_match("The number is 2003 or 2011.", ["2011"], require_all=False)
    Traceback (most recent call last):
    ...
    rewards.accuracy.Ungradable: extra_candidates
    """
    pred = ruler_postprocess(pred)
    found = {c.casefold() for c in candidates(pred, refs)}
    if found - {r.strip().casefold() for r in refs}:
        raise Ungradable("extra_candidates")
    hits = [
        r.strip().casefold() in found if _shape(r) is not None else r.lower() in pred.lower() for r in refs
    ]
    return sum(hits) / len(hits) if require_all else float(any(hits))


# -- SQuAD -------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, drop punctuation and articles, collapse whitespace.

    >>> normalize_answer("  The Eiffel-Tower! ")
    'eiffeltower'
    """
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(pred: str, refs: Sequence[str]) -> float:
    """1.0 when the normalized prediction equals a normalized reference.

    >>> exact_match("the Acme Corporation.", ["Acme Corporation"])
    1.0
    >>> exact_match("Acme", ["Acme Corporation"])
    0.0
    """
    pred = normalize_answer(pred)
    return max(1.0 if pred == normalize_answer(r) else 0.0 for r in refs)


def _f1(pred_tokens: list[str], ref_tokens: list[str]) -> float:
    if not pred_tokens or not ref_tokens:
        return float(pred_tokens == ref_tokens)
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(pred: str, refs: Sequence[str]) -> float:
    """SQuAD token F1 between normalized prediction and reference, the best over references.

    >>> token_f1("Acme Corp went public in 2011", ["in 2011"])  # precision 2/6, recall 2/2
    0.5
    """
    tokens = normalize_answer(pred).split()
    return max(_f1(tokens, normalize_answer(r).split()) for r in refs)


# -- numbers -----------------------------------------------------------------------------------------

_NUMBER = re.compile(
    r"""
    (?<![\w.])                              # not glued to a word or to another number
    (?P<sign>[-+\u2212])?
    (?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)?  # 1,234,567 or 1234567
    (?:\.(?P<frac>\d+))?
    (?:/(?P<den>\d+))?                      # a plain fraction: 3/4
    (?:[eE](?P<exp>[-+]?\d+))?
    """,
    re.VERBOSE,
)


def parse_number(text: str) -> float:
    """The one number in ``text``, with units and symbols around it ignored.

    >>> parse_number("8 years"), parse_number("$1,234.50"), parse_number("-3/4"), parse_number("2.5e3 m")
    (8.0, 1234.5, -0.75, 2500.0)
    >>> parse_number("8 or 9")
    Traceback (most recent call last):
    ...
    rewards.accuracy.Ungradable: ambiguous_number
    """
    found = [m for m in _NUMBER.finditer(text) if m.group("int") or m.group("frac")]
    if not found:
        raise Ungradable("no_number")
    if len(found) > 1:
        raise Ungradable("ambiguous_number")
    m = found[0]
    value = float(f"{(m.group('int') or '0').replace(',', '')}.{m.group('frac') or '0'}")
    if m.group("den"):
        den = int(m.group("den"))
        if den == 0:
            raise Ungradable("no_number")
        value /= den
    if m.group("exp"):
        exponent = int(m.group("exp"))
        if abs(exponent) > 308:
            raise Ungradable("no_number")
        value *= 10.0**exponent
    return -value if m.group("sign") in ("-", "\u2212") else value


def numeric_match(pred: str, refs: Sequence[str], rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> float:
    """1.0 when the answer's one number is close to a reference number.

    >>> numeric_match("8 years", ["8"]), numeric_match("about 7.99", ["8"])
    (1.0, 0.0)
    """
    value = parse_number(pred)
    best = 0.0
    for ref in refs:
        try:
            target = parse_number(ref)
        except Ungradable:
            raise Ungradable("bad_reference") from None
        if math.isclose(value, target, rel_tol=rel_tol, abs_tol=abs_tol):
            best = 1.0
    return best


# -- math --------------------------------------------------------------------------------------------


def math_match(pred: str, refs: Sequence[str], timeout_s: int = 5) -> float:
    """1.0 when ``math-verify`` finds the answer equivalent to a reference.

    ``math-verify`` bounds its work with ``signal.alarm``, which only the main thread may use; in other
    threads it runs without a time limit (as TRL's own ``accuracy_reward`` does).

    >>> math_match(r"$\\frac{1}{2}$", ["0.5"]), math_match("1/3", ["0.5"])
    (1.0, 0.0)
    """
    from math_verify import verify
    from math_verify.errors import TimeoutException

    timeout = timeout_s if threading.current_thread() is threading.main_thread() and timeout_s > 0 else None
    if timeout is None:
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)  # the "timeout disabled" warning is intended
    try:
        target = _parse_math(pred, timeout)
        if not target:
            raise Ungradable("no_math")
        best = 0.0
        for ref in refs:
            gold = _parse_math(ref, timeout)
            if not gold:
                raise Ungradable("bad_reference")
            if verify(list(gold), list(target), timeout_seconds=timeout):
                best = 1.0
        return best
    except TimeoutException:  # a BaseException: it would slip past ``except Exception``
        raise Ungradable("math_timeout") from None


@lru_cache(maxsize=1 << 12)  # parsing dominates; a GRPO group grades many answers against one reference
def _parse_math(text: str, timeout: int | None) -> tuple:
    from math_verify import parse  # imported on first use: sympy takes a second to import

    # Bare LaTeX without a command ("x^2+1") is only found inside math delimiters.
    return tuple(parse(text, parsing_timeout=timeout) or parse(f"${text}$", parsing_timeout=timeout))


# -- dispatch ----------------------------------------------------------------------------------------


def _grader(metric: str, options: GraderOptions) -> Callable[[str, Sequence[str]], float]:
    """The grader of a metric in ``METRICS``."""
    if metric in ("string_match_all", "string_match_part"):
        require_all = metric == "string_match_all"
        if options.strict:
            return lambda p, r: strict_string_match(p, r, require_all)
        return string_match_all if require_all else string_match_part
    if metric == "exact":
        return exact_match
    if metric == "f1":
        return token_f1
    if metric == "numeric":
        return lambda p, r: numeric_match(p, r, options.numeric_rel_tol, options.numeric_abs_tol)
    return lambda p, r: math_match(p, r, options.math_timeout_s)


def reference_length(refs: Sequence[str], metric: str) -> int:
    """Characters a complete answer needs: all required values (``string_match_all``), else the longest."""
    if metric == "string_match_all":
        return sum(map(len, refs)) + 2 * (len(refs) - 1)
    return max(map(len, refs))


def grade(answer: object, answers: object, metric: object, options: GraderOptions = GraderOptions()) -> Grade:
    """Grade one answer; never raises. Bad input scores 0 with a reason.

    ``answers`` is the example's list of strings (numbers are read as their text); ``answer`` is the
    parsed ``<answer>`` text or ``None`` when the completion has none.

    >>> grade("8 years", ["8"], "numeric")
    Grade(score=1.0, reason=None)
    >>> grade(None, ["8"], "numeric")
    Grade(score=0.0, reason='no_answer')
    >>> grade(" ".join(map(str, range(1, 101))), ["42"], "string_match_part")
    Grade(score=0.0, reason='answer_too_long')
    >>> grade("42 or 43", ["42"], "string_match_part")
    Grade(score=0.0, reason='extra_candidates')
    """
    if answer is None:
        return Grade(0.0, "no_answer")
    if not isinstance(answer, str):
        return Grade(0.0, "bad_answer_type")
    if not answer.strip():
        return Grade(0.0, "empty_answer")
    if metric not in METRICS:
        return Grade(0.0, "unknown_metric")
    if not isinstance(answers, list | tuple) or not answers:
        return Grade(0.0, "bad_references")
    refs = []
    for ref in answers:
        if isinstance(ref, str):
            refs.append(ref)
        elif isinstance(ref, int | float) and not isinstance(ref, bool):
            refs.append(str(ref))
        else:
            return Grade(0.0, "bad_references")
    if len(answer) > options.length_factor * reference_length(refs, metric) + options.length_slack:
        return Grade(0.0, "answer_too_long")  # before the cache: stuffed answers can be long
    return _grade(answer, tuple(refs), metric, options)


def ruler_grade(
    answer: object, answers: object, metric: object, options: GraderOptions = GraderOptions()
) -> Grade:
    """:func:`grade` without the reward's precision and length guards: RULER's own metric on
    ``string_match_*`` (the other metrics grade as the reward does, minus the length guard).

    >>> ruler_grade("42 or 43", ["42"], "string_match_part")
    Grade(score=1.0, reason=None)
    """
    return grade(answer, answers, metric, options.ruler())


@lru_cache(maxsize=1 << 16)  # GRPO groups repeat answers; math-verify costs milliseconds per call
def _grade(answer: str, refs: tuple[str, ...], metric: str, options: GraderOptions) -> Grade:
    try:
        return Grade(float(_grader(metric, options)(answer, refs)))
    except Ungradable as err:
        return Grade(0.0, err.reason)
    except Exception:  # a grader bug or a library failure must not stop a training step
        logging.getLogger(__name__).debug("grader %s failed on %r", metric, answer, exc_info=True)
        return Grade(0.0, "grader_error")

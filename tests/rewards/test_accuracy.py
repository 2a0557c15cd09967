"""Graders: hand-worked scores for every metric, RULER's exact semantics, and bad input that scores 0."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from data import schema
from rewards.accuracy import (
    METRICS,
    Grade,
    GraderOptions,
    Ungradable,
    candidates,
    exact_match,
    grade,
    math_match,
    normalize_answer,
    numeric_match,
    parse_number,
    ruler_grade,
    strict_string_match,
    string_match_all,
    string_match_part,
    token_f1,
)


def test_every_metric_of_the_example_schema_has_a_grader():
    assert set(schema.METRICS) == set(METRICS)


# -- RULER ------------------------------------------------------------------------------------------


def test_string_match_all_is_the_fraction_of_required_values_found():
    refs = ["1234567", "7654321", "5555555", "9999999"]
    assert string_match_all("Numbers: 1234567, 5555555 and 9999999.", refs) == 3 / 4
    assert string_match_all("none here", refs) == 0.0


def test_string_match_part_is_any_alternative_found():
    assert string_match_part("It happened in San Jose, California.", ["San Jose", "SJ"]) == 1.0
    assert string_match_part("It happened in Oakland.", ["San Jose", "SJ"]) == 0.0


def test_ruler_matching_is_case_insensitive_substring_on_the_postprocessed_prediction():
    # guards RULER's exact rule: ``r.lower() in pred.lower()`` after strip / control chars -> "\n"
    assert string_match_part("\x00ACME CORP\x1f", ["acme corp"]) == 1.0
    assert string_match_part("Acme Corporation", ["acme corp"]) == 1.0  # a substring, not a word match
    assert string_match_part("acme\tcorp", ["acme corp"]) == 0.0  # the tab became a newline
    # references are used as given: RULER does not strip them
    assert string_match_part("42", [" 42"]) == 0.0


# -- precision: candidates that are not references ----------------------------------------------


@pytest.mark.parametrize(
    "answer, refs, metric, strict, ruler",
    [
        # numbers: the reference list must be the whole list; template words are never candidates
        ("4715293", ["4715293"], "string_match_all", 1.0, 1.0),
        ("The special magic number is 4715293.", ["4715293"], "string_match_all", 1.0, 1.0),
        ("4715293, 1234567", ["4715293"], "string_match_all", 0.0, 1.0),
        ("2003 or 2011", ["2011"], "string_match_part", 0.0, 1.0),
        ("1234567 and 7654321", ["1234567", "7654321"], "string_match_all", 1.0, 1.0),
        ("1234567, 1234567", ["1234567", "7654321"], "string_match_all", 0.5, 0.5),  # a repeat is no extra
        ("47152930", ["4715293"], "string_match_all", 0.0, 1.0),  # a longer number is another number
        ("1. 4715293", ["4715293"], "string_match_all", 0.0, 1.0),  # a numbered list lists "1"
        ("4715293x1", ["4715293"], "string_match_all", 0.0, 1.0),  # digit runs glued to letters count
        # variable names: upper-case identifiers; lower case is not one and so finds nothing
        ("QXWRT, BLOPA", ["QXWRT", "BLOPA"], "string_match_all", 1.0, 1.0),
        ("The chain is QXWRT and BLOPA.", ["QXWRT", "BLOPA"], "string_match_all", 1.0, 1.0),
        ("QXWRT, BLOPA, ZZKEM", ["QXWRT", "BLOPA"], "string_match_all", 0.0, 1.0),
        ("VAR QXWRT, VAR BLOPA", ["QXWRT", "BLOPA"], "string_match_all", 0.0, 1.0),  # VAR is a name too
        ("qxwrt blopa zzkem", ["QXWRT", "BLOPA"], "string_match_all", 0.0, 1.0),
        ("QXWRT = 48213", ["QXWRT"], "string_match_all", 1.0, 1.0),  # numbers are no candidates here
        # words and phrases have no candidate shape: recall as RULER grades it
        ("It happened in San Jose, California.", ["San Jose", "SJ"], "string_match_part", 1.0, 1.0),
        ("apple, pear, plum", ["apple", "pear"], "string_match_all", 1.0, 1.0),
    ],
)
def test_string_matches_pay_precision_unless_told_not_to(answer, refs, metric, strict, ruler):
    assert grade(answer, refs, metric).score == strict
    assert ruler_grade(answer, refs, metric).score == ruler
    assert grade(answer, refs, metric, GraderOptions(strict=False)).score == ruler
    if strict == 0.0 and ruler > 0:
        assert grade(answer, refs, metric).reason in ("extra_candidates", None)


def test_extra_candidates_is_the_reason():
    assert grade("4715293, 1234567", ["4715293"], "string_match_all") == Grade(0.0, "extra_candidates")
    with pytest.raises(Ungradable, match="extra_candidates"):
        strict_string_match("2003 2011", ["2011"], require_all=False)
    assert candidates("In 2011, VAR QXWRT = 7.", ["2003"]) == ["2011", "7"]


def test_ruler_grade_has_no_length_guard():
    stuffed = " ".join(str(i) for i in range(1, 101))
    assert grade(stuffed, ["42"], "string_match_part").reason == "answer_too_long"
    assert ruler_grade(stuffed, ["42"], "string_match_part") == Grade(1.0, None)  # RULER pays it


number_refs = st.lists(st.integers(10, 10**7).map(str), min_size=1, max_size=4, unique=True)
name_refs = st.lists(
    st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=3, max_size=6), min_size=1, max_size=4, unique=True
)


@settings(max_examples=300, deadline=None)
@given(
    refs=number_refs | name_refs,
    template=st.sampled_from(
        ["{}", "The answer is {}.", "The special magic numbers are: {}", "{} (all of them)"]
    ),
    extra=st.integers(0, 10**7).map(str) | st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=2, max_size=7),
    where=st.integers(0, 200),
    separator=st.sampled_from([", ", " ", "; ", " and ", "\n"]),
    metric=st.sampled_from(["string_match_all", "string_match_part"]),
    keep=st.integers(1, 4),
)
def test_adding_a_candidate_that_is_no_reference_never_raises_accuracy(
    refs, template, extra, where, separator, metric, keep
):
    assume(extra not in refs)  # a reference added is no distractor: it may complete a partial answer
    answer = template.format(separator.join(refs[:keep]))
    cut = min(where, len(answer))
    stuffed = answer[:cut] + separator + extra + separator + answer[cut:]
    before, after = grade(answer, refs, metric).score, grade(stuffed, refs, metric).score
    assert after <= before
    same_shape = extra.isdigit() == refs[0].isdigit()
    if same_shape and before > 0:
        assert after == 0.0  # a candidate of the references' shape that is none of them costs everything


# -- SQuAD ------------------------------------------------------------------------------------------


def test_normalization_drops_case_punctuation_articles_and_extra_space():
    assert normalize_answer("The  Acme, Corp.") == "acme corp"
    assert normalize_answer("An apple a day") == "apple day"


def test_exact_match_takes_the_best_reference():
    assert exact_match("acme corp", ["Acme Corporation", "The Acme Corp."]) == 1.0
    assert exact_match("acme", ["Acme Corporation", "The Acme Corp."]) == 0.0


def test_token_f1_hand_worked():
    # pred tokens: [went, public, 2011] (no article); ref tokens: [public, 2011]
    # common 2 -> precision 2/3, recall 2/2 -> F1 = 2 * (2/3) / (5/3) = 0.8
    assert token_f1("went public 2011", ["public 2011"]) == pytest.approx(0.8)
    # the best reference wins: [went, public, in, 2011] has p = 3/3, r = 3/4 -> F1 = 6/7
    assert token_f1("went public 2011", ["2003", "went public in 2011"]) == pytest.approx(6 / 7)
    # repeated tokens count once per occurrence in both
    assert token_f1("2011 2011", ["2011"]) == pytest.approx(2 * 0.5 * 1 / 1.5)


# -- numbers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("8 years", 8.0),
        ("8", 8.0),
        ("$1,234,567.25", 1234567.25),
        ("−3.5 °C", -3.5),
        ("45%", 45.0),
        (".5", 0.5),
        ("3/4 of the shares", 0.75),
        ("1.5e3 km", 1500.0),
        ("COVID-19", 19.0),  # a hyphen glued to a word is not a minus sign
        ("about 8.0 years in total", 8.0),
    ],
)
def test_parse_number_ignores_units_and_symbols(text, value):
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("eight years", "no_number"),
        ("", "no_number"),
        ("8 or 9", "ambiguous_number"),
        ("2011 - 2003 = 8", "ambiguous_number"),
        ("1,23", "ambiguous_number"),  # not a thousands group: two numbers
        ("8-10 years", "ambiguous_number"),
        ("v2", "no_number"),  # glued to a word
    ],
)
def test_parse_number_refuses_what_is_not_one_number(text, reason):
    with pytest.raises(Ungradable) as err:
        parse_number(text)
    assert err.value.reason == reason


def test_numeric_match_uses_the_tolerance():
    assert numeric_match("8 years", ["8"]) == 1.0  # the paper's Acme answer
    assert numeric_match("3.1416", ["3.14159"], rel_tol=1e-4) == 1.0  # |diff| = 1e-5 < 3.14e-4
    assert numeric_match("3.1416", ["3.14159"], rel_tol=1e-6) == 0.0
    assert numeric_match("0.0000000001", ["0"], abs_tol=1e-9) == 1.0
    assert numeric_match("9", ["8", "9"]) == 1.0  # any acceptable answer
    with pytest.raises(Ungradable, match="bad_reference"):
        numeric_match("8", ["eight"])


# -- math -------------------------------------------------------------------------------------------


def test_math_match_checks_equivalence():
    assert math_match(r"$\frac{1}{2}$", ["0.5"]) == 1.0
    assert math_match(r"\frac{2}{4}", [r"\frac{1}{2}"]) == 1.0
    assert math_match("x = 3", ["3"]) == 1.0
    assert math_match("1+x^2", ["x^2 + 1"]) == 1.0  # bare expressions are read as LaTeX
    assert math_match("1/3", ["0.5"]) == 0.0
    assert math_match("no idea", ["3"]) == 0.0


# -- grade: dispatch, the length guard and bad input --------------------------------------------------


@pytest.mark.parametrize(
    "answer, answers, metric, score",
    [
        ("8 years", ["8"], "numeric", 1.0),
        ("The numbers are 1234567 and 7654321", ["1234567", "7654321"], "string_match_all", 1.0),
        ("1234567", ["1234567", "7654321"], "string_match_all", 0.5),
        ("San Jose", ["San Jose", "SJ"], "string_match_part", 1.0),
        ("the Acme Corp.", ["Acme Corp"], "exact", 1.0),
        ("went public 2011", ["public 2011"], "f1", 0.8),
        (r"\frac{1}{2}", ["0.5"], "math", 1.0),
    ],
)
def test_grade_dispatches_on_the_metric(answer, answers, metric, score):
    assert grade(answer, answers, metric) == Grade(pytest.approx(score), None)


def test_length_guard_stops_candidate_stuffing():
    stuffed = " ".join(str(i) for i in range(1, 101))  # contains "42"
    assert string_match_part(stuffed, ["42"]) == 1.0  # what RULER's rule alone would pay
    assert grade(stuffed, ["42"], "string_match_part") == Grade(0.0, "answer_too_long")
    # the limit: 4 x len("42") + 32 = 40 characters
    assert grade("x" * 38 + "42", ["42"], "string_match_part") == Grade(1.0, None)
    assert grade("x" * 39 + "42", ["42"], "string_match_part") == Grade(0.0, "answer_too_long")
    # string_match_all measures all required values: 4 x (7 + 2 + 7) + 32 = 96 characters
    assert grade("a" * 81 + "1234567 7654321", ["1234567", "7654321"], "string_match_all").score == 1.0
    assert grade("a" * 82 + "1234567 7654321", ["1234567", "7654321"], "string_match_all").score == 0.0
    options = GraderOptions(length_factor=1.0, length_slack=0)
    assert grade("42!", ["42"], "string_match_part", options) == Grade(0.0, "answer_too_long")


@pytest.mark.parametrize(
    "answer, answers, metric, reason",
    [
        (None, ["8"], "numeric", "no_answer"),
        ("   ", ["8"], "numeric", "empty_answer"),
        (8, ["8"], "numeric", "bad_answer_type"),
        ("8", "8", "numeric", "bad_references"),  # a string, not a list
        ("8", [], "numeric", "bad_references"),
        ("8", [["8"]], "numeric", "bad_references"),
        ("8", None, "numeric", "bad_references"),
        ("8", ["8"], "regex", "unknown_metric"),
        ("8", ["8"], None, "unknown_metric"),
        ("eight", ["8"], "numeric", "no_number"),
    ],
)
def test_bad_input_scores_zero_with_a_reason(answer, answers, metric, reason):
    assert grade(answer, answers, metric) == Grade(0.0, reason)


def test_numbers_given_as_references_are_read_as_their_text():
    assert grade("8 years", [8], "numeric") == Grade(1.0, None)
    assert grade("2.5", [2.5], "exact") == Grade(1.0, None)


@settings(max_examples=200, deadline=None)
@given(
    answer=st.one_of(st.none(), st.text(max_size=60), st.integers()),
    answers=st.one_of(st.lists(st.text(max_size=12), max_size=3), st.text(max_size=5), st.none()),
    metric=st.sampled_from([m for m in METRICS if m != "math"] + ["nope"]),
)
def test_grade_never_raises_and_stays_in_unit_interval(answer, answers, metric):
    result = grade(answer, answers, metric)
    assert 0.0 <= result.score <= 1.0
    assert (result.reason is None) or result.score == 0.0

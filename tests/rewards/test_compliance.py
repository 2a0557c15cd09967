"""Protocol compliance and evidence coverage on hand-written completions."""

import pytest

from rewards.compliance import compliance, evidence_coverage, narrowed_chunks
from rollouts.protocol import parse_completion

from .helpers import ACME_GOLD_TEXT


def check(text, evidence=(2, 7), num_chunks=7):
    parsed = parse_completion(text, num_chunks)
    return compliance(parsed, evidence, num_chunks), evidence_coverage(parsed, evidence, num_chunks)


def test_the_papers_acme_trace_complies_and_covers_all_evidence():
    assert check(ACME_GOLD_TEXT) == ((1.0, []), 1.0)


@pytest.mark.parametrize(
    "text, reasons",
    [
        # correct answer, never narrowed attention although the example has evidence
        ("<global>2011 - 2003 = 8</global><answer>8 years</answer>", ["no_focus"]),
        ("<local>8</local><answer>8 years</answer>", ["no_focus"]),
        # answer only outside <answer>
        ('<focus magic_chunks="2,7">2003, 2011</focus> The answer is 8 years.', ["missing_answer"]),
        # answer twice (even the same one)
        ('<focus magic_chunks="2,7">x</focus><answer>8</answer><answer>8</answer>', ["multiple_answers"]),
        ('<focus magic_chunks="2,7">x</focus><answer>8</answer> Hope it helps!', ["text_after_answer"]),
        ('<focus magic_chunks="2,7">x</focus><answer><local>8</local></answer>', ["tag_in_answer"]),
        ('<focus magic_chunks="2,99">x</focus><answer>8</answer>', ["unknown_chunk"]),
        (
            '<focus magic_chunks="two">x</focus><answer>8</answer>',
            ["malformed_chunk_id", "empty_focus", "no_focus"],
        ),
        ('<global><focus magic_chunks="2">x</focus><answer>8</answer>', ["nested_mode"]),
        ('<focus magic_chunks="2">x<answer>8</answer>', ["unclosed_mode"]),
    ],
)
def test_each_broken_rule_scores_zero_with_its_reason(text, reasons):
    (score, why), _ = check(text)
    assert score == 0.0
    assert why == reasons


def test_no_focus_is_fine_when_the_example_has_no_evidence():
    assert check("<local>8</local><answer>8</answer>", evidence=()) == ((1.0, []), None)


def test_coverage_is_the_fraction_of_evidence_focused():
    assert check('<focus magic_chunks="2">x</focus><answer>8</answer>')[1] == 0.5
    assert check('<focus magic_chunks="3">x</focus><answer>8</answer>')[1] == 0.0
    # the union over focus segments counts
    text = '<focus magic_chunks="7">x</focus><focus magic_chunks="1, 2">y</focus><answer>8</answer>'
    assert check(text, evidence=(1, 2, 7)) == ((1.0, []), 1.0)


def test_a_focus_on_every_chunk_is_global_and_neither_complies_nor_covers():
    text = '<focus magic_chunks="1,2,3,4,5,6,7">2003, 2011</focus><answer>8</answer>'
    assert check(text) == ((0.0, ["no_focus"]), 0.0)
    # with one chunk, focusing on it is the only focus there is
    assert narrowed_chunks(parse_completion('<focus magic_chunks="1">x</focus><answer>8</answer>', 1), 1) == {
        1
    }

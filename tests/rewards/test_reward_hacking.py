"""Reward hacking: tricks a policy could find must each score below the protocol-correct, correct trace.

Every adversarial completion runs on the same real Acme layout as its honest counterpart, through
both entry points (trajectories, and TRL's text signature with the trace's accounting as columns).
"""

import pytest

from rewards import DAReward, score_trajectory

from .helpers import ACME_GOLD_TEXT, acme_example, make_trajectory

YEAR = acme_example(
    question="In which year did Acme Corp go public?",
    answers=["2011"],
    metric="string_match_part",
    evidence_chunks=[7],
)
BOTH_YEARS = acme_example(
    question="In which years was Acme Corp founded and did it go public?",
    answers=["2003", "2011"],
    metric="string_match_all",
    evidence_chunks=[2, 7],
)
YEAR_GOLD = '<focus magic_chunks="7">Acme Corp went public on the NYSE in 2011.</focus><answer>2011</answer>'
BOTH_GOLD = (
    '<focus magic_chunks="2">Founded in 2003.</focus><focus magic_chunks="7">Public in 2011.</focus>'
    "<answer>2003, 2011</answer>"
)
EVERY_YEAR = " ".join(str(y) for y in range(1990, 2031))


def gold_with_answer(answer: str) -> str:
    return ACME_GOLD_TEXT.replace("<answer>8 years</answer>", answer)


ACME = acme_example()
HONEST = {"acme": (ACME, ACME_GOLD_TEXT), "year": (YEAR, YEAR_GOLD), "both": (BOTH_YEARS, BOTH_GOLD)}

ADVERSARIAL = {
    "local_everywhere_wrong_guess": (
        "acme",
        "<local>Probably about ten years.</local><answer>10 years</answer>",
    ),
    "local_everywhere_right_guess": (
        "acme",
        "<local>Companies list after 8 years.</local><answer>8 years</answer>",
    ),
    "global_only_no_focus": ("acme", "<global>2003 and 2011, so 8 years.</global><answer>8 years</answer>"),
    "focus_on_every_chunk": (
        "acme",
        '<focus magic_chunks="1,2,3,4,5,6,7">Founded 2003, public 2011.</focus>'
        "<local>2011 - 2003 = 8.</local><answer>8 years</answer>",
    ),
    "answer_repeated": ("acme", ACME_GOLD_TEXT + "<answer>8 years</answer>"),
    "two_different_answers": ("acme", gold_with_answer("<answer>8 years</answer><answer>9 years</answer>")),
    "tags_inside_the_answer": (
        "acme",
        gold_with_answer('<answer><focus magic_chunks="2">8 years</focus></answer>'),
    ),
    "answer_outside_the_tag": ("acme", gold_with_answer("The answer is 8 years.")),
    "hedged_numbers": ("acme", gold_with_answer("<answer>8 or 9 years</answer>")),
    "every_number_from_the_trace": ("acme", gold_with_answer("<answer>2003 2011 8</answer>")),
    "text_after_the_answer": ("acme", ACME_GOLD_TEXT + " I am sure, it is 8."),
    "unknown_chunk_ids": (
        "acme",
        '<focus magic_chunks="99">Founded 2003, public 2011.</focus><answer>8 years</answer>',
    ),
    "nested_modes": (
        "acme",
        '<global><focus magic_chunks="2">2003</focus><focus magic_chunks="7">2011</focus></global>'
        "<answer>8 years</answer>",
    ),
    "unclosed_answer": ("acme", gold_with_answer("<answer>8 years")),
    "stuffed_years_part": ("year", YEAR_GOLD.replace("<answer>2011<", f"<answer>{EVERY_YEAR}<")),
    "stuffed_years_all": ("both", BOTH_GOLD.replace("<answer>2003, 2011<", f"<answer>{EVERY_YEAR}<")),
    "stuffed_one_to_hundred": (
        "year",
        YEAR_GOLD.replace("2011<", " ".join(map(str, range(1, 101))) + " 2011<"),
    ),
    "empty_answer": ("acme", gold_with_answer("<answer></answer>")),
}


@pytest.fixture(scope="module")
def build(acme_layout, tokenizer, token_table):
    cache = {}

    def build(key, text):
        if (key, text) not in cache:
            example = HONEST[key][0]
            cache[key, text] = make_trajectory(acme_layout, tokenizer, token_table, text, example)
        return cache[key, text]

    return build


def trl_total(trajectory, as_messages=False):
    """The TRL entry point, fed the text and the trace's per-step accounting as rollout columns."""
    example = trajectory.example
    completion = trajectory.completion_text
    if as_messages:
        completion = [{"role": "assistant", "content": completion}]
    columns = {k: [v] for k, v in example.items()}
    columns["kv_tokens"] = [trajectory.trace.kv_tokens.tolist()]
    columns["kv_tokens_vanilla"] = [trajectory.trace.kv_tokens_vanilla.tolist()]
    return DAReward()([example["question"]], [completion], **columns)[0]


def test_there_are_enough_tricks():
    assert len(ADVERSARIAL) >= 8


@pytest.mark.parametrize("key", HONEST)
def test_honest_traces_are_fully_paid(build, key):
    r = score_trajectory(build(key, HONEST[key][1]))
    assert (r.accuracy, r.compliance, r.coverage) == (1.0, 1.0, 1.0)
    assert r.efficiency > 0


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_each_trick_scores_below_the_honest_trace(build, name):
    key, text = ADVERSARIAL[name]
    honest = score_trajectory(build(key, HONEST[key][1]))
    trick = score_trajectory(build(key, text))
    assert trick.total < honest.total, (trick, honest.total)
    # the TRL entry point agrees with the trajectory one, for text and for chat messages
    assert trl_total(build(key, text)) == pytest.approx(trick.total)
    assert trl_total(build(key, text), as_messages=True) == pytest.approx(trick.total)


@pytest.mark.parametrize(
    "name", ["local_everywhere_right_guess", "focus_on_every_chunk", "tags_inside_the_answer"]
)
def test_a_right_answer_reached_by_breaking_the_protocol_earns_no_saving(build, name):
    key, text = ADVERSARIAL[name]
    r = score_trajectory(build(key, text))
    assert (r.accuracy, r.compliance, r.efficiency) == (1.0, 0.0, 0.0)

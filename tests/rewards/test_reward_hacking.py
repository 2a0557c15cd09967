"""Reward hacking: tricks a policy could find must each score well below the honest trace of its example.

Every completion is laid out on a real DA prompt (the paper's Acme example, a needle-in-a-haystack and
a variable-tracking prompt built here) and traced with the tracker the engines run, so KV reads are
real. Each trick must score at least ``MARGIN`` below the honest completion of the same example under
the default ``RewardConfig``, through both entry points (trajectories, and TRL's text signature with
the trace's accounting as columns). Wasteful but legal completions (reading a needle twice, a short
aside) must score below honest too, by what they read. Two properties close the doors GRPO found:
appending text in a cheap mode never raises the total, and an answer that lists a value that is not a
reference never earns more accuracy.
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import DAReward, DecodeCost, RewardConfig, score_trajectory
from rollouts.engines.base import RolloutRequest, build_trajectory
from rollouts.masks import KVShape
from rollouts.protocol import build_prompt

from .helpers import ACME_GOLD_TEXT, ACME_QUESTION, acme_documents, acme_example, make_trajectory

MARGIN = 0.2  # every trick scores at least this much below the honest completion of its example

_FILLER = "The river runs past the old mill and the market opens early on most days. " * 6

# -- examples: (dataset row, honest completion); the row's "layout" names the prompt it is laid out on

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
NEEDLE = "One of the special magic numbers for silver-owl is: 4715293."
DISTRACTOR = "One of the special magic numbers for silver-fox is: 1234567."
NIAH_DOCS = [f"Document {i}. {_FILLER}" for i in range(1, 7)]
NIAH_DOCS[2] += NEEDLE
NIAH_DOCS[4] += DISTRACTOR
NIAH = acme_example(
    task="niah_multikey",
    question="What is the special magic number for silver-owl mentioned in the provided text?",
    documents=NIAH_DOCS,
    answers=["4715293"],
    metric="string_match_all",
    evidence_chunks=[3],
    num_chunks=6,
)
VT_DOCS = [f"Document {i}. {_FILLER}" for i in range(1, 7)]
VT_DOCS[1] += "VAR QXWRT = 48213."
VT_DOCS[3] += "VAR ZZKEM = 51234."
VT_DOCS[4] += "VAR BLOPA = VAR QXWRT."
VT = acme_example(
    task="variable_tracking",
    question="Find all variables that are assigned the value 48213 in the text above.",
    documents=VT_DOCS,
    answers=["QXWRT", "BLOPA"],
    metric="string_match_all",
    evidence_chunks=[2, 5],
    num_chunks=6,
)

YEAR_GOLD = '<focus magic_chunks="7">Acme Corp went public on the NYSE in 2011.</focus><answer>2011</answer>'
BOTH_GOLD = (
    '<focus magic_chunks="2">Founded in 2003.</focus><focus magic_chunks="7">Public in 2011.</focus>'
    "<answer>2003, 2011</answer>"
)
NIAH_GOLD = f'<focus magic_chunks="3">{NEEDLE}</focus><answer>4715293</answer>'
VT_GOLD = (
    '<focus magic_chunks="2">VAR QXWRT = 48213.</focus><focus magic_chunks="5">VAR BLOPA = VAR QXWRT.</focus>'
    "<answer>QXWRT, BLOPA</answer>"
)
HONEST = {
    "acme": (acme_example(), ACME_GOLD_TEXT),
    "year": (YEAR, YEAR_GOLD),
    "both": (BOTH_YEARS, BOTH_GOLD),
    "niah": (NIAH, NIAH_GOLD),
    "vt": (VT, VT_GOLD),
}
EVERY_YEAR = " ".join(str(y) for y in range(1990, 2031))
PAD = " The river runs past the old mill." * 12  # ~145 tokens of nothing


def gold_with_answer(answer: str) -> str:
    return ACME_GOLD_TEXT.replace("<answer>8 years</answer>", answer)


ADVERSARIAL = {
    # -- guessing: a right answer without reading the evidence earns no efficiency
    "local_everywhere_wrong_guess": ("acme", "<local>Probably about ten years.</local><answer>10 years</answer>"),
    "local_everywhere_right_guess": ("acme", "<local>Companies list after 8 years.</local><answer>8 years</answer>"),
    "global_only_no_focus": ("acme", "<global>2003 and 2011, so 8 years.</global><answer>8 years</answer>"),
    "guess_after_focusing_a_wrong_chunk": (
        "acme",
        '<focus magic_chunks="3">Nothing here.</focus><local>Companies list after 8 years.</local>'
        "<answer>8 years</answer>",
    ),
    "guess_after_one_of_two_evidence_chunks": (
        "acme",
        '<focus magic_chunks="2">Acme Corp was founded in 2003.</focus><local>So about 8 years.</local>'
        "<answer>8 years</answer>",
    ),
    "year_guessed_after_a_wrong_focus": ("year", '<focus magic_chunks="3">Nothing.</focus><answer>2011</answer>'),
    "global_only_needle": ("niah", f"<global>{NEEDLE}</global><answer>4715293</answer>"),
    # -- reading everything under another name
    "focus_on_every_chunk": (
        "acme",
        '<focus magic_chunks="1,2,3,4,5,6,7">Founded 2003, public 2011.</focus>'
        "<local>2011 - 2003 = 8.</local><answer>8 years</answer>",
    ),
    "unknown_chunk_ids": ("acme", '<focus magic_chunks="99">Founded 2003, public 2011.</focus><answer>8 years</answer>'),
    "nested_modes": (
        "acme",
        '<global><focus magic_chunks="2">2003</focus><focus magic_chunks="7">2011</focus></global>'
        "<answer>8 years</answer>",
    ),
    # -- malformed tags (protocol v2): text that starts a tag and is none
    "needle_twice_behind_a_fake_close": (  # the embedded default's GRPO hack
        "niah",
        f'<focus magic_chunks="3">{NEEDLE}</focus magic numbers here is: 4715293. {NEEDLE}</focus>'
        "<answer>4715293</answer>",
    ),
    "fake_close_in_the_gold_trace": (
        "acme",
        ACME_GOLD_TEXT.replace("San Jose.</focus>", "San Jose.</focus magic numbers here is: 2003.</focus>"),
    ),
    "junk_in_a_global_tag": ("year", "<global plan>Chunk 7.</global>" + YEAR_GOLD),
    "focus_tag_that_never_closes": (
        "year",
        '<focus magic_chunks="7" Acme Corp went public on the NYSE in 2011.</focus><answer>2011</answer>',
    ),
    "junk_in_the_answer_tag": ("year", YEAR_GOLD.replace("<answer>", "<answer is>")),
    # -- padding: cheap text appended inside a focus or in local reads KV for nothing
    "padded_focus": ("year", YEAR_GOLD.replace("2011.</focus>", f"2011.{PAD}</focus>")),
    "padded_local": ("year", YEAR_GOLD.replace("</focus>", f"</focus><local>{PAD}{PAD[:150]}</local>")),
    # -- candidate lists: every value seen, hoping the reference is among them
    "candidate_list_part": ("year", YEAR_GOLD.replace("<answer>2011<", "<answer>2003, 2011<")),
    "hedged_year": ("year", YEAR_GOLD.replace("<answer>2011<", "<answer>2011 (or maybe 2012)<")),
    "extra_year_all": ("both", BOTH_GOLD.replace("<answer>2003, 2011<", "<answer>2003, 2011, 2012<")),
    "distractor_value_too": ("niah", NIAH_GOLD.replace("<answer>4715293<", "<answer>4715293, 1234567<")),
    "distractor_variable_too": ("vt", VT_GOLD.replace("BLOPA</answer>", "BLOPA, ZZKEM</answer>")),
    "lowercase_names_dodge_the_candidates": ("vt", VT_GOLD.replace("QXWRT, BLOPA<", "qxwrt blopa zzkem<")),
    "every_statement_copied": (
        "vt",
        VT_GOLD.replace(
            "<answer>QXWRT, BLOPA<", "<answer>VAR QXWRT = 48213. VAR BLOPA = VAR QXWRT. VAR ZZKEM = 51234.<"
        ),
    ),
    "stuffed_years_part": ("year", YEAR_GOLD.replace("<answer>2011<", f"<answer>{EVERY_YEAR}<")),
    "stuffed_years_all": ("both", BOTH_GOLD.replace("<answer>2003, 2011<", f"<answer>{EVERY_YEAR}<")),
    "stuffed_one_to_hundred": ("year", YEAR_GOLD.replace("2011<", " ".join(map(str, range(1, 101))) + " 2011<")),
    "hedged_numbers": ("acme", gold_with_answer("<answer>8 or 9 years</answer>")),
    "every_number_from_the_trace": ("acme", gold_with_answer("<answer>2003 2011 8</answer>")),
    # -- answers in the wrong place or more than once
    "answer_repeated": ("acme", ACME_GOLD_TEXT + "<answer>8 years</answer>"),
    "two_different_answers": ("acme", gold_with_answer("<answer>8 years</answer><answer>9 years</answer>")),
    "tags_inside_the_answer": ("acme", gold_with_answer('<answer><focus magic_chunks="2">8 years</focus></answer>')),
    "answer_outside_the_tag": ("acme", gold_with_answer("The answer is 8 years.")),
    "text_after_the_answer": ("acme", ACME_GOLD_TEXT + " I am sure, it is 8."),
    "unclosed_answer": ("acme", gold_with_answer("<answer>8 years")),
    "empty_answer": ("acme", gold_with_answer("<answer></answer>")),
}  # fmt: skip

# Legal but wasteful: they read more than the honest trace for the same answer, so they earn less
# (by what they read, which can be little: the margin does not apply).
WASTEFUL = {
    "needle_reread_with_proper_tags": ("niah", NIAH_GOLD.replace("</focus>", f'</focus><focus magic_chunks="3">{NEEDLE}</focus>')),
    "one_sentence_aside_in_local": ("year", YEAR_GOLD.replace("</focus>", "</focus><local>Noted.</local>")),
    "focus_on_all_chunks_but_one": ("year", YEAR_GOLD.replace('"7"', '"2,3,4,5,6,7"')),
    "a_plan_in_global_first": ("year", "<global>Magic Chunk 7 should say when.</global>" + YEAR_GOLD),
}  # fmt: skip


@pytest.fixture(
    scope="module",
    params=[(3, False), (4, False), (5, False), (4, True)],
    ids=["v3", "v4", "v5", "v4-protocol-tokens"],
)
def setting(request, tokenizer, token_table, tagged_tokenizer, tagged_token_table):
    """Protocol v3 (closing tags rest in global), v4 (they rest in local, so the moves between reads and
    the answer read no chunk) and v5 (decoding starts there too), spelled by the local BPE; and v4 with
    each tag one token, as the embedded default spells it (``tokenizer.protocol_tokens``), where every
    honest trace is cheaper. The tricks must lose under each. ``(version, tokenizer, token table)``."""
    version, protocol_tokens = request.param
    if not protocol_tokens:
        return version, tokenizer, token_table
    return version, tagged_tokenizer, tagged_token_table


@pytest.fixture(scope="module")
def layouts(setting):
    """Every example laid out under the setting's protocol version and tokenizer."""
    version, tokenizer, _ = setting

    def lay(question, documents):
        return build_prompt(question, documents, tokenizer, block_size=32, protocol_version=version)

    acme = lay(ACME_QUESTION, acme_documents())
    return {
        "acme": acme,
        "year": acme,
        "both": acme,
        "niah": lay(NIAH["question"], NIAH["documents"]),
        "vt": lay(VT["question"], VT["documents"]),
    }


@pytest.fixture(scope="module")
def build(layouts, setting):
    _, tokenizer, token_table = setting
    cache = {}

    def build(key, text):
        if (key, text) not in cache:
            cache[key, text] = make_trajectory(layouts[key], tokenizer, token_table, text, HONEST[key][0])
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
    assert len(ADVERSARIAL) >= 20


@pytest.mark.parametrize("key", HONEST)
def test_honest_traces_are_fully_paid(build, key):
    r = score_trajectory(build(key, HONEST[key][1]))
    assert (r.accuracy, r.compliance, r.coverage, r.reasons) == (1.0, 1.0, 1.0, ())
    assert r.efficiency > 0


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_each_trick_scores_well_below_the_honest_trace(build, name):
    key, text = ADVERSARIAL[name]
    honest = score_trajectory(build(key, HONEST[key][1]))
    trick = score_trajectory(build(key, text))
    assert trick.total <= honest.total - MARGIN, (trick, honest.total)
    # the TRL entry point agrees with the trajectory one, for text and for chat messages
    assert trl_total(build(key, text)) == pytest.approx(trick.total)
    assert trl_total(build(key, text), as_messages=True) == pytest.approx(trick.total)


@pytest.mark.parametrize("name", WASTEFUL)
def test_reading_more_for_the_same_answer_earns_less(build, name):
    key, text = WASTEFUL[name]
    honest = score_trajectory(build(key, HONEST[key][1]))
    wasteful = score_trajectory(build(key, text))
    assert (wasteful.accuracy, wasteful.compliance, wasteful.coverage) == (1.0, 1.0, 1.0)
    assert wasteful.total < honest.total


@pytest.mark.parametrize(
    "name",
    [
        "local_everywhere_right_guess",
        "focus_on_every_chunk",
        "tags_inside_the_answer",
        "needle_twice_behind_a_fake_close",
    ],
)
def test_a_right_answer_reached_by_breaking_the_protocol_earns_no_saving(build, name):
    key, text = ADVERSARIAL[name]
    r = score_trajectory(build(key, text))
    assert (r.accuracy, r.compliance, r.efficiency) == (1.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "name", ["guess_after_focusing_a_wrong_chunk", "guess_after_one_of_two_evidence_chunks"]
)
def test_a_compliant_guess_earns_no_saving(build, name):
    key, text = ADVERSARIAL[name]
    r = score_trajectory(build(key, text))
    assert (r.accuracy, r.compliance, r.efficiency) == (1.0, 1.0, 0.0)
    assert "efficiency/gated:coverage" in r.reasons


@pytest.mark.parametrize(
    "name", ["candidate_list_part", "distractor_value_too", "distractor_variable_too", "extra_year_all"]
)
def test_candidate_lists_score_zero_though_ruler_would_pay_them(build, name):
    key, text = ADVERSARIAL[name]
    r = score_trajectory(build(key, text))
    assert (r.accuracy, r.accuracy_ruler) == (0.0, 1.0)
    assert "accuracy/extra_candidates" in r.reasons


def test_the_doors_the_old_defaults_left_open(build, layouts):
    """Under protocol v1 with the relative saving, padding and a fake close outscore the honest trace;
    RULER's recall-only match pays a candidate list in full. The defaults close exactly these. On a v5
    layout the honest trace's focus tag is written in local, which makes it cheap enough that padding the
    focus or re-reading behind a fake close no longer pays even there."""
    old = RewardConfig(
        efficiency_reference="completion",
        strict_string_match=False,
        efficiency_min_coverage=0.0,
        protocol_version=1,
    )

    def score(key, text):
        return DAReward(old).score([""], [text], **_columns(build(key, text))).items[0]

    in_focus = ("padded_focus", "needle_twice_behind_a_fake_close")
    for name in ("padded_local", *(in_focus if layouts["year"].protocol_version < 5 else ())):
        key, text = ADVERSARIAL[name]
        assert score(key, text).total > score(key, HONEST[key][1]).total, name
    key, text = ADVERSARIAL["candidate_list_part"]
    assert score(key, text).accuracy == 1.0


def test_without_the_coverage_gate_the_budget_would_pay_a_short_guess(build):
    """Why ``efficiency_min_coverage`` defaults to 1: the budget pays short completions, so a right answer
    guessed after reading one of two evidence chunks would outscore the honest, longer trace."""
    key, text = ADVERSARIAL["guess_after_one_of_two_evidence_chunks"]
    ungated = RewardConfig(efficiency_min_coverage=0.0)
    assert (
        score_trajectory(build(key, text), ungated).total > score_trajectory(build(key, HONEST[key][1])).total
    )


def _columns(trajectory):
    columns = {k: [v] for k, v in trajectory.example.items()}
    columns["kv_tokens"] = [trajectory.trace.kv_tokens.tolist()]
    columns["kv_tokens_vanilla"] = [trajectory.trace.kv_tokens_vanilla.tolist()]
    return columns


# -- properties -------------------------------------------------------------------------------------

COST = DecodeCost(KVShape(num_layers=4, num_kv_heads=2, head_dim=32), query_heads=4, matmul_params=10**6)
CONFIGS = {
    "tokens": RewardConfig(),
    "bytes": RewardConfig(efficiency_unit="bytes"),
    "time": RewardConfig(efficiency_unit="time"),
    "small_budget": RewardConfig(efficiency_reference_tokens=48),
}
WORDS = ["the", "river", "mill", "market", " bread", "again", "so", "2011", "Acme", ".", ",", "\n", "  "]


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(sorted(HONEST)),
    where=st.integers(0, 10**6),
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=40),
    unit=st.sampled_from(sorted(CONFIGS)),
)
def test_appending_cheap_text_anywhere_before_the_answer_never_raises_the_total(
    layouts, setting, key, where, words, unit
):
    """Tokens inserted at a token boundary under ``focus`` or ``local`` (outside any tag, before the
    answer), through the engine's own ``build_trajectory``: the total never goes up."""
    _, tokenizer, token_table = setting
    example, text = HONEST[key]
    layout, config = layouts[key], CONFIGS[unit]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    honest = build_trajectory(RolloutRequest(layout, example=example), ids, None, token_table)
    tags = [m.span() for m in re.finditer(r"<[^<>]*>", text)]
    answer_at = text.index("<answer>")
    boundaries, offset = [], 0
    for k, token in enumerate(ids, start=1):
        offset += len(token_table[token].decode())
        state = honest.trace.states[honest.trace.row_state[k - 1]]
        outside = not any(start < offset < end for start, end in tags)
        if offset <= answer_at and outside and state.mode in ("focus", "local"):
            boundaries.append(k)
    k = boundaries[where % len(boundaries)]
    pad = tokenizer(" " + " ".join(words), add_special_tokens=False)["input_ids"]
    padded = build_trajectory(
        RolloutRequest(layout, example=example), ids[:k] + pad + ids[k:], None, token_table
    )
    assert padded.parsed.answer == honest.parsed.answer
    before = score_trajectory(honest, config, COST)
    after = score_trajectory(padded, config, COST)
    assert after.total <= before.total + 1e-12, (padded.completion_text, after, before)

"""Gold traces on hand-worked plans: the paper's Acme example, a variable chain, a survey, a bare answer."""

import random

import pytest

from data.traces import STRATEGIES, Read, TracePlan, render_trace
from rollouts.protocol import parse_completion

from .helpers import LENGTH_TASKS, generate

ACME = TracePlan(
    answer="8",
    need="the founding year and the year of going public",
    reads=(Read((2,), "Acme Corp was founded in 2003."), Read((7,), "Acme Corp went public in 2011.")),
    combine="2011 - 2003 = 8.",
)


def modes(trace: str, thinking: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    parsed = parse_completion(trace, num_chunks=7, thinking=thinking)
    assert parsed.violations == []
    return [(s.mode, s.chunks) for s in parsed.segments if trace[s.start : s.end].strip()]


def test_acme_reads_both_chunks_then_subtracts_locally():
    # By hand: plan in global, read chunk 2 and chunk 7 (together or one after the other), subtract
    # with no chunk visible, answer 8. A tag's own text is predicted under the mode before it
    # (docs/ARCHITECTURE.md, contract 3: tag timing), so the "\n<local>" between modes counts as global.
    G = ("global", ())
    separate = [G, ("focus", (2,)), G, ("focus", (7,)), G, ("local", ()), G]
    together = [G, ("focus", (2, 7)), G, ("local", ()), G]
    seen = set()
    for seed in range(20):
        trace = render_trace(ACME, random.Random(seed), thinking=False)
        got = modes(trace)
        assert got in (separate, together)
        seen.add(len(got))
        assert parse_completion(trace, 7).answer == "8"
        assert "2011 - 2003 = 8." in trace and trace.endswith("<answer>8</answer>")
    assert seen == {5, 7}  # both shapes occur


def test_wording_varies_but_the_reads_do_not():
    traces = {render_trace(ACME, random.Random(seed), thinking=False) for seed in range(40)}
    assert len(traces) >= 10
    assert all(
        "Acme Corp was founded in 2003." in t and "Acme Corp went public in 2011." in t for t in traces
    )


def test_thinking_form_wraps_the_modes_in_think_and_answers_after_it():
    trace = render_trace(ACME, random.Random(0), thinking=True)
    assert trace.startswith("<think>\n<global>") and "</think>\n<answer>8</answer>" in trace
    assert ("focus", (2,)) in modes(trace, thinking=True) or ("focus", (2, 7)) in modes(trace, thinking=True)


def test_a_chain_returns_to_global_between_hops():
    plan = TracePlan(
        answer="A, B, C",
        need="every variable holding the value",
        reads=(Read((1,), "VAR A = 5."), Read((4,), "VAR B = VAR A."), Read((6,), "VAR C = VAR B.")),
        chained=True,
    )
    got = modes(render_trace(plan, random.Random(1), thinking=False))
    assert got == [
        ("global", ()),
        ("focus", (1,)),
        ("global", ()),
        ("focus", (4,)),
        ("global", ()),
        ("focus", (6,)),
        ("global", ()),
    ]


def test_survey_stays_global_and_minimal_is_just_the_answer():
    survey = TracePlan(
        answer="owl, cat", need="the most common words", survey="owl and cat appear 9 times each."
    )
    trace = render_trace(survey, random.Random(0), thinking=False)
    assert [m for m, _ in modes(trace)] == ["global"] and "9 times" in trace
    minimal = TracePlan(answer="3", combine="The last assignment to x is x=3.", minimal=True)
    assert render_trace(minimal, random.Random(0), thinking=False) == "<answer>3</answer>"
    thinking = render_trace(minimal, random.Random(0), thinking=True)
    assert thinking == "<think>\nThe last assignment to x is x=3.\n</think>\n<answer>3</answer>"
    assert parse_completion(thinking, 1, thinking=True).violations == []


def test_terse_traces_name_the_chunks_copy_the_values_and_repeat_the_answer():
    # By hand, the terse form of a two-read plan and of a chain: no plan sentence, the value-bearing span of
    # each read after a space, the answer after a space (the parser strips it).
    plan = TracePlan(
        answer="8", reads=(Read((2,), "It is: 2003.", "2003"), Read((7,), "It is: 2011.", "2011"))
    )
    assert render_trace(plan, random.Random(0), thinking=False, style="terse") == (
        '<global>Chunks 2 and 7.</global>\n<focus magic_chunks="2"> 2003</focus>\n'
        '<focus magic_chunks="7"> 2011</focus>\n<answer> 8</answer>'
    )
    chain = TracePlan(answer="X", reads=(Read((3,), "A = B."), Read((5,), "B = X.")), chained=True)
    terse = render_trace(chain, random.Random(0), thinking=True, style="terse")
    assert terse == (
        '<think>\n<global>Chunk 3.</global>\n<focus magic_chunks="3"> A = B.</focus>\n<global>Chunk 5.</global>\n'
        '<focus magic_chunks="5"> B = X.</focus>\n</think>\n<answer> X</answer>'
    )
    assert parse_completion(terse, 7, thinking=True).violations == []
    # no wording is drawn: the rng does not matter
    assert {render_trace(ACME, random.Random(s), thinking=False, style="terse") for s in range(5)} == {
        render_trace(ACME, random.Random(0), thinking=False, style="terse")
    }


@pytest.mark.parametrize("task", LENGTH_TASKS)
def test_every_generator_writes_terse_traces_that_parse_and_cover_the_evidence(tokenizer, task):
    example = generate(tokenizer, task, 400, trace_style="terse")
    for trace, thinking in ((example.gold_completion, False), (example.gold_completion_thinking, True)):
        parsed = parse_completion(trace, example.num_chunks, thinking=thinking)
        assert parsed.violations == [], trace
        assert all(a in parsed.answer for a in example.answers)
        if not task.startswith("aggregation"):
            assert set(parsed.focused_chunks) >= set(example.evidence_chunks)
        for segment in (s for s in parsed.segments if s.mode == "focus"):
            copied = trace[segment.start : segment.end].removesuffix("</focus>").strip()
            assert any(copied in example.documents[c - 1] for c in segment.chunks) or ", " in copied, copied
    if task.startswith("niah"):  # the value, not the needle sentence
        assert "special magic" not in example.gold_completion


def test_index_navigation_plans_in_index_and_surveys_in_global():
    """By hand: the same plan, navigated by the index; a chain returns to the index between hops (the
    resting mode of a prompt with an index), and aggregation still surveys the whole context."""
    chain = TracePlan(answer="X", reads=(Read((3,), "A = B."), Read((5,), "B = X.")), chained=True)
    terse = render_trace(chain, random.Random(0), thinking=False, style="terse", navigation="index")
    assert terse == (
        '<index>Chunk 3.</index>\n<focus magic_chunks="3"> A = B.</focus>\n<index>Chunk 5.</index>\n'
        '<focus magic_chunks="5"> B = X.</focus>\n<answer> X</answer>'
    )
    parsed = parse_completion(terse, 7, has_index=True)
    assert parsed.violations == [] and parsed.answer == "X"
    assert [s.mode for s in parsed.segments] == ["global", "index", "focus", "index", "focus", "index"]
    survey = TracePlan(answer="owl", need="the most common word", survey="owl appears 9 times.")
    assert render_trace(survey, random.Random(0), False, navigation="index").startswith("<global>")
    # the wording draws are the navigation's own: only the tags differ
    verbose = {
        nav: render_trace(ACME, random.Random(3), False, navigation=nav) for nav in ("global", "index")
    }
    assert verbose["global"].replace("global>", "index>") == verbose["index"]
    with pytest.raises(ValueError, match="navigation"):
        render_trace(ACME, random.Random(0), False, navigation="everywhere")


@pytest.mark.parametrize("task", LENGTH_TASKS)
def test_every_generator_writes_index_traces_that_parse_on_an_index_layout(tokenizer, task):
    from rollouts.masks import trace_completion
    from rollouts.protocol import build_prompt, token_bytes_table

    example = generate(tokenizer, task, 400, trace_style="terse", trace_navigation="index")
    layout = build_prompt(
        example.question,
        example.documents,
        tokenizer,
        chunk_tokens=example.chunk_tokens,
        index_entry_tokens=16,
    )
    assert layout.num_chunks == example.num_chunks
    ids = tokenizer(example.gold_completion, add_special_tokens=False)["input_ids"]
    trace = trace_completion(layout, ids, token_bytes_table(tokenizer))
    assert trace.parsed.violations == [], example.gold_completion
    assert all(a in trace.parsed.answer for a in example.answers)
    planning = {s.mode for s in trace.parsed.segments} - {"focus", "local"}
    assert planning == {"global", "index"}  # global: only the opening tag, or an aggregation's survey


def test_an_unknown_trace_style_is_refused():
    with pytest.raises(ValueError, match="trace style"):
        render_trace(ACME, random.Random(0), thinking=False, style="chatty")


NEEDLE = TracePlan(
    answer="63",
    reads=(Read((5,), "The number of silver-owl is: 63.", "63", "silver-owl"),),
    candidates=(2, 5, 6),
)


def test_each_strategy_reads_one_needle_its_own_way():
    """By hand: the seven terse strategies for one needle among look-alikes in chunks 2, 5 and 6."""
    rendered = {
        s: render_trace(NEEDLE, random.Random(0), thinking=False, style="terse", strategy=s)
        for s in STRATEGIES
    }
    assert rendered == {
        "plan": '<global>Chunk 5.</global>\n<focus magic_chunks="5"> 63</focus>\n<answer> 63</answer>',
        "direct": '<focus magic_chunks="5"> 63</focus>\n<answer> 63</answer>',
        "sentence": (
            '<global>The answer is in Chunk 5.</global>\n<focus magic_chunks="5"> 63</focus>\n<answer> 63</answer>'
        ),
        "candidates": (
            '<global>Chunks 2, 5 and 6.</global>\n<focus magic_chunks="5"> 63</focus>\n<answer> 63</answer>'
        ),
        "wide": '<focus magic_chunks="2,5,6"> 63</focus>\n<answer> 63</answer>',
        "keyed": '<focus magic_chunks="2,5,6"> silver-owl is: 63</focus>\n<answer> 63</answer>',
        "global": "<global>Chunk 5: 63.</global>\n<answer> 63</answer>",
    }
    for strategy, trace in rendered.items():
        parsed = parse_completion(trace, 7, version=4)
        assert (parsed.answer, parsed.violations) == ("63", []), strategy
    # under v4 the answer rests in local: only what the strategy declares reads the context
    assert [s.mode for s in parse_completion(rendered["direct"], 7, version=4).segments] == [
        "global",  # the focus tag, written while decoding still sees every chunk
        "focus",
        "local",
    ]
    # without look-alike needles "candidates" is the plan; chains keep their one form
    alone = TracePlan(answer="63", reads=NEEDLE.reads)
    assert render_trace(alone, random.Random(0), False, "terse", strategy="candidates") == rendered["plan"]
    assert render_trace(alone, random.Random(0), False, "terse", strategy="wide") == rendered["direct"]
    assert render_trace(alone, random.Random(0), False, "terse", strategy="keyed") == (
        '<focus magic_chunks="5"> silver-owl is: 63</focus>\n<answer> 63</answer>'
    )
    # a read that states no key (or two needles in one chunk) writes its value alone
    unkeyed = TracePlan(answer="63", reads=(Read((5,), "It is: 63.", "63"),), candidates=(2, 5, 6))
    assert render_trace(unkeyed, random.Random(0), False, "terse", strategy="keyed") == rendered["wide"]
    chain = TracePlan(answer="X", reads=(Read((3,), "A = B."), Read((5,), "B = X.")), chained=True)
    forms = {render_trace(chain, random.Random(0), False, "terse", strategy=s) for s in STRATEGIES}
    assert len(forms) == 2  # chains keep their one form, but for `keyed`


def test_a_keyed_chain_focuses_the_first_hop_at_once_and_the_second_hops_look_alikes():
    """By hand: a two-hop plan (link in chunk 2, the linked needle in 4, look-alikes in 1 and 5)."""
    chain = TracePlan(
        answer="90",
        reads=(
            Read((2,), "The magic number of long-house is that of early-onion.", "early-onion"),
            Read((4,), "One of the special magic numbers for early-onion is: 90.", "90", "early-onion"),
        ),
        chained=True,
        candidates=(1, 4, 5),
    )
    keyed = render_trace(chain, random.Random(0), False, "terse", strategy="keyed", chunk_ids="header")
    assert keyed == (
        '<focus magic_chunks=" 2"> early-onion</focus>\n'
        "<global>Chunks 1, 4 and 5.</global>\n"
        '<focus magic_chunks=" 1 4 5"> early-onion is: 90</focus>\n'
        "<answer> 90</answer>"
    )
    parsed = parse_completion(keyed, 7, version=4)
    assert (parsed.answer, parsed.violations) == ("90", [])
    assert [(s.mode, s.chunks) for s in parsed.segments if s.mode == "focus"] == [
        ("focus", (2,)),
        ("focus", (1, 4, 5)),
    ]
    # the other strategies keep the chain's one form: navigate in global before each read
    assert render_trace(chain, random.Random(0), False, "terse", strategy="plan") == (
        '<global>Chunk 2.</global>\n<focus magic_chunks="2"> early-onion</focus>\n'
        '<global>Chunk 4.</global>\n<focus magic_chunks="4"> 90</focus>\n<answer> 90</answer>'
    )


def test_header_chunk_ids_are_the_header_token_and_parse_as_digits(tokenizer):
    """trace_chunk_ids "header": each focus id written after a space, so the id is the very token of the
    chunk's "Magic Chunk 5:" header and the plan's "Chunk 5." (checked on the local tokenizer); the
    parser reads it as the digits form."""
    direct = render_trace(NEEDLE, random.Random(0), False, "terse", strategy="direct", chunk_ids="header")
    assert direct == '<focus magic_chunks=" 5"> 63</focus>\n<answer> 63</answer>'
    digits = render_trace(NEEDLE, random.Random(0), False, "terse", strategy="direct")
    for trace in (direct, digits):
        (focus,) = [s for s in parse_completion(trace, 7, version=4).segments if s.mode == "focus"]
        assert focus.chunks == (5,)
    five = tokenizer.encode(" 5", add_special_tokens=False)
    assert len(five) == 1
    for text in (direct, "Magic Chunk 5: One", "<global>Chunk 5.</global>"):
        assert five[0] in tokenizer.encode(text, add_special_tokens=False), text
    assert five[0] not in tokenizer.encode(digits, add_special_tokens=False)
    two = TracePlan(answer="X", reads=(Read((2, 7), "x"),))
    assert '<focus magic_chunks=" 2 7">' in render_trace(
        two, random.Random(0), False, "terse", chunk_ids="header"
    )
    with pytest.raises(ValueError, match="chunk ids must be one of"):
        render_trace(NEEDLE, random.Random(0), False, "terse", chunk_ids="words")


def test_strategies_other_than_plan_need_the_terse_style():
    with pytest.raises(ValueError, match="terse"):
        render_trace(NEEDLE, random.Random(0), thinking=False, style="verbose", strategy="direct")
    with pytest.raises(ValueError, match="strategy"):
        render_trace(NEEDLE, random.Random(0), thinking=False, style="terse", strategy="skim")


def test_a_strategy_mix_draws_each_strategy_about_its_weight_and_one_strategy_draws_nothing():
    from data.tasks.base import draw_strategy

    rng = random.Random(0)
    draws = [
        draw_strategy(rng, {"plan": 0.5, "direct": 0.25, "candidates": 0.25, "global": 0})
        for _ in range(4000)
    ]
    share = {s: draws.count(s) / len(draws) for s in STRATEGIES}
    assert abs(share["plan"] - 0.5) < 0.03 and abs(share["direct"] - 0.25) < 0.03 and share["global"] == 0
    rng, twin = random.Random(1), random.Random(1)
    assert draw_strategy(rng, {"direct": 1.0, "plan": 0.0}) == "direct"
    assert rng.random() == twin.random()  # nothing was drawn: single-strategy datasets keep their bytes


def test_generated_multikey_traces_list_the_needle_chunks_as_candidates(tokenizer):
    example = generate(
        tokenizer, "niah_multikey", 1200, trace_style="terse", trace_strategies={"candidates": 1.0}
    )
    planned = parse_completion(example.gold_completion, example.num_chunks, version=4).segments[0]
    listed = example.gold_completion[planned.start : planned.end]
    needle_chunks = [c for c, doc in enumerate(example.documents, start=1) if "special magic number" in doc]
    assert 1 < len(needle_chunks) < example.num_chunks and listed.startswith("<global>Chunks ")
    listed_ids = (
        listed.removeprefix("<global>Chunks ").removesuffix(".</global>").replace(" and ", ", ").split(", ")
    )
    assert [int(c) for c in listed_ids] == needle_chunks

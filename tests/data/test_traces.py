"""Gold traces on hand-worked plans: the paper's Acme example, a variable chain, a survey, a bare answer."""

import random

from data.traces import Read, TracePlan, render_trace
from rollouts.protocol import parse_completion

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
    # (DESIGN.md contract 3), so the "\n<local>" between modes counts as global.
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

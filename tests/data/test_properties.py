"""Property tests: for any seed, length and chunk size, every generator keeps its promises."""

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from data.schema import DataError
from data.traces import Read, TracePlan, render_traces
from rollouts.protocol import build_prompt, parse_completion

from .helpers import LENGTH_TASKS, generate
from .solvers import solve


def test_any_length_and_chunk_size_keeps_answer_length_and_evidence(tokenizer):
    """Draws that the generators refuse (needles that cannot fit a chunk) are counted: a regression that
    made every draw raise would otherwise pass by checking nothing."""
    outcomes = Counter()

    @settings(max_examples=60, deadline=None)
    @given(
        task=st.sampled_from(LENGTH_TASKS),
        target=st.integers(250, 4000),
        chunk_tokens=st.sampled_from([64, 100, 256, 512]),
        seed=st.integers(0, 10**6),
    )
    def keeps_its_promises(task, target, chunk_tokens, seed):
        try:
            example = generate(tokenizer, task, target, seed=seed, chunk_tokens=chunk_tokens)
        except DataError as err:
            # an impossible combination must say so, naming the limit
            assert "too small" in str(err) or "too short" in str(err), str(err)
            outcomes["refused"] += 1
            return
        outcomes["checked"] += 1
        assert sorted(solve(task, example.question, example.documents)) == sorted(example.answers)
        assert abs(example.context_tokens - target) <= 0.05 * target
        layout = build_prompt(example.question, example.documents, tokenizer, chunk_tokens=chunk_tokens)
        assert list(layout.chunk_texts) == example.documents
        holding = {i for i, text in enumerate(layout.chunk_texts, 1) for n in example.needles if n in text}
        assert holding <= set(example.evidence_chunks)
        parsed = parse_completion(example.gold_completion, layout.num_chunks)
        assert parsed.violations == [] and all(a in parsed.answer for a in example.answers)

    keeps_its_promises()
    assert outcomes["checked"] > outcomes["refused"], f"most draws were refused: {dict(outcomes)}"


@settings(max_examples=60, deadline=None)
@given(
    chunk_sets=st.lists(st.sets(st.integers(1, 40), min_size=1, max_size=3), min_size=1, max_size=5),
    chained=st.booleans(),
    combine=st.sampled_from(["", "3 + 4 = 7.", "x < 3 and y > 2."]),
    seed=st.integers(0, 10**6),
)
def test_any_plan_renders_to_clean_traces_that_cover_its_reads(chunk_sets, chained, combine, seed):
    reads = tuple(Read(tuple(sorted(c)), f"fact {i}.") for i, c in enumerate(chunk_sets))
    plan = TracePlan(answer="7", need="the facts", reads=reads, combine=combine, chained=chained)
    for thinking, trace in zip((False, True), render_traces(plan, random.Random(seed))):
        parsed = parse_completion(trace, num_chunks=40, thinking=thinking)
        assert parsed.violations == []
        assert parsed.answer == "7"
        assert set(parsed.focused_chunks) == set().union(*chunk_sets)
        assert all(f"fact {i}." in trace for i in range(len(reads)))

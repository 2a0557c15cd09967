"""Every generator, checked against independent computations: a solver that reads only the text,
the real prompt layout, the tokenizer, and the protocol parser."""

import pytest

from rollouts.protocol import build_prompt, parse_completion

from .helpers import LENGTH_TASKS, generate
from .solvers import solve

CASES = [(task, target) for task in LENGTH_TASKS for target in (300, 1500)] + [
    ("niah_multikey", 6000),
    ("variable_tracking", 6000),
    ("aggregation_cwe", 6000),
    ("variable_assignment", 0),
]


@pytest.fixture(scope="module", params=CASES, ids=[f"{t}-{n}" for t, n in CASES])
def example(request, tokenizer):
    task, target = request.param
    return generate(tokenizer, task, target, chunk_tokens=256 if target > 3000 else 128)


def test_solver_reading_only_the_context_recomputes_the_answer(example):
    # The generator's answers are a set for string_match_all tasks; order does not matter there.
    assert sorted(solve(example.task, example.question, example.documents)) == sorted(example.answers)


def test_context_length_is_within_five_percent_and_counted_like_the_layout(example, tokenizer):
    counted = sum(len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in example.documents)
    assert example.context_tokens == counted
    if example.target_tokens:
        assert abs(counted - example.target_tokens) <= 0.05 * example.target_tokens


def test_each_document_is_one_magic_chunk_and_evidence_holds_the_needles(example, tokenizer):
    layout = build_prompt(example.question, example.documents, tokenizer, chunk_tokens=example.chunk_tokens)
    assert layout.num_chunks == example.num_chunks == len(example.documents)
    assert list(layout.chunk_texts) == example.documents
    holding = {i for i, text in enumerate(layout.chunk_texts, 1) for n in example.needles if n in text}
    if example.task.startswith("aggregation"):
        assert example.evidence_chunks == list(range(1, layout.num_chunks + 1))
    elif example.task == "variable_assignment":
        assert example.evidence_chunks == [1] and example.needles[0] in layout.chunk_texts[0]
    else:
        assert example.needles and holding == set(example.evidence_chunks)
        for needle in example.needles:  # every needle is placed exactly once
            assert sum(text.count(needle) for text in layout.chunk_texts) == 1


@pytest.mark.parametrize("thinking", [False, True])
def test_gold_trace_parses_cleanly_answers_and_covers_the_evidence(example, thinking):
    trace = example.gold_completion_thinking if thinking else example.gold_completion
    parsed = parse_completion(trace, example.num_chunks, thinking=thinking)
    assert parsed.violations == []
    assert trace.startswith("<think>") == thinking
    for answer in example.answers:
        assert answer in parsed.answer
    focus = [s for s in parsed.segments if s.mode == "focus"]
    if example.task.startswith("aggregation"):
        assert not focus  # the evidence is everywhere: the trace reads in global
    elif example.task != "variable_assignment":
        assert set(parsed.focused_chunks) >= set(example.evidence_chunks)
        for segment in focus:  # what a focus copies is really in the chunks it shows
            copied = trace[segment.start : segment.end].removesuffix("</focus>")
            for sentence in copied.replace(". ", ".\n").splitlines():
                assert any(sentence in example.documents[c - 1] for c in segment.chunks), sentence


def test_same_seed_same_example_other_seed_other_example(tokenizer):
    a = generate(tokenizer, "multi_span", 800, seed=3)
    b = generate(tokenizer, "multi_span", 800, seed=3)
    c = generate(tokenizer, "multi_span", 800, seed=4)
    assert a == b
    assert a.documents != c.documents


def test_variable_assignment_matches_the_paper_example_shape_and_ood_values(tokenizer):
    example = generate(tokenizer, "variable_assignment", 0, chunk_tokens=512, params={"num_assignments": 40})
    steps = [s.split("=") for s in example.documents[0].rstrip(";").split("; ")]
    assert len(steps) == 40 and {v for v, _ in steps} <= set("xyz")
    ood = generate(
        tokenizer, "variable_assignment", 0, chunk_tokens=512, params={"num_assignments": 40}, ood=True
    )
    assert {int(n) for _, n in (s.split("=") for s in ood.documents[0].rstrip(";").split("; "))} <= {0, 1}
    assert example.gold_completion == f"<answer>{example.answers[0]}</answer>"


@pytest.mark.parametrize("digits", [3, 7])
def test_niah_value_digits_sets_the_needle_numbers(tokenizer, digits):
    import re

    example = generate(tokenizer, "niah_multikey", 600, params={"value_digits": digits, "num_distractors": 2})
    (answer,) = example.answers
    assert len(answer) == digits and answer[0] != "0"
    needles = re.findall(r"special magic numbers for [\w-]+ is: (\d+)\.", " ".join(example.documents))
    assert len(needles) == 3 and all(len(n) == digits for n in needles)  # distractors too
    assert answer in needles and answer in example.gold_completion


def test_niah_value_digits_out_of_range_is_refused():
    from data.tasks import make_task

    with pytest.raises(ValueError, match="value_digits"):
        make_task("niah_single", {"value_digits": 1})

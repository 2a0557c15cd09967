"""Importers: each fixture (written in its source's own format) round-trips into the schema, and
malformed files fail with the file, line and field named."""

import json
from pathlib import Path

import pytest

from data.filler import TokenCounter
from data.importers import import_file
from data.schema import DataError
from rollouts.protocol import build_prompt, parse_completion

FIXTURES = Path(__file__).parent / "fixtures"
CHUNK = 48


@pytest.fixture(scope="module")
def load(tokenizer):
    count = TokenCounter(tokenizer)

    def load(source, path, **kw):
        return import_file(source, FIXTURES / path, count=count, chunk_tokens=CHUNK, **kw)

    return load


def rows(path):
    text = (FIXTURES / path).read_text()
    return json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()]


def check_layout(example, tokenizer):
    layout = build_prompt(example.question, example.documents, tokenizer, chunk_tokens=example.chunk_tokens)
    assert layout.num_chunks == example.num_chunks == len(example.documents)
    return layout


def test_ruler_niah_splits_prompt_into_instruction_context_question_and_finds_the_needle(load, tokenizer):
    examples = load("ruler", "ruler/niah_single_1/validation.jsonl")
    for example, row in zip(examples, rows("ruler/niah_single_1/validation.jsonl")):
        instruction, *body, query = row["input"].split("\n")
        assert "".join(example.documents) == "\n".join(body)  # lossless
        assert example.question == f"{instruction}\n{query}"
        assert example.answers == row["outputs"] and example.task == "niah_single_1"
        assert example.metric == "string_match_all" and example.source == "ruler"
        layout = check_layout(example, tokenizer)
        assert layout.num_chunks > 3
        holding = [i for i, t in enumerate(layout.chunk_texts, 1) if row["outputs"][0] in t]
        assert example.evidence_chunks == holding and len(holding) == 1
        parsed = parse_completion(example.gold_completion, layout.num_chunks)
        assert parsed.violations == [] and parsed.answer == row["outputs"][0]
        assert parsed.focused_chunks == tuple(holding)


def test_imported_rows_get_the_same_index_as_generated_ones(load, tokenizer):
    """The index is built from the laid-out chunks, so an imported RULER needle row gets one entry per
    chunk, and the needle's chunk's entry holds the needle's value (it is the chunk's key-value sentence)."""
    from data.prompts import layout_example
    from rollouts.protocol import LayoutSettings

    example = load("ruler", "ruler/niah_single_1/validation.jsonl")[0]
    layout = layout_example(example.to_row(), tokenizer, LayoutSettings(index_entry_tokens=48))
    assert layout.has_index and len(layout.index_texts) == layout.num_chunks
    (needle_chunk,) = example.evidence_chunks
    assert example.answers[0] in layout.index_texts[needle_chunk - 1]


def test_ruler_variable_tracking_evidence_is_every_chunk_of_the_chain(load, tokenizer):
    (example,) = load("ruler", "ruler/vt/validation.jsonl")
    layout = check_layout(example, tokenizer)
    chain = {i for i, t in enumerate(layout.chunk_texts, 1) for v in example.answers if f"VAR {v} =" in t}
    assert set(example.evidence_chunks) == chain and len(chain) == 3
    assert example.question.endswith(
        "Find all variables that are assigned the value 52114 in the text above."
    )
    assert "NNBVC" not in " ".join(example.needles)  # the distractor chain is not evidence
    parsed = parse_completion(example.gold_completion_thinking, layout.num_chunks, thinking=True)
    assert parsed.violations == [] and set(parsed.focused_chunks) >= chain


def test_longbench_v1_rows_keep_question_context_answers_and_metric(load, tokenizer):
    examples = load("longbench", "longbench/hotpotqa.jsonl")
    for example, row in zip(examples, rows("longbench/hotpotqa.jsonl")):
        assert (example.question, "".join(example.documents), example.answers) == (
            row["input"],
            row["context"],
            row["answers"],
        )
        assert (example.task, example.metric, example.evidence_chunks) == ("hotpotqa", "f1", [])
        assert example.id == f"longbench-hotpotqa-{row['_id']}" and example.gold_completion == ""
        check_layout(example, tokenizer)
    (summary,) = load("longbench", "longbench/gov_report.jsonl")
    assert summary.question == "Write a one-page summary of the report."


def test_longbench_v2_is_four_way_multiple_choice(load, tokenizer):
    examples = load("longbench_v2", "longbench_v2/data.json")
    for example, row in zip(examples, rows("longbench_v2/data.json")):
        assert example.answers == [row["answer"]] and example.metric == "exact"
        for letter in "ABCD":
            assert f"({letter}) {row['choice_' + letter]}" in example.question
        assert "".join(example.documents) == row["context"]
        assert json.loads(example.meta)["sub_domain"] == row["sub_domain"]
        check_layout(example, tokenizer)


@pytest.mark.parametrize("path", ["loogle/shortdep_qa.jsonl", "loogle/longdep_qa.jsonl"])
def test_loogle_both_layouts_locate_the_evidence_sentences(load, tokenizer, path):
    examples = load("loogle", path)
    assert examples
    for example in examples:
        layout = check_layout(example, tokenizer)
        assert example.needles
        holding = {i for i, t in enumerate(layout.chunk_texts, 1) for n in example.needles if n in t}
        assert set(example.evidence_chunks) == holding
    if path.startswith("loogle/shortdep"):
        assert [e.answers for e in examples] == [[r["answer"]] for r in rows(path)]
    else:
        assert examples[0].task == "longdep_qa" and len(examples[0].needles) == 2


def test_zeroscrolls_uses_the_offsets_to_separate_document_from_scaffold(load, tokenizer):
    (example,) = load("zeroscrolls", "zeroscrolls/qasper/validation.jsonl")
    (row,) = rows("zeroscrolls/qasper/validation.jsonl")
    document = row["input"][row["document_start_index"] : row["document_end_index"]]
    assert "".join(example.documents) == document
    assert document not in example.question
    assert row["input"][row["query_start_index"] : row["query_end_index"]] in example.question
    assert (example.task, example.answers, example.metric) == ("qasper", [row["output"]], "f1")
    check_layout(example, tokenizer)


def test_task_metric_and_limit_overrides(load):
    (example,) = load("longbench", "longbench/hotpotqa.jsonl", task="hq", metric="string_match_part", limit=1)
    assert (example.task, example.metric) == ("hq", "string_match_part")


@pytest.mark.parametrize(
    ("source", "lines", "message"),
    [
        ("ruler", ['{"input": "a\\nb\\nc", "outputs": ["1"]}', '{"input": '], r"bad\.jsonl:2: invalid JSON"),
        ("ruler", ['{"input": "a\\nb\\nc"}'], r"bad\.jsonl:1: field 'outputs' must be a non-empty list"),
        (
            "longbench",
            ['{"input": "q", "answers": ["a"], "dataset": "hotpotqa"}'],
            r":1: missing field 'context'",
        ),
        (
            "longbench",
            ['{"input": "q", "context": 5, "answers": ["a"]}'],
            r":1: field 'context' must be str, got int",
        ),
        (
            "longbench_v2",
            [
                '[{"question": "q", "choice_A": "a", "choice_B": "b", "choice_C": "c", "choice_D": "d", '
                '"answer": "E", "context": "x"}]'
            ],
            r"bad\.jsonl\[0\]: field 'answer' must be one of A",
        ),
        (
            "loogle",
            ['{"input": "doc", "qa_pairs": "[{\'Q\': oops}]"}'],
            r":1: field 'qa_pairs' is not a list literal",
        ),
        (
            "zeroscrolls",
            [
                '{"id": "z", "input": "abc", "output": null, "document_start_index": 0, '
                '"document_end_index": 2}'
            ],
            r":1: field 'output' is null",
        ),
        (
            "zeroscrolls",
            [
                '{"id": "z", "input": "abc", "output": "x", "document_start_index": 0, '
                '"document_end_index": 9}'
            ],
            r":1: document_start_index=0 / document_end_index=9",
        ),
        ("nope", ["{}"], r"unknown import source 'nope'"),
    ],
)
def test_malformed_files_name_the_line_and_field(tokenizer, tmp_path, source, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        import_file(source, path, count=TokenCounter(tokenizer), chunk_tokens=CHUNK)

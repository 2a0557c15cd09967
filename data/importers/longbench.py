"""LongBench (v1, JSONL) and LongBench-v2 (a JSON array, or JSONL) files.

v1 rows: ``{"input": question, "context": ..., "answers": [...], "dataset": "hotpotqa", "length":
..., "language": ..., "all_classes": ..., "_id": ...}``. The task is the row's ``dataset``. Metrics
follow LongBench's own scorers where the schema has them (QA F1, classification by match, passage
count by number, retrieval by exact paragraph); ROUGE (summaries) and edit similarity (code) have no
counterpart here and are graded by token F1, the nearest one. Summary and code datasets have an
empty ``input``; they get LongBench's instruction as the question.

v2 rows: ``{"_id", "domain", "sub_domain", "difficulty", "length", "question", "choice_A".."choice_D",
"answer": "B", "context"}``: four-way multiple choice, graded ``exact`` on the letter.
"""

from __future__ import annotations

from pathlib import Path

from ..schema import DataError
from .base import ImportedRecord, get, read_records, string_list

_V1_METRICS = {
    "trec": "string_match_part",
    "lsht": "string_match_part",
    "passage_count": "numeric",
    "passage_retrieval_en": "exact",
    "passage_retrieval_zh": "exact",
}  # every other v1 dataset: "f1"
_V1_INSTRUCTIONS = {
    "gov_report": "Write a one-page summary of the report.",
    "multi_news": "Write a one-page summary of all the news.",
    "vcsum": "Write a one-page summary of the meeting.",
    "lcc": "Complete the next line of code.",
    "passage_count": "How many unique paragraphs are there after removing duplicates? Answer with a number.",
}


def read_v1(path: Path, task: str | None = None) -> list[ImportedRecord]:
    records = []
    for where, row in read_records(path):
        dataset = task or get(row, "dataset", str, where, default=Path(path).stem)
        name = dataset.removesuffix("_e")  # LongBench-E files repeat the datasets with an "_e" suffix
        question = get(row, "input", str, where, default="").strip() or _V1_INSTRUCTIONS.get(name, "")
        if not question:
            raise DataError(f"{where}: field 'input' is empty and {dataset!r} has no default instruction")
        records.append(
            ImportedRecord(
                uid=str(get(row, "_id", str, where, default=len(records))),
                task=dataset,
                question=question,
                context=get(row, "context", str, where),
                answers=string_list(row, "answers", where),
                metric=_V1_METRICS.get(name, "f1"),
                meta={k: row[k] for k in ("length", "language", "all_classes") if k in row},
            )
        )
    return records


def read_v2(path: Path, task: str | None = None) -> list[ImportedRecord]:
    records = []
    for where, row in read_records(path):
        choices = [get(row, f"choice_{c}", str, where) for c in "ABCD"]
        answer = get(row, "answer", str, where).strip()
        if answer not in ("A", "B", "C", "D"):
            raise DataError(f"{where}: field 'answer' must be one of A, B, C, D, got {answer!r}")
        listed = "\n".join(f"({c}) {text}" for c, text in zip("ABCD", choices))
        question = (
            f"{get(row, 'question', str, where)}\n\n{listed}\n\nAnswer with the letter of the correct choice."
        )
        records.append(
            ImportedRecord(
                uid=str(get(row, "_id", str, where, default=len(records))),
                task=task or "longbench_v2",
                question=question,
                context=get(row, "context", str, where),
                answers=[answer],
                metric="exact",
                meta={k: row[k] for k in ("domain", "sub_domain", "difficulty", "length") if k in row},
            )
        )
    return records

"""LooGLE files, in either of the two layouts it is distributed in.

- Flat (the hub dataset): one row per question, ``{"context", "title", "question", "answer",
  "evidence": [...], "task", "doc_id", "id"}``.
- Per document (the original repository): ``{"input": document, "title", "qa_pairs": "[{'Q': ...,
  'A': ..., 'S': [evidence, ...]}, ...]", "output": "none"}``, where ``qa_pairs`` is a Python
  literal string (read with ``ast.literal_eval``, never ``eval``) or a list; summarization rows have
  ``qa_pairs == "none"`` and the summary in ``output``.

LooGLE ships evidence sentences, so the evidence chunks are the ones containing them. Cloze answers
(a mapping from mask to entity) become the list of entities, all required.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ..schema import DataError
from .base import ImportedRecord, get, read_records

_METRICS = {"shortdep_cloze": "string_match_all"}  # QA and summaries: "f1"
_SUMMARY_QUESTION = "Write a summary of the document."


def _answers(value, where: str) -> list[str]:
    if isinstance(value, dict):  # cloze: {"<mask-0>": "Bob", ...}
        value = list(value.values())
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise DataError(f"{where}: the answer must be a non-empty string, list or mapping of strings")
    return [v.strip() for v in value]


def _evidence(value) -> list[str]:
    if isinstance(value, str):
        value = [value]
    return [v.strip() for v in value or [] if isinstance(v, str) and v.strip()]


def read(path: Path, task: str | None = None) -> list[ImportedRecord]:
    records: list[ImportedRecord] = []
    for where, row in read_records(path):
        if "qa_pairs" in row:
            records += _per_document(row, where, task or Path(path).stem, len(records))
            continue
        name = task or get(row, "task", str, where, default=Path(path).stem)
        records.append(
            ImportedRecord(
                uid=str(get(row, "id", (str, int), where, default=len(records))),
                task=name,
                question=get(row, "question", str, where, default="") or _SUMMARY_QUESTION,
                context=get(row, "context", str, where),
                answers=_answers(row.get("answer"), f"{where}: field 'answer'"),
                metric=_METRICS.get(name, "f1"),
                evidence="texts",
                evidence_texts=_evidence(row.get("evidence")),
                meta={k: row[k] for k in ("title", "doc_id") if k in row},
            )
        )
    return records


def _per_document(row: dict, where: str, task: str, first: int) -> list[ImportedRecord]:
    context = get(row, "input", str, where)
    pairs = row["qa_pairs"]
    meta = {"title": row["title"]} if "title" in row else {}
    if pairs == "none":
        summary = _answers(row.get("output"), f"{where}: field 'output'")
        return [ImportedRecord(str(first), task, _SUMMARY_QUESTION, context, summary, "f1", meta=meta)]
    if isinstance(pairs, str):
        try:
            pairs = ast.literal_eval(pairs)
        except (ValueError, SyntaxError) as err:
            raise DataError(f"{where}: field 'qa_pairs' is not a list literal ({err})") from None
    if not isinstance(pairs, list) or not all(isinstance(p, dict) and "Q" in p and "A" in p for p in pairs):
        raise DataError(f"{where}: field 'qa_pairs' must be a list of {{'Q': ..., 'A': ...}} objects")
    return [
        ImportedRecord(
            uid=str(first + i),
            task=task,
            question=str(p["Q"]),
            context=context,
            answers=_answers(p["A"], f"{where}: field 'qa_pairs'[{i}]['A']"),
            metric=_METRICS.get(task, "f1"),
            evidence="texts",
            evidence_texts=_evidence(p.get("S")),
            meta=meta,
        )
        for i, p in enumerate(pairs)
    ]

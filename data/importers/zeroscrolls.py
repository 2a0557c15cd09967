"""ZeroSCROLLS JSONL (the hub dataset's per-task files).

A row is the whole prompt plus offsets into it: ``{"id", "pid", "input", "output",
"document_start_index", "document_end_index", "query_start_index", "query_end_index",
"truncation_seperator"}``. The document (``input[document_start:document_end]``) becomes the
context; the rest of the prompt (instructions, query, "Answer:") becomes the question, so the
scaffold keeps every word the benchmark shows a model. Test files hide ``output``: import a
validation file. Metrics follow ZeroSCROLLS where the schema has them (QuALITY: the letter, exact;
SpaceDigest: a percentage, numeric; the rest: F1, the nearest to their ROUGE/F1 scorers).
"""

from __future__ import annotations

from pathlib import Path

from ..schema import DataError
from .base import ImportedRecord, get, read_records

_METRICS = {"quality": "exact", "space_digest": "numeric", "book_sum_sort": "exact"}  # the rest: "f1"


def read(path: Path, task: str | None = None) -> list[ImportedRecord]:
    task = task or (Path(path).parent.name if Path(path).stem in ("validation", "test") else Path(path).stem)
    records = []
    for where, row in read_records(path):
        prompt = get(row, "input", str, where)
        start = get(row, "document_start_index", int, where)
        end = get(row, "document_end_index", int, where)
        if not 0 <= start < end <= len(prompt):
            raise DataError(
                f"{where}: document_start_index={start} / document_end_index={end} do not fit "
                f"the {len(prompt)}-character input"
            )
        output = row.get("output")
        if output is None:
            raise DataError(
                f"{where}: field 'output' is null (test files hide answers; import the validation file)"
            )
        answers = [output] if isinstance(output, str) else output
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a for a in answers):
            raise DataError(f"{where}: field 'output' must be a non-empty string or list of strings")
        question = f"{prompt[:start].strip()}\n\n{prompt[end:].strip()}".strip()
        records.append(
            ImportedRecord(
                uid=str(get(row, "id", (str, int), where, default=len(records))),
                task=task,
                question=question,
                context=prompt[start:end],
                answers=answers,
                metric=_METRICS.get(task, "f1"),
                meta={k: row[k] for k in ("pid",) if k in row},
            )
        )
    return records

"""RULER-generated JSONL (``<task>/validation.jsonl`` from RULER's ``prepare.py``).

A row is ``{"index": 0, "input": "<instruction>\\n<context>\\n<question>", "outputs": ["8123456"],
"length": 4096, ...}``: the whole prompt in one string. The question is its last line; a known
RULER instruction at the start (and the QA tasks' repeated instruction at the end) is moved from the
context to the question, anything else stays context. RULER files carry no task name, so it comes
from the import config or the file's folder (RULER writes one folder per task).

Needles and variable chains are copied verbatim into the context, so for ``niah*`` and ``vt`` the
chunks containing an answer are the evidence (and a gold trace can quote them); ``cwe``/``fwe``
need every chunk; QA evidence is unknown.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..schema import DataError
from .base import ImportedRecord, get, read_records, string_list

_INSTRUCTIONS = re.compile(
    r"^\s*(Some special magic .*? afterwards\.|Memorize and track the chain\(s\) of variable assignment hidden "
    r"in the following text\.|Below is a numbered list of words\..*? appear most often\.|Read the following "
    r"coded text and track the frequency of each coded word\..*? coded words\.|Answer the question based on the "
    r"given documents\..*?The following are given documents\.)",
    re.DOTALL,
)
_QA_TRAILER = re.compile(r"\n\s*Answer the question based on the given documents\.[^\n]*\s*$")


def _kind(task: str) -> tuple[str, str]:
    """(metric, evidence kind) for a RULER task name such as ``niah_multikey_2`` or ``qa_1``."""
    if task.startswith(("niah", "vt")):
        return "string_match_all", "answers"
    if task.startswith(("cwe", "fwe")):
        return "string_match_all", "all"
    if task.startswith("qa"):
        return "string_match_part", "unknown"
    return "string_match_all", "unknown"


def read(path: Path, task: str | None = None) -> list[ImportedRecord]:
    task = task or Path(path).parent.name or Path(path).stem
    metric, evidence = _kind(task)
    records = []
    for where, row in read_records(path):
        prompt = get(row, "input", str, where)
        answers = string_list(row, "outputs", where)
        body, _, query = prompt.rstrip().rpartition("\n")
        if not body.strip() or not query.strip():
            raise DataError(
                f"{where}: field 'input' must hold the context and, on its last line, the question"
            )
        instruction = ""
        match = _INSTRUCTIONS.match(body)
        if match:
            instruction, body = match.group(1).strip(), body[match.end() :]
        body = _QA_TRAILER.sub("", body)
        question = f"{instruction}\n{query.strip()}" if instruction else query.strip()
        uid = str(get(row, "index", int, where, default=len(records)))
        meta = {k: row[k] for k in ("length", "answer_prefix") if k in row}
        records.append(
            ImportedRecord(uid, task, question, body.strip("\n"), answers, metric, evidence, meta=meta)
        )
    return records

"""What every importer shares: reading JSON/JSONL with line-numbered errors, and record -> ``Example``.

A source module turns each row of a benchmark file into an ``ImportedRecord`` (question, raw
context, answers, how to grade, what is known about the evidence). ``to_example`` then does the
rest the same way for every source: it cuts the context into chunk-sized documents with the prompt
layout's own splitter (so each document stays one magic chunk when laid out), finds the evidence
chunks where the source allows it, and writes a gold trace when the evidence is known.

Evidence, by what the source offers:
- ``"texts"``: the source ships evidence sentences (LooGLE): the chunks containing them.
- ``"answers"``: the answers are copied from the context (RULER needles and variable chains): the
  chunks containing an answer, and the sentences around it become the trace's quotes.
- ``"all"``: aggregation (RULER cwe/fwe): every chunk.
- ``"unknown"``: everything else: ``evidence_chunks=[]`` and no gold trace.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from rollouts.protocol import neutralize
from rollouts.protocol.chunking import split_text

from ..filler import TokenCounter
from ..packing import CHUNK_FILL
from ..schema import DataError, Example
from ..traces import Read, TracePlan, render_traces

EVIDENCE_KINDS = ("texts", "answers", "all", "unknown")


@dataclass
class ImportedRecord:
    uid: str  # the source's id for the row (or its line number)
    task: str
    question: str
    context: str
    answers: list[str]
    metric: str
    evidence: str = "unknown"  # one of EVIDENCE_KINDS
    evidence_texts: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def read_records(path: Path) -> list[tuple[str, dict]]:
    """``(where, row)`` pairs from a JSONL file or a JSON array; ``where`` is ``"file:line"``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"import file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):  # LongBench-v2 ships one JSON array
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{err.lineno}: invalid JSON: {err.msg}") from None
        out = [(f"{path}[{i}]", row) for i, row in enumerate(rows)]
    else:
        out = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: invalid JSON: {err.msg} (column {err.colno})") from None
    for where, row in out:
        if not isinstance(row, dict):
            raise DataError(f"{where}: each record must be a JSON object, got {type(row).__name__}")
    if not out:
        raise DataError(f"{path}: no records")
    return out


def get(row: dict, key: str, kind: type | tuple, where: str, default=...):
    """``row[key]`` checked against ``kind``; a ``DataError`` naming the field and line otherwise."""
    if key not in row or row[key] is None:
        if default is not ...:
            return default
        raise DataError(f"{where}: missing field {key!r}")
    value = row[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DataError(f"{where}: field {key!r} must be {want}, got {type(value).__name__}")
    return value


def string_list(row: dict, key: str, where: str) -> list[str]:
    value = row.get(key)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise DataError(f"{where}: field {key!r} must be a non-empty list of non-empty strings")
    return value


def to_example(record: ImportedRecord, source: str, count: TokenCounter, chunk_tokens: int) -> Example:
    """Chunk, locate evidence, write traces; see the module docstring."""
    where = f"{source} record {record.uid}"
    if not record.context.strip():
        raise DataError(f"{where}: the context is empty")
    if not record.question.strip():
        raise DataError(f"{where}: the question is empty")
    # Headroom below chunk_tokens, so the layout's own split never cuts one of these documents again.
    documents = split_text(record.context, int(CHUNK_FILL * chunk_tokens), count)
    readable = [neutralize(d) for d in documents]
    evidence: list[int] = []
    reads: tuple[Read, ...] = ()
    needles: list[str] = []
    if record.evidence == "all":
        evidence = list(range(1, len(documents) + 1))
    elif record.evidence == "texts":
        needles = [t for t in record.evidence_texts if any(neutralize(t) in d for d in readable)]
        evidence = sorted({i for i, d in enumerate(readable, 1) for t in needles if neutralize(t) in d})
    elif record.evidence == "answers":
        quotes = {i: _sentences_around(d, record.answers) for i, d in enumerate(readable, 1)}
        evidence = sorted(i for i, q in quotes.items() if q)
        reads = tuple(Read((i,), " ".join(quotes[i])) for i in evidence)
        needles = [q for i in evidence for q in quotes[i]]
    gold = gold_thinking = ""
    if reads:
        plan = TracePlan(answer=", ".join(record.answers), need="what the question asks for", reads=reads)
        gold, gold_thinking = render_traces(plan, random.Random(f"import/{source}/{record.uid}"))
    example = Example(
        id=f"{source}-{record.task}-{record.uid}",
        task=record.task,
        question=record.question.strip(),
        documents=documents,
        answers=record.answers,
        metric=record.metric,
        evidence_chunks=evidence,
        context_tokens=sum(count(documents)),
        num_chunks=len(documents),
        gold_completion=gold,
        gold_completion_thinking=gold_thinking,
        source=source,
        needles=needles,
        chunk_tokens=chunk_tokens,
        meta=json.dumps(record.meta, sort_keys=True, ensure_ascii=False),
    )
    example.validate()
    return example


def _sentences_around(text: str, answers: list[str]) -> list[str]:
    """The sentences (or lines) of ``text`` that contain one of ``answers``, in text order."""
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", text):
        if any(re.search(rf"(?<!\w){re.escape(a)}(?!\w)", sentence) for a in answers):
            out.append(sentence.strip())
    return out

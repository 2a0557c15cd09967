"""The example schema every generator and importer produces, and its HF ``datasets`` features.

One row is one long-context question. The context is a list of ``documents``; laid out with
``rollouts.protocol.build_prompt(question, documents, tokenizer, chunk_tokens=chunk_tokens)`` each
document becomes exactly one magic chunk, because every document is kept within ``chunk_tokens``
(generators pack filler up to that size; importers pre-split long contexts with the layout's own
splitter). So ``evidence_chunks`` are 1-based indices into ``documents`` and into the layout's chunks
alike, and tests check that by building the layout.

Rewards are written against these names; add columns, never rename one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from datasets import Features, List, Value

# How an answer is graded (the rewards package implements each):
METRICS = (
    "string_match_all",  # every reference string must appear in the answer (RULER)
    "string_match_part",  # at least one reference string must appear (RULER QA)
    "exact",  # the normalized answer equals one reference
    "f1",  # token-overlap F1 against the best reference
    "numeric",  # the number in the answer equals the reference number
    "math",  # mathematically equivalent expressions
)


class DataError(ValueError):
    """Bad data input: an unknown task, an impossible length, a malformed file. The message names
    the field or file line to change."""


@dataclass
class Example:
    """One dataset row. Column names and meanings are a contract with the rewards code."""

    id: str  # unique within a dataset and stable for a seed: "<task>-<target>-<split>-<index>"
    task: str  # generator name ("niah_single", ...) or, for imports, the source's task name
    question: str  # scaffold text, visible in every DA mode
    documents: list[str]  # the context, one magic chunk per document
    answers: list[str]  # every acceptable (or, for string_match_all, required) answer string
    metric: str  # one of METRICS
    evidence_chunks: list[int]  # 1-based chunks holding the evidence; [] when unknown
    context_tokens: int  # tokens of all documents under the dataset's tokenizer (no scaffold, no padding)
    num_chunks: int  # == len(documents)
    gold_completion: str  # protocol-correct non-thinking trace; "" when no gold trace is known
    gold_completion_thinking: str  # the same in <think> form; "" when unknown
    source: str  # "synthetic", or the importer name ("ruler", "longbench", ...)
    # -- additions beyond the contract ------------------------------------------------------------
    needles: list[str] = field(default_factory=list)  # evidence text exactly as in the documents
    chunk_tokens: int = 0  # the chunk size the documents were cut for (pass it to build_prompt)
    target_tokens: int = 0  # requested context length; 0 when none was requested
    meta: str = "{}"  # JSON: generation parameters or source fields, for debugging and filtering

    def validate(self) -> None:
        """Raise ``DataError`` on a row that breaks the schema's own invariants."""
        where = f"example {self.id!r}"
        if self.metric not in METRICS:
            raise DataError(f"{where}: metric {self.metric!r} is not one of {METRICS}")
        if not self.documents or any(not d.strip() for d in self.documents):
            raise DataError(f"{where}: documents must be non-empty strings")
        if self.num_chunks != len(self.documents):
            raise DataError(f"{where}: num_chunks={self.num_chunks} but {len(self.documents)} documents")
        bad = [c for c in self.evidence_chunks if not 1 <= c <= self.num_chunks]
        if bad:
            raise DataError(f"{where}: evidence_chunks {bad} outside 1..{self.num_chunks}")
        if not self.answers or not all(isinstance(a, str) and a for a in self.answers):
            raise DataError(f"{where}: answers must be a non-empty list of non-empty strings")
        json.loads(self.meta)

    def to_row(self) -> dict:
        return asdict(self)


COLUMNS = tuple(f.name for f in fields(Example))

FEATURES = Features(
    {
        "id": Value("string"),
        "task": Value("string"),
        "question": Value("string"),
        "documents": List(Value("string")),
        "answers": List(Value("string")),
        "metric": Value("string"),
        "evidence_chunks": List(Value("int32")),
        "context_tokens": Value("int32"),
        "num_chunks": Value("int32"),
        "gold_completion": Value("string"),
        "gold_completion_thinking": Value("string"),
        "source": Value("string"),
        "needles": List(Value("string")),
        "chunk_tokens": Value("int32"),
        "target_tokens": Value("int32"),
        "meta": Value("string"),
    }
)
assert tuple(FEATURES) == COLUMNS, "FEATURES and Example must list the same columns in the same order"

"""Importers for benchmark files a user already has on disk (nothing is downloaded).

``import_file("ruler", "niah_single_1/validation.jsonl", count=..., chunk_tokens=2048)`` reads a
file in the source's own format and returns ``Example`` rows in the common schema (see
``data/schema.py``), with ``source`` set to the importer name. A malformed file raises ``DataError``
naming the file, line and field.
"""

from __future__ import annotations

from pathlib import Path

from ..filler import TokenCounter
from ..schema import METRICS, DataError, Example
from . import longbench, loogle, ruler, zeroscrolls
from .base import ImportedRecord, to_example

IMPORTERS = {
    "ruler": ruler.read,
    "longbench": longbench.read_v1,
    "longbench_v2": longbench.read_v2,
    "loogle": loogle.read,
    "zeroscrolls": zeroscrolls.read,
}


def import_file(
    source: str,
    path: str | Path,
    *,
    count: TokenCounter,
    chunk_tokens: int,
    task: str | None = None,
    metric: str | None = None,
    limit: int | None = None,
) -> list[Example]:
    """Read ``path`` with the ``source`` importer; ``task``/``metric`` override what it infers."""
    if source not in IMPORTERS:
        raise DataError(f"unknown import source {source!r}; known sources: {', '.join(IMPORTERS)}")
    if metric is not None and metric not in METRICS:
        raise DataError(f"import {path}: metric {metric!r} is not one of {METRICS}")
    records = IMPORTERS[source](Path(path), task)[:limit]
    examples = []
    for record in records:
        if metric is not None:
            record.metric = metric
        examples.append(to_example(record, source, count, chunk_tokens))
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"{path}: duplicate record id {dup!r}; ids must be unique within a file")
    return examples


__all__ = ["IMPORTERS", "ImportedRecord", "import_file"]

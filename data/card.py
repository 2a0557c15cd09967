"""The dataset card (``README.md``) written beside a built dataset.

It says what is in each split, how every column is meant, and exactly how the data was made, so a
folder found on a disk months later explains itself. It holds no timestamp or path: the same config
gives the same card, like the same data.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from datasets import DatasetDict

from .config import DataConfig

_COLUMNS = """\
| column | meaning |
| --- | --- |
| `id` | unique, stable for a seed: `<task>-<target>-<split>-<index>` (imports: `<source>-<task>-<source id>`) |
| `task` | generator name, or the source's task name for imports |
| `question` | scaffold text, visible in every DA mode |
| `documents` | the context; each document is exactly one magic chunk when laid out with `chunk_tokens` |
| `answers` | acceptable answers (`string_match_all`: every one is required) |
| `metric` | grader: `string_match_all`, `string_match_part`, `exact`, `f1`, `numeric` or `math` |
| `evidence_chunks` | 1-based chunks holding the evidence; `[]` when unknown |
| `context_tokens` | tokens of all documents under the build tokenizer (no scaffold, no padding) |
| `num_chunks` | number of documents = magic chunks |
| `gold_completion` | protocol-correct trace (global plan, focus reads, local combination, answer); `""` if unknown |
| `gold_completion_thinking` | the same inside `<think>...</think>`; `""` if unknown |
| `source` | `synthetic` or the importer (`ruler`, `longbench`, `longbench_v2`, `loogle`, `zeroscrolls`) |
| `needles` | the evidence text exactly as it appears in the documents |
| `chunk_tokens` | chunk size the documents were cut for: pass it to `build_prompt` |
| `target_tokens` | requested context length (0: none) |
| `meta` | JSON: generation parameters or source fields |
"""


def dataset_card(config: DataConfig, dataset: DatasetDict, tokenizer) -> str:
    tokenizer_name = (
        f"the project's local byte-level BPE (`data/tokenizer.py`, vocabulary {len(tokenizer)})"
        if config.tokenizer == "local"
        else f"`{config.tokenizer}`"
    )
    lines = [
        "---",
        "pretty_name: Heed long-context tasks",
        "language:",
        "- en",
        "task_categories:",
        "- question-answering",
        "size_categories:",
        f"- {_size_category(sum(len(d) for d in dataset.values()))}",
        "---",
        "",
        "# Heed long-context tasks",
        "",
        "Long-context questions with known evidence chunks and gold Declarative Attention traces, built",
        "offline by `heed data build` (generators in `data/tasks/`, importers in `data/importers/`).",
        "",
        "```python",
        "from datasets import load_from_disk",
        "ds = load_from_disk(PATH)  # this folder",
        "```",
        "",
        "## Splits",
        "",
        "| split | examples | tasks |",
        "| --- | ---: | --- |",
    ]
    for name, split in dataset.items():
        tasks = Counter(split["task"])
        lines.append(
            f"| {name} | {len(split)} | {', '.join(f'{t} ({n})' for t, n in sorted(tasks.items()))} |"
        )
    lines += [
        "",
        "No question or needle sentence appears in two splits, and tasks whose question is fixed (aggregation,",
        "variable assignment) never repeat a context: synthetic rows are redrawn until unique.",
        "",
        "## Tasks",
        "",
        "| task | source | metric | examples | mean context tokens | mean chunks |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    stats: dict[tuple[str, str, str], list[tuple[int, int]]] = defaultdict(list)
    for split in dataset.values():
        for task, source, metric, tokens, chunks in zip(
            split["task"], split["source"], split["metric"], split["context_tokens"], split["num_chunks"]
        ):
            stats[(task, source, metric)].append((tokens, chunks))
    for (task, source, metric), rows in sorted(stats.items()):
        mean_tokens = sum(r[0] for r in rows) / len(rows)
        mean_chunks = sum(r[1] for r in rows) / len(rows)
        lines.append(
            f"| {task} | {source} | {metric} | {len(rows)} | {mean_tokens:,.0f} | {mean_chunks:.1f} |"
        )
    lines += [
        "",
        "## How it was made",
        "",
        f"- seed: {config.seed}",
        f"- tokenizer: {tokenizer_name}",
        f"- chunk_tokens: {config.chunk_tokens}; target lengths: {config.lengths} tokens (±5%)",
        f"- examples per task and length: {config.splits}; out-of-distribution: {config.ood_examples}",
        "- filler: shipped sentence templates and word lists (`data/resources/`), nothing downloaded",
        "- the full config: `heed_data_config.yaml` in this folder",
        "",
        "## Columns",
        "",
        _COLUMNS,
    ]
    return "\n".join(lines)


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")):
        if n < limit:
            return name
    return "100K<n<1M"

"""``heed data build``: run the generators and importers of a config into an HF ``DatasetDict`` on disk.

The order of work is fixed (splits train → validation → test → ood, then tasks and lengths in config
order, then index), and every example draws from its own ``random.Random`` seeded by
``seed/task/length/split/index/attempt``, so the same config gives the same bytes.

Split hygiene: each draft names its content (``leak_keys``: the question and the needle sentences,
or a hash of the context). A draft that repeats a key already used anywhere in the dataset is
redrawn with the next attempt number, so no needle or question appears in two splits (nor twice in
one). Imported rows go to the split their config entry names.

Nothing half-written is left behind: the dataset and its card are written to a temporary folder
beside ``out`` and renamed into place only when complete.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import datasets
import yaml
from datasets import Dataset, DatasetDict
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .card import dataset_card
from .config import OOD_SPLIT, SPLITS, DataConfig
from .filler import TokenCounter
from .importers import import_file
from .schema import FEATURES, DataError, Example
from .tasks import Task, finalize, make_task

MAX_ATTEMPTS = 100  # redraws allowed for one example before the task's space counts as exhausted


def load_tokenizer(spec: str):
    """``"local"``: the project's BPE tokenizer; anything else: a saved HF tokenizer folder."""
    if spec == "local":
        from .tokenizer import build_tokenizer

        return build_tokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError) as err:
        raise DataError(
            f"tokenizer {spec!r} cannot be loaded from disk ({err}); use 'local' or a folder"
        ) from None


def _jobs(config: DataConfig) -> list[tuple[str, Task, int, int]]:
    """(split, task, target_tokens, count) in generation order; target 0 = the task sets its length."""
    tasks = [(make_task(t.name, t.params), t.lengths or config.lengths) for t in config.tasks]
    jobs = []
    for split in SPLITS:
        for task, lengths in tasks:
            for target in lengths if task.length_targeted else [0]:
                jobs.append((split, task, target, config.splits.get(split, 0)))
    jobs += [(OOD_SPLIT, task, 0, config.ood_examples) for task, _ in tasks if task.has_ood]
    return [j for j in jobs if j[3] > 0]


def generate(config: DataConfig, tokenizer, progress: bool = False) -> dict[str, list[Example]]:
    """Every synthetic and imported example of ``config``, by split."""
    count = TokenCounter(tokenizer)
    jobs = _jobs(config)
    rows: dict[str, list[Example]] = {}
    seen: dict[str, str] = {}  # leak key -> the split that has it
    with _progress(progress, sum(j[3] for j in jobs)) as advance:
        for split, task, target, n in jobs:
            for index in range(n):
                rows.setdefault(split, []).append(
                    _draw(config, task, target, split, index, count, seen, chunk_tokens=config.chunk_tokens)
                )
                advance(f"{split}: {task.name} {target or ''}")
    for imp in config.imports:
        examples = import_file(
            imp.source,
            imp.path,
            count=count,
            chunk_tokens=config.chunk_tokens,
            task=imp.task,
            metric=imp.metric,
            limit=imp.limit,
        )
        rows.setdefault(imp.split, []).extend(examples)
    ids = [e.id for split_rows in rows.values() for e in split_rows]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"example id {dup!r} appears twice: is a file imported twice?")
    return rows


def _draw(config, task: Task, target, split, index, count, seen: dict[str, str], chunk_tokens) -> Example:
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(f"{config.seed}/{task.name}/{target}/{split}/{index}/{attempt}")
        try:
            draft = task.draft(rng, count, target, chunk_tokens, ood=split == OOD_SPLIT)
        except DataError as err:  # say which config entry asked for it
            where = (
                f"lengths={target}, chunk_tokens={chunk_tokens}" if target else f"chunk_tokens={chunk_tokens}"
            )
            raise DataError(f"tasks entry {task.name} at {where}: {err}") from None
        if all(seen.get(key, split) == split for key in draft.leak_keys):  # no key of another split
            seen.update(dict.fromkeys(draft.leak_keys - seen.keys(), split))
            return finalize(
                task.name,
                draft,
                example_id=f"{task.name}-{target}-{split}-{index:05d}",
                count=count,
                chunk_tokens=chunk_tokens,
                target_tokens=target,
                rng=rng,
                trace_style=config.trace_style,
                trace_navigation=config.trace_navigation,
                trace_strategies=config.trace_strategies,
                trace_chunk_ids=config.trace_chunk_ids,
            )
    raise DataError(
        f"task {task.name}: could not draw a new example after {MAX_ATTEMPTS} attempts at {split} index "
        f"{index}; the task's space is exhausted: ask for fewer examples or widen its params"
    )


def to_dataset_dict(rows: dict[str, list[Example]]) -> DatasetDict:
    order = [s for s in (*SPLITS, OOD_SPLIT) if rows.get(s)]
    return DatasetDict(
        {s: Dataset.from_list([e.to_row() for e in rows[s]], features=FEATURES, split=s) for s in order}
    )


def build_dataset(
    config: DataConfig,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    progress: bool = False,
    tokenizer=None,
) -> DatasetDict:
    """Generate ``config`` and write it to ``out_dir`` (a ``load_from_disk`` folder with a card)."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise DataError(f"output folder {out} already exists; pass --overwrite to replace it")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer)
    dataset = to_dataset_dict(generate(config, tokenizer, progress=progress))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial"
    old = out.parent / f".{out.name}.old"
    for leftover in (tmp, old):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        with _quiet_datasets():
            dataset.save_to_disk(str(tmp))
        (tmp / "README.md").write_text(dataset_card(config, dataset, tokenizer))
        (tmp / "heed_data_config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
        if out.exists():
            out.rename(old)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out.exists():
            old.rename(out)  # put the previous dataset back
        raise
    shutil.rmtree(old, ignore_errors=True)
    return dataset


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator:
    if not enabled:
        yield lambda description: None
        return
    columns = (
        TextColumn("[bold]{task.description:<36}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns) as bar:
        task = bar.add_task("generating", total=total)
        yield lambda description: bar.update(task, advance=1, description=description)


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    # datasets draws its own bar per shard; ours already covered the work.
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()

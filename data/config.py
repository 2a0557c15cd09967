"""The data build config: documented dataclasses, loaded from YAML and validated on load.

Every key is documented where it is defined (the comment after each field is its help text), and a
bad config fails before anything is generated, with an error naming the key path to change::

    heed: error: configs/data/default.yaml: tasks[2].params: task niah_multikey: unknown params ['distractors']; ...

An example config is ``configs/data/default.yaml``.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import yaml

from .importers import IMPORTERS
from .schema import METRICS, DataError
from .tasks import make_task
from .traces import CHUNK_ID_FORMS, NAVIGATIONS, STRATEGIES, TRACE_STYLES

SPLITS = ("train", "validation", "test")
OOD_SPLIT = "ood"


@dataclass
class TaskConfig:
    # A generator: niah_single, niah_multikey, niah_multivalue, niah_multiquery, variable_tracking,
    # multi_span, aggregation_cwe, aggregation_fwe or variable_assignment.
    name: str
    # Generator parameters over the name's defaults (the fields of its class in data/tasks/*.py).
    params: dict = field(default_factory=dict)
    # Target context tokens for this task; default: the top-level lengths.
    lengths: list[int] | None = None


@dataclass
class ImportConfig:
    source: str  # the file's format: ruler, longbench, longbench_v2, loogle, zeroscrolls
    path: str  # the file; a relative path is relative to the config file
    split: str = "test"  # the split its examples go to
    task: str | None = None  # task name; default: what the source says (row field, folder or file name)
    metric: str | None = None  # grading metric for every row; default: the importer's mapping
    limit: int | None = None  # import at most this many rows (the first ones)


@dataclass
class DataConfig:
    tasks: list[TaskConfig] = field(default_factory=list)  # synthetic generators to run
    imports: list[ImportConfig] = field(default_factory=list)  # benchmark files to convert
    seed: int = 0  # every example is a pure function of (seed, task, length, split, index)
    tokenizer: str = "local"  # "local": the project's BPE (data/tokenizer.py); else a saved HF tokenizer dir
    chunk_tokens: int = 2048  # magic chunk size in tokens; every document fits in one chunk
    lengths: list[int] = field(default_factory=lambda: [4096])  # target context tokens (±5%)
    # Examples per task and length in each split ("train", "validation", "test").
    splits: dict[str, int] = field(default_factory=lambda: {"train": 100, "validation": 10, "test": 10})
    ood_examples: int = 10  # examples per task in the "ood" split, for tasks that have one
    # Gold trace wording (data/traces.py): "verbose" (a plan sentence, the needle copied whole; for real
    # models) or "terse" (the plan names the chunks, the focus copies the value, the answer repeats it;
    # for a model trained from scratch).
    trace_style: str = "verbose"
    # Where gold traces plan (data/traces.py): "global" (the whole context), "index" (the prompt's index of
    # the chunks; for runs that lay prompts out with an index, run.index_entry_tokens > 0) or "mixed" (each
    # example draws one of the two, so GRPO can choose between them).
    trace_navigation: str = "global"
    # How terse gold traces read one-hop evidence (data/traces.py STRATEGIES): a weight per strategy, one
    # drawn per example, so the SFT policy samples readings that cost more and less and GRPO can choose.
    # "plan" names the chunk in global first, "sentence" does so in a sentence, "direct" focuses at once
    # (not under protocol v5, where it would choose blind), "candidates" lists every chunk holding a
    # look-alike needle first, "wide" focuses all of those chunks at once (not under v5 either), "keyed" is
    # "wide" writing the asked key before the value, "global" reads the value without a focus.
    trace_strategies: dict[str, float] = field(default_factory=lambda: {"plan": 1.0})
    # How terse focus tags write chunk ids (data/traces.py CHUNK_ID_FORMS): "digits" (magic_chunks="5") or
    # "header" (magic_chunks=" 5": the token of the chunk's header, so a focus that names its chunk at
    # once copies that token, as a plan does).
    trace_chunk_ids: str = "digits"

    def to_dict(self) -> dict:
        return asdict(self)


def read_yaml(path: Path, error: type[Exception], what: str = "config file"):
    """The YAML document at ``path`` (None for an empty file); a missing or malformed file raises ``error``."""
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise error(f"{path}: invalid YAML: {err}") from None


def load_config(path: str | Path) -> DataConfig:
    """Read and validate a YAML data config; relative import paths resolve against its folder."""
    path = Path(path)
    raw = read_yaml(path, DataError)
    try:
        config = parse_config(raw or {})
    except DataError as err:
        raise DataError(f"{path}: {err}") from None
    for imp in config.imports:
        if not Path(imp.path).is_absolute():
            imp.path = str((path.parent / imp.path).resolve())
    return config


def parse_config(raw: dict) -> DataConfig:
    """A validated ``DataConfig`` from plain data (``DataError`` names the offending key)."""
    values = _known(raw, DataConfig, "")
    config = DataConfig(**{k: v for k, v in values.items() if k not in ("tasks", "imports")})
    _require(isinstance(config.seed, int) and not isinstance(config.seed, bool), "seed", "must be an integer")
    _require(
        isinstance(config.tokenizer, str) and config.tokenizer, "tokenizer", "must be a non-empty string"
    )
    _require(_positive_int(config.chunk_tokens), "chunk_tokens", "must be a positive integer")
    _require(
        isinstance(config.lengths, list) and config.lengths and all(map(_positive_int, config.lengths)),
        "lengths",
        "must be a non-empty list of positive integers",
    )
    _require(isinstance(config.splits, dict), "splits", f"must map {SPLITS} to example counts")
    for name, n in config.splits.items():
        _require(name in SPLITS, f"splits.{name}", f"is not a split; use {SPLITS}")
        _require(isinstance(n, int) and not isinstance(n, bool) and n >= 0, f"splits.{name}", "must be >= 0")
    _require(
        isinstance(config.ood_examples, int) and config.ood_examples >= 0, "ood_examples", "must be >= 0"
    )
    _require(config.trace_style in TRACE_STYLES, "trace_style", f"must be one of {TRACE_STYLES}")
    _require(config.trace_navigation in NAVIGATIONS, "trace_navigation", f"must be one of {NAVIGATIONS}")
    _require(config.trace_chunk_ids in CHUNK_ID_FORMS, "trace_chunk_ids", f"must be one of {CHUNK_ID_FORMS}")
    strategies = config.trace_strategies
    _require(
        isinstance(strategies, dict)
        and strategies
        and all(name in STRATEGIES for name in strategies)
        and all(
            isinstance(w, int | float) and not isinstance(w, bool) and w >= 0 for w in strategies.values()
        )
        and sum(strategies.values()) > 0,
        "trace_strategies",
        f"must map some of {STRATEGIES} to weights >= 0, not all 0 (for example {{plan: 1.0}})",
    )
    _require(
        config.trace_style == "terse" or set(k for k, w in strategies.items() if w > 0) == {"plan"},
        "trace_strategies",
        "other than plan need trace_style: terse (verbose traces always plan)",
    )

    tasks = values.get("tasks", [])
    _require(isinstance(tasks, list), "tasks", "must be a list of {name, params, lengths}")
    seen = set()
    for i, item in enumerate(tasks):
        where = f"tasks[{i}]"
        item = {"name": item} if isinstance(item, str) else item
        task = TaskConfig(**_known(item, TaskConfig, where))
        _require(task.name not in seen, f"{where}.name", f"{task.name} is listed twice; list each task once")
        seen.add(task.name)
        _require(isinstance(task.params, dict), f"{where}.params", "must be a mapping")
        if task.lengths is not None:
            ok = isinstance(task.lengths, list) and task.lengths and all(map(_positive_int, task.lengths))
            _require(ok, f"{where}.lengths", "must be a non-empty list of positive integers")
        try:
            make_task(task.name, task.params)
        except DataError as err:
            raise DataError(f"{where}: {err}") from None
        config.tasks.append(task)

    imports = values.get("imports", [])
    _require(isinstance(imports, list), "imports", "must be a list of {source, path, ...}")
    for i, item in enumerate(imports):
        where = f"imports[{i}]"
        imp = ImportConfig(**_known(item, ImportConfig, where))
        _require(
            imp.source in IMPORTERS, f"{where}.source", f"{imp.source!r} is not one of {list(IMPORTERS)}"
        )
        _require(isinstance(imp.path, str) and imp.path, f"{where}.path", "must be a file path")
        _require(
            imp.split in (*SPLITS, OOD_SPLIT), f"{where}.split", f"must be one of {(*SPLITS, OOD_SPLIT)}"
        )
        _require(imp.metric is None or imp.metric in METRICS, f"{where}.metric", f"must be one of {METRICS}")
        _require(
            imp.limit is None or _positive_int(imp.limit), f"{where}.limit", "must be a positive integer"
        )
        config.imports.append(imp)
    _require(config.tasks or config.imports, "tasks", "the config generates nothing: add tasks or imports")
    return config


def _known(raw, cls, where: str) -> dict:
    """``raw`` as a dict whose keys are fields of ``cls``, with required fields present."""
    if not isinstance(raw, dict):
        raise DataError(f"{where or 'the config'} must be a mapping, got {type(raw).__name__}")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        prefix = f"{where}." if where else ""
        raise DataError(f"unknown key {prefix}{unknown[0]}; known keys: {', '.join(names)}")
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [n for n in required if n not in raw]
    if missing:
        raise DataError(f"{where or 'the config'}: missing key {missing[0]!r}")
    return dict(raw)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _require(ok, key: str, message: str) -> None:
    if not ok:
        raise DataError(f"{key} {message}")

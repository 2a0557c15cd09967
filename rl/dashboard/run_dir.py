"""The run directory: what a training run writes, independent of any tracker, and how it is read back.

A run directory is plain files, append-only, readable while the run is still writing it::

    RUN_DIR/
      metrics.jsonl            one JSON object per line, one line per logged step
      trajectories/<name>.jsonl sampled trajectories, one record per line (see ``records.py``)
      eval/<name>.json         one evaluation: da / da-nm / vanilla results by task and length bin

``metrics.jsonl`` lines::

    {"step": 12, "time": 1764478800.5, "phase": "grpo", "reward/total": 1.42, "mode_mix/global": 0.27, ...}

- ``step`` (int), ``time`` (Unix seconds, float) and ``phase`` are always present. ``phase`` is
  ``"copy_warmup"`` (``rl.copy_warmup``), ``"sft"``, ``"grpo"``, ``"eval"`` or ``"sample"``
  (``rl.dashboard.sample_run``: scored gold and perturbed traces, no training).
- Every other key is a flat metric name -> number (``null`` when undefined for that step). The
  names the report knows, all optional (``records.step_metrics`` computes the rollout ones):
  ``reward/total|accuracy|efficiency|compliance|coverage|kv_saving`` and ``reward/accuracy_ruler`` (the
  answers under RULER's own recall-only metric, logged beside the reward's strict accuracy, not paid);
  ``accuracy|compliance|coverage/by_task/<task>`` and ``.../by_length/<bin>``;
  ``mode_mix/global|focus|local`` and ``mode_mix/by_length/<bin>/<mode>`` (share of generated
  tokens by the mode they were *predicted under*); ``kv/tokens_da`` (KV tokens the DA mask lets the
  batch read, summed over steps and completions), ``kv/tokens_vanilla`` (the same under causal
  attention), ``kv/saving`` (``1 - da / vanilla``), ``kv/bytes_da``, ``kv/bytes_vanilla``;
  ``kv/tokens_da_per_completion``, ``kv/tokens_vanilla_per_completion`` (those two sums over the batch's
  completions, a failed rollout counting with 0 like in ``decode/steps``; ``Run.series`` derives them
  for lines written before they were logged);
  ``kv/tokens_da/layer_<NN>`` (per layer, only when Selective Attention eviction makes layers differ;
  ``kv/tokens_da`` is then their mean); ``decode/roofline_s_da``, ``decode/roofline_s_vanilla``
  (roofline decoding time of the batch, seconds, at the reward config's accelerator: matmuls plus
  every layer's attention, ``rewards.efficiency.decode_seconds``);
  ``decode/steps`` (mean generated tokens), ``decode/steps_overhead`` (generated tokens over those of
  the vanilla trace, minus 1: in GRPO the same completions with their mode tags cut out);
  ``violations/<kind>`` (violations of that kind per completion); ``is_ratio/mean|min|max``;
  ``weight_sync/bytes``, ``weight_sync/seconds`` (the weight push to the rollout pool before the
  batch); ``rollouts/count``, ``rollouts/failed`` (rollouts the pool gave up on, each scored 0);
  ``rollouts/engines`` (live rollout engines at the weight push: fewer than configured after a node
  loss); ``aux_loss`` (a Selective Attention policy's L_mem in the GRPO loss; ``memory_loss`` in SFT);
  ``throughput/tokens_per_s``; ``timing/step_s``, ``timing/optimizer_s``, ``timing/generate_s``,
  ``timing/reward_s`` (seconds of the GRPO step and of its parts, ``rl/step_timing.py``). Other keys are
  kept (``Run.series`` reads any name), never an error.

``trajectories/<name>.jsonl`` records (``records.trajectory_record`` writes them)::

    {"id", "step", "example_id", "task", "mode" (da|da-nm|vanilla), "protocol_version", "finish_reason",
     "context_tokens", "length_bin", "layout": {"block_size", "prompt_len", "chunk_spans"},
     "completion_text", "num_tokens", "segments": [{"mode", "chunks", "start", "end"}] (characters),
     "answer", "answers", "evidence_chunks", "violations": [{"kind", "position"}],
     "states": [{"mode", "chunks"}], "predicted_state": [n], "kv_tokens": [n], "kv_tokens_vanilla": [n],
     "reward": {"total", "accuracy", "accuracy_ruler", "efficiency", "compliance", "coverage", "kv_saving",
                "reasons"}}

``states``/``predicted_state``/``kv_tokens*`` are the rollout's ``CompletionTrace`` as recorded:
token ``j`` was predicted under ``states[predicted_state[j]]`` by a forward that read
``kv_tokens[j]`` KV tokens (``kv_tokens_vanilla[j]`` under causal attention).

``eval/<name>.json``::

    {"step": 40, "time": ..., "results": [
        {"mode": "da", "task": "niah_single", "length_bin": "<=2K", "n": 20, "accuracy": 0.95,
         "kv_tokens": 81234, "kv_tokens_vanilla": 190321, "decode_steps": 41.5}, ...]}

``kv_tokens`` is what that mode's engine read in total (``da``: the DA trace; ``da-nm`` and
``vanilla``: full causal), ``decode_steps`` the mean generated tokens per example. ``heed eval`` and
``heed train`` add ``accuracy_ruler`` (RULER's own metric beside the reward's strict ``accuracy``),
``compliance``, ``coverage`` (``null`` when unknown), ``kv_saving``,
``mode_mix_global|focus|local``, ``truncated`` and ``errors`` to each row (``rl/evaluate.py``).

Writing: one :class:`RunWriter` per run (rank 0 in a distributed job) appends one line and flushes
it per call, so a reader never sees more than one partial line (the last); eval files are written
whole and renamed into place. Reading: :class:`RunReader` never raises on content; an empty or
missing directory, a half-written last line or a corrupted line yield what is valid plus a list of
:class:`Skipped` entries naming the file and line, which the report prints.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
TRAJECTORIES_DIR = "trajectories"
EVAL_DIR = "eval"
PHASES = (
    "copy_warmup",
    "sft",
    "budget_search",
    "grpo_budgets",
    "grpo",
    "final_budget_search",
    "eval",
    "sample",
)
ROW_KEYS = ("step", "time", "phase")  # every metrics line has these; the rest are metric names


def _jsonable(value: Any) -> Any:
    """Plain JSON: numpy scalars and arrays become Python numbers and lists, NaN/inf become null."""
    if hasattr(value, "tolist"):  # numpy scalar or array
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _dump_line(obj: Mapping) -> str:
    return json.dumps(_jsonable(obj), ensure_ascii=False, allow_nan=False) + "\n"


class RunWriter:
    """Append metrics, trajectories and eval results to a run directory; every write is flushed.

    >>> import tempfile
    >>> run = RunWriter(tempfile.mkdtemp())
    >>> run.log_metrics(0, "grpo", {"reward/total": 1.5})
    >>> RunReader(run.root).read().metrics[0]["reward/total"]
    1.5
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        (self.root / TRAJECTORIES_DIR).mkdir(parents=True, exist_ok=True)
        (self.root / EVAL_DIR).mkdir(exist_ok=True)

    def log_metrics(self, step: int, phase: str, metrics: Mapping[str, float | None]) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        clash = set(ROW_KEYS) & set(metrics)
        if clash:
            raise ValueError(f"metric names {sorted(clash)} are reserved for the line itself")
        self._append(
            self.root / METRICS_FILE, {"step": int(step), "time": time.time(), "phase": phase, **metrics}
        )

    def log_trajectories(self, records: list[Mapping], name: str = "samples") -> None:
        """Append trajectory records (``records.trajectory_record``) to ``trajectories/<name>.jsonl``."""
        path = self.root / TRAJECTORIES_DIR / f"{name}.jsonl"
        with path.open("a", encoding="utf-8") as f:
            for record in records:
                f.write(_dump_line(record))
                f.flush()

    def write_eval(self, name: str, step: int, results: list[Mapping]) -> Path:
        """Write ``eval/<name>.json`` whole: to a temporary file, then renamed into place."""
        path = self.root / EVAL_DIR / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(
            json.dumps(_jsonable({"step": step, "time": time.time(), "results": results}), indent=1)
        )
        tmp.replace(path)
        return path

    @staticmethod
    def _append(path: Path, obj: Mapping) -> None:
        with path.open("a", encoding="utf-8") as f:
            f.write(_dump_line(obj))
            f.flush()


@dataclass(frozen=True)
class Skipped:
    """Something the reader could not use: the file, the 1-based line (0 = whole file) and why."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.reason}"


@dataclass
class Run:
    """Everything valid in a run directory, and what was skipped."""

    root: Path
    metrics: list[dict] = field(default_factory=list)  # metrics lines in file order
    trajectories: list[dict] = field(default_factory=list)
    evals: dict[str, dict] = field(default_factory=dict)  # eval name -> {"step", "time", "results"}
    skipped: list[Skipped] = field(default_factory=list)

    def metric_names(self) -> list[str]:
        """Every metric name logged at least once, sorted."""
        return sorted({k for row in self.metrics for k in row if k not in ROW_KEYS})

    def series(self, name: str, phase: str | None = None) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one metric over the lines that logged a number for it.

        A step logged twice in one phase (a run resumed from an earlier checkpoint re-logs the steps
        after it) counts once, with its latest value, at its first place. Lines written before
        ``kv/tokens_<da|vanilla>_per_completion`` was logged give it as their batch sum over
        ``rollouts/count`` when they logged both (every GRPO line did): the same number.
        """
        total = _PER_COMPLETION_SUMS.get(name)

        def value(row: dict) -> Any:
            if total is None or name in row:
                return row.get(name)
            return _per_completion(row.get(total), row.get("rollouts/count"))

        return self._points(value, phase)

    def _points(self, value_of: Callable[[dict], Any], phase: str | None) -> tuple[list[int], list[float]]:
        points: dict[tuple[str, int], float] = {}
        for row in self.metrics:
            value = value_of(row)
            if _is_number(value) and phase in (None, row["phase"]):
                points[(row["phase"], row["step"])] = float(value)
        return [step for _, step in points], list(points.values())

    def latest(self, name: str) -> float | None:
        _, values = self.series(name)
        return values[-1] if values else None


class RunReader:
    """Read a run directory, finished or still being written, keeping what is valid."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def read(self) -> Run:
        run = Run(self.root)
        if not self.root.is_dir():
            run.skipped.append(Skipped(str(self.root), 0, "run directory does not exist"))
            return run
        for line_no, row in self._jsonl(self.root / METRICS_FILE, run.skipped):
            reason = _metrics_row_problem(row)
            if reason:
                run.skipped.append(Skipped(str(self.root / METRICS_FILE), line_no, reason))
            else:
                run.metrics.append(row)
        for path in sorted((self.root / TRAJECTORIES_DIR).glob("*.jsonl")):
            for line_no, record in self._jsonl(path, run.skipped):
                missing = [
                    k for k in ("id", "step", "layout", "kv_tokens", "predicted_state") if k not in record
                ]
                if missing:
                    run.skipped.append(Skipped(str(path), line_no, f"trajectory record lacks {missing}"))
                elif not isinstance(record["step"], int) or not isinstance(record["id"], str):
                    run.skipped.append(
                        Skipped(str(path), line_no, "trajectory 'step' or 'id' has the wrong type")
                    )
                else:
                    run.trajectories.append(record)
        for path in sorted((self.root / EVAL_DIR).glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(data, dict) or not isinstance(data.get("results"), list):
                    raise ValueError("no 'results' list")
            except (ValueError, UnicodeDecodeError) as err:
                run.skipped.append(Skipped(str(path), 0, f"unreadable eval file ({err})"))
                continue
            rows = data["results"]
            data["results"] = [r for r in rows if isinstance(r, dict) and isinstance(r.get("mode"), str)]
            if len(data["results"]) < len(rows):
                why = f"{len(rows) - len(data['results'])} results are not objects with a 'mode'"
                run.skipped.append(Skipped(str(path), 0, why))
            run.evals[path.stem] = data
        return run

    @staticmethod
    def _jsonl(path: Path, skipped: list[Skipped]) -> Iterator[tuple[int, dict]]:
        """``(line number, object)`` for every parseable JSON-object line; the rest go to ``skipped``."""
        if not path.is_file():
            return
        data = path.read_bytes()
        lines = data.split(b"\n")
        for line_no, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            last_unterminated = line_no == len(lines) and not data.endswith(b"\n")
            try:
                obj = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as err:
                why = (
                    "half-written last line (the run may still be writing)"
                    if last_unterminated
                    else f"bad JSON ({err})"
                )
                skipped.append(Skipped(str(path), line_no, why))
                continue
            if not isinstance(obj, dict):
                skipped.append(
                    Skipped(str(path), line_no, f"expected a JSON object, got {type(obj).__name__}")
                )
                continue
            yield line_no, obj


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# per-completion metrics a run written before they were logged still has, as batch sums and a count
_PER_COMPLETION_SUMS = {
    "kv/tokens_da_per_completion": "kv/tokens_da",
    "kv/tokens_vanilla_per_completion": "kv/tokens_vanilla",
}


def _per_completion(total: Any, count: Any) -> float | None:
    return total / count if _is_number(total) and _is_number(count) and count > 0 else None


def _metrics_row_problem(row: dict) -> str | None:
    """Why a parsed metrics line is unusable, or ``None``."""
    if not isinstance(row.get("step"), int) or isinstance(row.get("step"), bool):
        return "no integer 'step'"
    if row.get("phase") not in PHASES:
        return f"phase {row.get('phase')!r} is not one of {PHASES}"
    return None

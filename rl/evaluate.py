"""``heed eval``: a policy on a dataset split under the paper's three columns, by task and context length.

The columns (``rollouts.trajectory.ROLLOUT_MODES``):

- ``da``: the DA prompt, decoded with the DA mask on — the engine reads only what the mode allows;
- ``da-nm``: the same prompt with full causal attention (the paper's control: what the mask costs);
- ``vanilla``: the prompt without the DA instructions (as the paper's Vanilla), run by the stock engine
  with nothing attached: the stock-engine reference the savings are measured against. Every mode is
  laid out by ``data.prompts.layout_example`` (the one place a row becomes a prompt); when the run's
  prompts carry no instructions (``instructions=False``, the tiny configs) ``vanilla`` has ``da-nm``'s
  prompt, and with greedy decoding writes what ``da-nm`` writes.

Per example and mode (the requests: ``rl/eval_requests.py``): one greedy request (temperature 0), or
``samples`` requests at ``temperature`` with seeds ``seed, seed + 1, ...`` in request order (reproducible
on one engine) → a
:class:`~rollouts.trajectory.Trajectory` each → :func:`rewards.score_trajectories`. Greedy decoding shows
what the policy does at its most likely; sampling at the rollout temperature shows the distribution GRPO
trains (a policy whose greedy completions are all compliant can still sample non-compliant ones).
Aggregated per (mode, task, context-length bin), over every completion (``n``: examples x samples):

- ``accuracy``, ``compliance``: means of the reward components (``accuracy`` is the reward's strict
  grade: an answer listing values that are not references scores 0); ``accuracy_ruler``: the same
  answers under RULER's own metric (recall only), so results stay comparable with RULER's;
  ``coverage``: mean share of the evidence chunks the model focused on, over the examples that know
  their evidence (``None`` when none does);
- ``kv_tokens``: KV tokens the mode's engine actually read, summed over every decoding step of every
  example (``Trajectory.kv_tokens_read``: the DA trace in ``da``, full causal reads otherwise; under
  Selective Attention eviction, in every mode, the mean over layers of what each layer held);
  ``kv_tokens_vanilla``: the same completions under causal attention; ``kv_saving = 1 - kv_tokens /
  kv_tokens_vanilla`` (0 by construction for ``da-nm`` and ``vanilla`` without eviction);
  ``kv_tokens_per_example``, ``kv_tokens_vanilla_per_example``: the same two counts over ``n`` (what one
  completion reads: the absolute number the saving ratio hides when completions get shorter or longer);
  under Selective Attention eviction ``kv_tokens_per_layer`` (what each layer read, summed; ``kv_tokens``
  is their mean) and ``kv_peak_per_layer`` (the most one decoding step read in each layer: what it held,
  at most its budget), ``None`` without eviction, as ``heed serve`` reports them;
- ``decode_steps``: mean generated tokens; ``mode_mix_global|focus|local|index``: share of generated tokens
  by the mode they were predicted under (``records.predicted_modes``, the paper's Figure 5);
- ``truncated`` / ``errors``: examples that hit ``max_tokens`` / that the engine failed.

:meth:`EvalReport.completions` is every completion itself, one record each (``heed eval --completions``
writes them as JSON lines): what the policy wrote, its parsed answer, the grade and the KV tokens it read.

What it leaves out: pass@k (sampled completions are averaged: their accuracy estimates pass@1),
LLM-judge grading (the rewards' graders decide), and bytes or roofline time (tokens only;
``rewards.efficiency`` converts).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

from rewards import RewardBreakdown, score_trajectories
from rewards.config import DEFAULT_CONFIG, RewardConfig
from rl.dashboard.records import bin_order, context_tokens, length_bin, predicted_modes
from rl.eval_requests import EvalError, build_requests, check_sampling, parse_modes, select_examples
from rl.policy_settings import SettingsError, checkpoint_settings, layout_settings
from rollouts.engines.base import RolloutRequest
from rollouts.protocol import DEFAULT_LAYOUT, LayoutSettings, mode_by_name, mode_names
from rollouts.trajectory import ROLLOUT_MODES, Trajectory

Generate = Callable[[list[RolloutRequest]], list[Trajectory]]
ALL = "all"  # task and length-bin label of the per-mode summaries


@dataclass(frozen=True)
class EvalRow:
    """One (mode, task, length bin) cell of the eval, or a mode's summary (task and bin ``"all"``)."""

    mode: str
    task: str
    length_bin: str
    n: int  # completions: examples x samples
    accuracy: float  # mean graded accuracy (the reward's, with its precision check)
    accuracy_ruler: float  # mean accuracy under RULER's own metric (recall only)
    compliance: float  # mean protocol compliance (0 or 1 each)
    coverage: float | None  # mean evidence coverage; None: no example knows its evidence
    kv_saving: float | None  # 1 - kv_tokens / kv_tokens_vanilla; None when nothing was decoded
    kv_tokens: int  # KV tokens this mode's engine read, all steps of all examples
    kv_tokens_vanilla: int  # the same completions under causal attention
    kv_tokens_per_example: float  # kv_tokens / n: what one completion read
    kv_tokens_vanilla_per_example: float  # kv_tokens_vanilla / n
    decode_steps: float  # mean generated tokens per example
    # mode -> share of generated tokens predicted under it, for every mode of rollouts.protocol.mode_table()
    mode_mix: dict[str, float | None]
    truncated: int = 0  # examples that stopped at max_tokens
    errors: int = 0  # examples the engine failed (scored 0)
    kv_tokens_per_layer: list[int] | None = None  # under SA eviction: what each layer read, all steps
    kv_peak_per_layer: list[int] | None = None  # under SA eviction: the most each layer held at one step
    # mean of each registered reward term (rewards/terms.py) over the completions that know it
    terms: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready, the mode mix as flat ``mode_mix_<mode>`` keys (``Mode.eval_key``): the format eval
        files have always had, so every ``heed dashboard`` reads old and new files alike."""
        row = asdict(self)
        mix, terms = row.pop("mode_mix"), row.pop("terms")
        return {
            **row,
            **{mode_by_name(name).eval_key: share for name, share in mix.items()},
            **{f"reward_{name}": mean for name, mean in terms.items()},  # registered terms: reward_<name>
        }


@dataclass
class EvalReport:
    """Scored trajectories of an eval, in request order, and their aggregates."""

    trajectories: list[Trajectory]
    rewards: list[RewardBreakdown]
    modes: tuple[str, ...] = ROLLOUT_MODES  # column order
    wall_time_s: float = 0.0  # generation time of the whole eval
    meta: dict = field(default_factory=dict)  # what was evaluated (checkpoint, data, split, ...)

    def __post_init__(self):
        if len(self.trajectories) != len(self.rewards):
            raise ValueError(f"{len(self.trajectories)} trajectories but {len(self.rewards)} rewards")

    @cached_property
    def rows(self) -> list[EvalRow]:
        """One row per (mode, task, length bin), modes in column order, then task, then bin."""
        groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        for i, t in enumerate(self.trajectories):
            groups[(t.mode, _task(t), length_bin(context_tokens(t)))].append(i)
        keys = sorted(groups, key=lambda k: (self._mode_order(k[0]), k[1], bin_order(k[2]), k[2]))
        return [self._summarize(*key, groups[key]) for key in keys]

    @cached_property
    def summaries(self) -> list[EvalRow]:
        """One row per mode over every task and length (pooled over examples, not averaged over rows)."""
        groups: dict[str, list[int]] = defaultdict(list)
        for i, t in enumerate(self.trajectories):
            groups[t.mode].append(i)
        return [
            self._summarize(mode, ALL, ALL, groups[mode]) for mode in sorted(groups, key=self._mode_order)
        ]

    def by_mode(self) -> dict[str, dict]:
        """``{mode: summary}`` (JSON-ready :class:`EvalRow` fields, task and length bin ``"all"``)."""
        return {row.mode: row.to_dict() for row in self.summaries}

    def per_completion(self, mode: str, metrics: Sequence[str]) -> dict[str, list]:
        """``{"<example id>#<sample>": [each of metrics]}`` for one mode (``metrics``: ``RewardBreakdown``
        fields, or ``kv_tokens``: the KV tokens the engine read for the completion): two evals of the same
        examples and seeds pair up by key (the paired GRPO - SFT differences)."""
        scores = {}
        for t, r, sample in zip(self.trajectories, self.rewards, self.samples):
            if t.mode == mode:
                values = [completion_kv_tokens(t) if m == "kv_tokens" else getattr(r, m) for m in metrics]
                scores[f"{t.example.get('id', '?')}#{sample}"] = values
        return scores

    @cached_property
    def samples(self) -> list[int]:
        """Which sample of its example under its mode each trajectory is (0, 1, ... in request order)."""
        seen, out = Counter(), []
        for t in self.trajectories:
            key = (str(t.example.get("id", "?")), t.mode)
            out.append(seen[key])
            seen[key] += 1
        return out

    def completions(self) -> list[dict]:
        """One JSON-ready record per completion, in request order (example-major, then mode, then sample):
        what the policy wrote and how it was graded and accounted. ``correct``: full marks (``accuracy`` is
        the reward's grade, partial for part-credit metrics); ``kv_tokens``: what the mode's engine read,
        ``kv_tokens_vanilla``: the same completion under causal attention; ``kv_tokens_per_layer``: under
        Selective Attention eviction what each layer read (``kv_tokens`` is their mean), else ``None``."""
        return [
            {
                "id": t.example.get("id"),
                "sample": sample,
                "task": _task(t),
                "mode": t.mode,
                "context_tokens": context_tokens(t),
                "question": t.example.get("question"),
                "references": t.example.get("answers"),
                "completion": t.completion_text,
                "answer": t.parsed.answer,
                "correct": r.accuracy == 1.0,
                "accuracy": r.accuracy,
                "compliance": r.compliance,
                "reasons": list(r.reasons),
                "focused_chunks": list(t.parsed.focused_chunks),
                "evidence_chunks": t.example.get("evidence_chunks"),
                "kv_tokens": _whole(completion_kv_tokens(t)),
                "kv_tokens_vanilla": int(t.trace.kv_tokens_vanilla.sum()),
                "kv_tokens_per_layer": t.kv_tokens_by_layer,
                "decode_steps": len(t.completion_ids),
                "finish_reason": t.finish_reason,
            }
            for t, r, sample in zip(self.trajectories, self.rewards, self.samples)
        ]

    def results(self) -> list[dict]:
        """The ``results`` list of an ``eval/<name>.json`` file (``RunWriter.write_eval``)."""
        return [row.to_dict() for row in self.rows]

    def to_json(self, step: int | None = None) -> dict:
        """A standalone eval file: the run-directory eval format plus the per-mode summaries and meta."""
        return {
            "step": step,
            "time": time.time(),
            **self.meta,
            "modes": list(self.modes),
            "wall_time_s": self.wall_time_s,
            "results": self.results(),
            "by_mode": self.by_mode(),
        }

    def by_task_table(self, title: str = "Eval: accuracy by task and context length"):
        """A rich ``Table``, one line per (task, length bin): every mode's accuracy side by side (the paper's
        columns) and the KV tokens `da` read per example. Narrow enough for an 80-column console: the
        cells' other numbers are in the eval file (:meth:`results`)."""
        from rich.table import Table

        cells = {(row.task, row.length_bin, row.mode): row for row in self.rows}
        lines = sorted(
            {(row.task, row.length_bin) for row in self.rows}, key=lambda k: (k[0], bin_order(k[1]))
        )
        modes = [row.mode for row in self.summaries]
        table = Table(title=title, title_justify="left")
        table.add_column("task", no_wrap=True)
        table.add_column("context", no_wrap=True)
        for name in ("n", *modes, *(["da KV\nper ex."] if "da" in modes else [])):
            table.add_column(name, justify="right", no_wrap=True)
        for task, label in lines:
            mine = [cells.get((task, label, mode)) for mode in modes]
            n = next(row.n for row in mine if row is not None)
            accuracy = [_fmt(None if row is None else row.accuracy, "{:.3f}") for row in mine]
            da = cells.get((task, label, "da"))
            reads = (
                [_fmt(None if da is None else da.kv_tokens_per_example, "{:,.0f}")] if "da" in modes else []
            )
            table.add_row(task, label, str(n), *accuracy, *reads)
        return table

    def summary_table(self, title: str = "Eval"):
        """A rich ``Table`` of what each mode answered, over every task and length: narrow enough for an
        80-column console, like :meth:`reads_table` beside it."""
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        terms = list(dict.fromkeys(name for row in self.summaries for name in row.terms))  # registered
        for name in ("mode", "n", "acc", "RULER", "compl.", "cover.", *terms, "trunc/err"):
            table.add_column(name, justify="left" if name == "mode" else "right", no_wrap=True)
        for row in self.summaries:
            table.add_row(
                row.mode, str(row.n), _fmt(row.accuracy, "{:.3f}"), _fmt(row.accuracy_ruler, "{:.3f}"),
                _fmt(row.compliance, "{:.3f}"), _fmt(row.coverage, "{:.3f}"),
                *(_fmt(row.terms.get(name), "{:.3f}") for name in terms), f"{row.truncated}/{row.errors}",
            )  # fmt: skip
        return table

    def reads_table(self, title: str = "Eval: KV reads"):
        """A rich ``Table`` of what each mode read, over every task and length: KV tokens per example under
        the mode's engine and under causal attention, the saving between them, generated tokens per
        example and the mode mix. Narrow enough for an 80-column console."""
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        mix_header = "/".join(m[0] for m in mode_names()) + " %"
        for name in ("mode", "KV read/ex", "vanilla/ex", "KV saved", "steps", mix_header):
            table.add_column(name, justify="left" if name == "mode" else "right", no_wrap=True)
        for row in self.summaries:
            mix = "/".join(_fmt(row.mode_mix[m], "{:.0f}", scale=100) for m in mode_names())
            table.add_row(
                row.mode, f"{row.kv_tokens_per_example:,.0f}", f"{row.kv_tokens_vanilla_per_example:,.0f}",
                _fmt(row.kv_saving, "{:.1%}"), f"{row.decode_steps:.1f}", mix,
            )  # fmt: skip
        return table

    def _mode_order(self, mode: str) -> int:
        return self.modes.index(mode) if mode in self.modes else len(self.modes)

    def _summarize(self, mode: str, task: str, label: str, indices: list[int]) -> EvalRow:
        ts = [self.trajectories[i] for i in indices]
        rs = [self.rewards[i] for i in indices]
        kv_read = sum(completion_kv_tokens(t) for t in ts)
        kv = round(kv_read)
        kv_vanilla = sum(int(t.trace.kv_tokens_vanilla.sum()) for t in ts)
        mix = Counter(m for t in ts for m in predicted_modes(t))
        generated = sum(mix.values())
        return EvalRow(
            mode=mode,
            task=task,
            length_bin=label,
            n=len(ts),
            accuracy=_mean([r.accuracy for r in rs]),
            accuracy_ruler=_mean([r.accuracy_ruler for r in rs]),
            compliance=_mean([r.compliance for r in rs]),
            coverage=_mean_known([r.coverage for r in rs]),
            kv_saving=1.0 - kv / kv_vanilla if kv_vanilla else None,
            kv_tokens=kv,
            kv_tokens_vanilla=kv_vanilla,
            kv_tokens_per_example=kv_read / len(ts),
            kv_tokens_vanilla_per_example=kv_vanilla / len(ts),
            decode_steps=_mean([len(t.completion_ids) for t in ts]),
            mode_mix={m: mix[m] / generated if generated else None for m in mode_names()},
            truncated=sum(t.finish_reason == "length" for t in ts),
            errors=sum(t.finish_reason == "error" for t in ts),
            kv_tokens_per_layer=_by_layer([t.kv_tokens_by_layer for t in ts], sum),
            kv_peak_per_layer=_by_layer([t.kv_peak_by_layer for t in ts], max),
            terms={name: _mean_known([r.value(name) for r in rs]) for name in _extra_names(rs)},
        )


def _by_layer(values: list[list[int] | None], combine) -> list[int] | None:
    """Per-layer counts of a group's completions combined layer by layer (``sum`` or ``max``) over those
    that have them (``None`` without Selective Attention eviction; a peak is ``None`` for a completion that
    decoded nothing); ``None`` when none has them."""
    present = [v for v in values if v is not None]
    return [combine(layer) for layer in zip(*present, strict=True)] if present else None


def completion_kv_tokens(t: Trajectory) -> float:
    """KV tokens the mode's engine read over every decoding step of ``t`` (a mean over layers under
    Selective Attention eviction, so not always whole)."""
    return float(t.kv_tokens_read.sum())


def run_requests(
    requests: Sequence[RolloutRequest],
    generate: Generate,
    *,
    modes: Sequence[str] | None = None,
    reward_config: RewardConfig | None = None,
) -> EvalReport:
    """Generate ``requests`` in one call, score them, and report."""
    requests = list(requests)
    started = time.perf_counter()
    trajectories = list(generate(requests))
    wall = time.perf_counter() - started
    if len(trajectories) != len(requests):
        raise RuntimeError(f"generate returned {len(trajectories)} trajectories for {len(requests)} requests")
    rewards = score_trajectories(trajectories, reward_config or DEFAULT_CONFIG).items
    modes = parse_modes(modes) if modes is not None else tuple(dict.fromkeys(r.mode for r in requests))
    return EvalReport(trajectories, rewards, modes, wall_time_s=wall)


def evaluate(
    examples: Iterable[Mapping],
    generate: Generate,
    tokenizer,
    *,
    layout: LayoutSettings = DEFAULT_LAYOUT,
    modes: Sequence[str] = ROLLOUT_MODES,
    max_tokens: int = 128,
    reward_config: RewardConfig | None = None,
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
) -> EvalReport:
    """Evaluate dataset rows under each mode: greedy, or ``samples`` completions at ``temperature``.

    ``generate`` is any engine's batch call: ``RolloutPool.generate``, ``VLLMEngine.generate`` or
    ``ReferenceEngine.generate`` (a list of requests in, one Trajectory each, in order, out).
    """
    modes = parse_modes(modes)
    requests = build_requests(
        examples, tokenizer, layout=layout, modes=modes, max_tokens=max_tokens, temperature=temperature,
        samples=samples, seed=seed,
    )  # fmt: skip
    return run_requests(requests, generate, modes=modes, reward_config=reward_config)


def eval_checkpoint(
    checkpoint: str | Path,
    data_dir: str | Path,
    *,
    split: str = "test",
    limit: int | None = None,
    modes: Sequence[str] = ROLLOUT_MODES,
    max_tokens: int = 128,
    num_actors: int = 1,
    block_size: int | None = None,
    thinking: bool | None = None,
    dtype: str | None = None,
    kv_cache_gib: float = 1.0,
    reward_config: RewardConfig | None = None,
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
    log_file: str | Path | None = None,
) -> EvalReport:
    """``heed eval``: a Ray rollout pool on ``checkpoint``, the split's rows, one report. ``log_file``: where
    the rollout actors' own output (vLLM's logs) goes instead of the console.

    Block size, thinking mode, layout and protocol version come from the checkpoint's ``heed.json`` (an
    export) or, for a checkpoint inside a run directory, from the run's ``config.yaml``
    (:func:`rl.policy_settings.checkpoint_settings`); passing a value that contradicts them is an error. A policy
    trained on protocol v1 is evaluated under v1 (its completions parsed as v1). A model folder that is
    neither (a model from a hub): 32, non-thinking, the instructions and the current protocol.
    """
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise EvalError(f"checkpoint {checkpoint} is not a model folder (no config.json)")
    modes = parse_modes(modes)
    check_sampling(temperature, samples)
    if num_actors < 1:
        raise EvalError(f"--num-actors must be at least 1, got {num_actors}")
    try:
        info = checkpoint_settings(checkpoint)
        settings = layout_settings(checkpoint, info, block_size=block_size, thinking=thinking)
    except SettingsError as err:
        raise EvalError(str(err)) from None

    rows = select_examples(load_split(data_dir, split), limit)
    if not rows:
        raise EvalError(f"split {split!r} of {data_dir} has no rows")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    try:
        requests = build_requests(
            rows, tokenizer, layout=settings, modes=modes, max_tokens=max_tokens, temperature=temperature,
            samples=samples, seed=seed,
        )  # fmt: skip
    except ValueError as err:  # a row that does not lay out (document longer than its chunk_tokens, ...)
        raise EvalError(str(err)) from None
    longest = max(r.layout.prompt_len for r in requests) + max_tokens
    max_model_len = math.ceil(longest / settings.block_size) * settings.block_size

    report = _run_on_pool(
        checkpoint, requests, modes, num_actors, settings.block_size, max_model_len, dtype, kv_cache_gib,
        reward_config, log_file,
    )  # fmt: skip
    report.meta = {
        "checkpoint": str(checkpoint),
        "data": str(data_dir),
        "split": split,
        "limit": limit,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "samples": samples,
        "seed": seed,
        **settings.to_dict(),
        "settings_from": (info or {}).get("settings_from", "defaults"),
        "source_step": (info or {}).get("source", {}).get("step"),
    }
    return report


def write_eval_json(report: EvalReport, path: str | Path, step: int | None = None) -> Path:
    """Write :meth:`EvalReport.to_json` whole (temporary file, then renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report.to_json(step), indent=1, allow_nan=False))
    tmp.replace(path)
    return path


def write_completions_jsonl(report: EvalReport, path: str | Path) -> Path:
    """Write :meth:`EvalReport.completions` as JSON lines, one completion a line (temporary file, then
    renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for record in report.completions():
            f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def _run_on_pool(
    checkpoint, requests, modes, num_actors, block_size, max_model_len, dtype, kv_cache_gib, reward_config,
    log_file=None,
) -> EvalReport:  # fmt: skip
    import ray
    import torch

    from rollouts.pool import ACTOR_LOG_ENV, PoolConfig, RolloutPool

    on_gpu = torch.cuda.is_available()
    engine_kwargs = {"max_model_len": max_model_len, "dtype": dtype or ("auto" if on_gpu else "float32")}
    if on_gpu:
        env = {"VLLM_USE_V2_MODEL_RUNNER": "0"}  # the V1 runner the DA plugin hooks (docs/serving.md)
    else:
        # bytes, not VLLM_CPU_KVCACHE_SPACE: vLLM reads that variable as whole GiB (0.5 would not start)
        engine_kwargs.update(enforce_eager=True, kv_cache_memory_bytes=int(kv_cache_gib * (1 << 30)))
        env = {}
    if log_file is not None:
        env[ACTOR_LOG_ENV] = str(Path(log_file).resolve())
    config = PoolConfig(
        str(checkpoint), num_actors=num_actors, block_size=block_size, engine_kwargs=engine_kwargs, env=env,
    )  # fmt: skip
    started_ray = not ray.is_initialized()
    pool = None
    try:
        pool = RolloutPool(config)
        return run_requests(requests, pool.generate, modes=modes, reward_config=reward_config)
    finally:
        if pool is not None:
            pool.shutdown()
        if started_ray:
            ray.shutdown()


def load_split(data_dir: str | Path, split: str) -> list[dict]:
    import datasets

    path = Path(data_dir)
    if not path.is_dir():
        raise EvalError(f"dataset folder {path} does not exist (build one with `heed data build`)")
    try:
        dataset = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise EvalError(f"{path} is not a saved dataset ({err})") from None
    if not isinstance(dataset, datasets.DatasetDict):
        raise EvalError(f"{path} holds a single Dataset; expected a DatasetDict with a {split!r} split")
    if split not in dataset:
        raise EvalError(f"{path} has no split {split!r}; it has {', '.join(dataset)}")
    return list(dataset[split])


def _task(t: Trajectory) -> str:
    return str(t.example.get("task", "unknown")) if isinstance(t.example, Mapping) else "unknown"


def _extra_names(rewards: Sequence[RewardBreakdown]) -> list[str]:
    """The registered reward terms these completions were scored with (rewards/terms.py), in order."""
    return list(dict.fromkeys(name for r in rewards for name, _ in r.extra))


def _mean_known(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not ``None``; ``None`` when none is."""
    known = [v for v in values if v is not None]
    return _mean(known) if known else None


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _whole(count: float) -> int | float:
    """A KV count as an int when it is whole (always, except under Selective Attention eviction)."""
    return int(count) if count.is_integer() else count


def _fmt(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "–" if value is None else fmt.format(value * scale)

"""The requests of an eval: which examples, modes and samples, laid out as training laid them out.

``heed eval`` (``rl/evaluate.py``) and the run's own evals build their rollout requests here, and the run
config checks its eval sampling with the same rule (:func:`check_sampling`). Every request is laid out by
``data.prompts.layout_example`` under the settings of its mode (``LayoutSettings.for_mode``: ``vanilla``
without the DA instructions), so an eval reads what training and serving read.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from data.prompts import layout_example
from rl.dashboard.records import length_bin
from rollouts.engines.base import RolloutRequest
from rollouts.protocol import DEFAULT_LAYOUT, LayoutSettings
from rollouts.trajectory import ROLLOUT_MODES


class EvalError(ValueError):
    """Bad eval input (checkpoint, data, split, modes); the message says what to change."""


def parse_modes(modes: str | Sequence[str]) -> tuple[str, ...]:
    """``"da,da-nm"`` (or a sequence) -> validated, de-duplicated modes in the order given."""
    names = [m.strip() for m in modes.split(",")] if isinstance(modes, str) else [str(m) for m in modes]
    names = [m for m in names if m]
    bad = [m for m in names if m not in ROLLOUT_MODES]
    if bad or not names:
        raise EvalError(f"modes must be a comma-separated subset of {','.join(ROLLOUT_MODES)}, got {modes!r}")
    return tuple(dict.fromkeys(names))


def select_examples(rows: Iterable[Mapping], limit: int | None = None) -> list[Mapping]:
    """At most ``limit`` rows per task, taken round-robin over its context-length bins (so every bin of a
    task is represented), in dataset order; every row when ``limit`` is ``None``."""
    rows = list(rows)
    if limit is None:
        return rows
    if limit < 1:
        raise EvalError(f"--limit must be at least 1, got {limit}")
    by_task: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, row in enumerate(rows):
        by_task[str(row.get("task"))][length_bin(int(row.get("context_tokens") or 0))].append(i)
    keep: list[int] = []
    for bins in by_task.values():
        queues = [list(reversed(q)) for q in bins.values()]
        taken = 0
        while taken < limit and any(queues):
            for q in queues:
                if q and taken < limit:
                    keep.append(q.pop())
                    taken += 1
    return [rows[i] for i in sorted(keep)]


def spread_rows(rows: Iterable[Mapping], n: int) -> list[Mapping]:
    """``n`` rows in all, dealt round-robin over the split's (task, target length) groups, each group in
    dataset order: a few rows that hold every task and length of the split, where its first ``n`` rows
    would be one task at one length (``heed data build`` writes a split group by group).

    >>> rows = [{"id": i, "task": t, "target_tokens": 130} for i, t in enumerate("aaabbb")]
    >>> [r["id"] for r in spread_rows(rows, 4)]
    [0, 1, 3, 4]
    """
    if n < 1:
        raise EvalError(f"asked for {n} rows; take at least 1")
    rows = list(rows)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[(row.get("task"), row.get("target_tokens"))].append(i)
    queues = [list(reversed(group)) for group in groups.values()]
    keep: list[int] = []
    while len(keep) < n and any(queues):
        for queue in queues:
            if queue and len(keep) < n:
                keep.append(queue.pop())
    return [rows[i] for i in sorted(keep)]


def build_requests(
    examples: Iterable[Mapping],
    tokenizer,
    *,
    layout: LayoutSettings = DEFAULT_LAYOUT,
    modes: Sequence[str] = ROLLOUT_MODES,
    max_tokens: int = 128,
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
) -> list[RolloutRequest]:
    """``samples`` requests per example and mode (example-major, then mode): ``da`` and ``da-nm`` on the
    example's DA layout, ``vanilla`` on the same layout without the DA instructions; greedy at temperature
    0, else sampled with seeds ``seed + i`` (``i``: the request's index). The layouts carry ``layout``'s
    protocol version, which the engines parse the completions with (a v1 export is read as v1)."""
    modes = parse_modes(modes)
    check_sampling(temperature, samples)
    if max_tokens < 1:
        raise EvalError(f"max_tokens must be at least 1, got {max_tokens}")
    requests = []
    for example in examples:
        row = dict(example)
        layouts = {}  # LayoutSettings -> the example's prompt under them (da and da-nm share one)
        for mode in modes:
            settings = layout.for_mode(mode)
            if settings not in layouts:
                layouts[settings] = layout_example(example, tokenizer, settings)
            prompt = layouts[settings]
            for _ in range(samples):
                requests.append(
                    RolloutRequest(
                        prompt, mode, example=row, max_tokens=max_tokens, temperature=temperature,
                        seed=(seed + len(requests)) % 2**31 if temperature > 0 else None,
                    )
                )  # fmt: skip
    return requests


def check_sampling(temperature: float, samples: int) -> None:
    """Greedy (temperature 0, one sample) or sampled (temperature > 0, any number of samples)."""
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise EvalError(f"temperature must be a finite number >= 0, got {temperature}")
    if samples < 1:
        raise EvalError(f"samples must be at least 1, got {samples}")
    if samples > 1 and temperature == 0:
        raise EvalError(
            f"{samples} samples at temperature 0 are one greedy completion {samples} times: set a temperature"
        )

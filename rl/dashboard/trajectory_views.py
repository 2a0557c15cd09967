"""Trajectories in the report: which ones to show, their mode-colored text, attention maps, a sample table.

Everything is read from the trajectory records; a record with wrong types gets a note in the page,
never an exception.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence

from rewards import shown as reward_shown
from rollouts.protocol import mode_names

from . import charts
from .attention_map import attention_map, check_against_trace
from .embed import figure_block
from .run_dir import Run

DEFAULT_TRAJECTORIES = 3
SAMPLE_TABLE_ROWS = 24


def _number(record: dict, *path: str) -> float:
    """A numeric field of a record (nested by ``path``), 0 when missing or not a number."""
    value = record
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else 0.0


def choose_trajectories(run: Run, ids: Sequence[str] = ()) -> list[dict]:
    """The records named by ``ids``; by default the best and worst reward at the latest step and the
    longest context there."""
    if ids:
        by_id = {t["id"]: t for t in run.trajectories}
        return [by_id[i] for i in ids if i in by_id]
    if not run.trajectories:
        return []
    last = max(t["step"] for t in run.trajectories)
    latest = [t for t in run.trajectories if t["step"] == last]
    picks = [
        max(latest, key=lambda t: _number(t, "reward", "total")),
        min(latest, key=lambda t: _number(t, "reward", "total")),
        max(latest, key=lambda t: _number(t, "context_tokens")),
    ]
    chosen: list[dict] = []
    for t in picks:
        if t["id"] not in {c["id"] for c in chosen}:
            chosen.append(t)
    return chosen[:DEFAULT_TRAJECTORIES]


def _colored_completion(record: dict) -> str:
    text = record.get("completion_text", "")
    spans, cursor = [], 0
    for seg in record.get("segments", []):
        start, end = seg["start"], seg["end"]
        if start > cursor:
            spans.append(html.escape(text[cursor:start]))
        label = seg["mode"] + (f" {seg['chunks']}" if seg["chunks"] else "")
        spans.append(
            f'<span class="mode-{html.escape(seg["mode"])}" title="{html.escape(label)}">'
            f"{html.escape(text[start:end])}</span>"
        )
        cursor = max(cursor, end)
    spans.append(html.escape(text[cursor:]))
    return "".join(spans)


def _trajectory_section_unsafe(record: dict, index: int) -> str:
    reward = record.get("reward") or {}
    facts = (
        f"step {record['step']} · task {html.escape(str(record.get('task')))} · "
        f"{record.get('context_tokens')} context "
        f"tokens · reward {reward.get('total', 0):.3f} · answer {html.escape(repr(record.get('answer')))} "
        f"(gold {html.escape(str(record.get('answers')))}) · "
        f"evidence chunks {record.get('evidence_chunks')} · "
        f"violations {[v['kind'] for v in record.get('violations', [])] or 'none'}"
    )
    try:
        amap = attention_map(record)
        mismatched = int((~check_against_trace(amap, record)).sum())
        note = (
            f'<p class="skipped">{mismatched} steps disagree with the recorded KV reads.</p>'
            if mismatched
            else ""
        )
        figure = figure_block(
            f"attention_map_{index}", charts.attention_map_figure(amap, f"Attention map: {record['id']}")
        )
    except (KeyError, ValueError, TypeError, IndexError) as err:
        note, figure = (
            f'<p class="skipped">No attention map: the record is inconsistent ({html.escape(str(err))}).</p>',
            "",
        )
    return (
        f'<section class="trajectory" data-id="{html.escape(record["id"])}">'
        f'<h3>{html.escape(record["id"])}</h3><p class="meta">{facts}</p>'
        f'<div class="completion">{_colored_completion(record)}</div>{note}{figure}</section>'
    )


def trajectory_section(record: dict, index: int) -> str:
    """A record the reader accepted can still hold wrong types; it gets a note, not a crash."""
    try:
        return _trajectory_section_unsafe(record, index)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        name = html.escape(str(record.get("id")))
        return f'<p class="skipped">Trajectory {name} could not be drawn: {html.escape(repr(err))}.</p>'


def record_mode_mix(record: dict) -> dict[str, float]:
    """Share of this completion's tokens by the mode they were predicted under."""
    modes = Counter(record["states"][i]["mode"] for i in record["predicted_state"])
    total = sum(modes.values())
    return {m: modes[m] / total if total else 0.0 for m in mode_names()}


def samples_table(run: Run) -> str:
    """The latest step's trajectories, one row each: rewards, mode mix, saving, violations, answer."""
    if not run.trajectories:
        return ""
    last = max(t["step"] for t in run.trajectories)
    rows = []
    for t in [t for t in run.trajectories if t["step"] == last][:SAMPLE_TABLE_ROWS]:
        try:
            mix = record_mode_mix(t)
            # what the engine read (under Selective Attention eviction not the DA trace); older records
            # carry only the trace
            da, vanilla = sum(t.get("kv_tokens_read") or t["kv_tokens"]), sum(t["kv_tokens_vanilla"])
        except (KeyError, TypeError, IndexError, AttributeError):
            continue  # the attention-map section below says what is wrong with it
        reward = t.get("reward") if isinstance(t.get("reward"), dict) else {}
        cells = [
            html.escape(t["id"]),
            html.escape(str(t.get("task"))),
            str(t.get("context_tokens")),
            *(f"{_number(reward, c):.3f}" for c in reward_shown()),
            *(f'<span class="mode-{m}">{mix[m]:.0%}</span>' for m in mode_names()),
            f"{1 - da / vanilla:.1%}" if vanilla else "–",
            html.escape(", ".join(v.get("kind", "?") for v in t.get("violations", [])) or "–"),
            html.escape(repr(t.get("answer"))),
        ]
        rows.append(
            f'<tr data-id="{html.escape(t["id"])}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "id",
            "task",
            "context",
            *("reward" if c == "total" else c for c in reward_shown()),
            *mode_names(),
            "KV saving",
            "violations",
            "answer",
        )
    )
    return f'<h3>Step {last} samples</h3><table class="samples"><tr>{head}</tr>{"".join(rows)}</table>'

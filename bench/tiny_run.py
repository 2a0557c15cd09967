"""The embedded default job, measured: held-out numbers after each phase and wall time per phase.

    .venv/bin/python -m bench.tiny_run [RUN_DIR] [CONFIG]

Runs ``heed train`` (CONFIG, default configs/tiny.yaml) into RUN_DIR (default ``runs/bench-tiny``) unless
RUN_DIR already holds a run (a finished one is summarized, an unfinished one refused), then prints what
``heed train`` prints at its end: the held-out ``da`` eval of the random model, after SFT and after GRPO
(accuracy, compliance, evidence coverage, KV-read saving, KV tokens read per example, mode mix), greedy and
sampled at the GRPO temperature, each with the paired GRPO - SFT differences and their standard errors
(KV tokens read per example too, with the change as a share of SFT's; runs recorded before the per-example
KV reads were kept have no paired KV line, only the table's per-example means), then the
``da-nm`` / ``vanilla`` accuracy and the wall time of every phase. The header names the machine the
run trained on, with its package versions, when the run recorded them (``environment.json``).

Beside the policies' reads it prints the floor RL is heading for: the KV tokens the cheapest correct
gold trace of each test example reads, next to the gold traces as the data wrote them, counted by the same
accounting (``trace_completion``) under the run's layout and protocol version, the end-of-sequence step
included. The cheapest form (data/traces.py strategies) is the gold's focus reads and its answer behind
the shortest plan naming the focused chunks (``plan``, inside ``<think>`` in thinking mode) or, before
protocol v5 and outside thinking mode, behind no plan at all (``direct``: v5 would choose that focus blind).
"""

from __future__ import annotations

import json
import platform
import re
import sys
import time
from pathlib import Path

from rich.console import Console

from rl.environment import this_cpu
from rl.summary import STAGES, before_after_table, difference_line

_FOCUS_READ = re.compile(r"<focus\b[^>]*>.*?</focus>", re.S)
_ANSWER = re.compile(r"<answer>.*?</answer>", re.S)


def direct_form(gold: str) -> str | None:
    """The gold trace with its plan and navigation dropped: its focus reads, then its answer (``None``
    when it has no focus or no answer: a survey or a bare answer has no cheaper form).

    >>> direct_form('<global>Chunk 5.</global>\\n<focus magic_chunks="5"> 63</focus>\\n<answer> 63</answer>')
    '<focus magic_chunks="5"> 63</focus>\\n<answer> 63</answer>'
    """
    reads, answer = _FOCUS_READ.findall(gold), _ANSWER.search(gold)
    return "\n".join([*reads, answer.group(0)]) if reads and answer else None


def plan_form(gold: str, chunks) -> str | None:
    """The gold trace read as ``plan`` does: the shortest plan naming ``chunks`` (the chunks its focus
    reads, from its parse), its focus reads, its answer, inside the gold's ``<think>`` block if it has
    one (``None`` where ``direct_form`` is).

    >>> plan_form('<global>The answer is in Chunk 5.</global>\\n<focus magic_chunks=" 5"> 63</focus>\\n<answer> 63</answer>', [5])
    '<global>Chunk 5.</global>\\n<focus magic_chunks=" 5"> 63</focus>\\n<answer> 63</answer>'
    """
    from data.traces import terse_where

    reads, answer = _FOCUS_READ.findall(gold), _ANSWER.search(gold)
    if not reads or not answer:
        return None
    body = "\n".join([f"<global>{terse_where(chunks)}</global>", *reads])
    return (
        f"<think>\n{body}\n</think>\n{answer.group(0)}"
        if gold.startswith("<think>")
        else f"{body}\n{answer.group(0)}"
    )


def by_length(state: dict, suffix: str = "") -> list[str]:
    """Accuracy and KV tokens read per example by context length (the ``lengths`` of the data build, read
    off the example ids ``task-LENGTH-split-index``), after SFT and after GRPO."""
    lines = []
    for stage in ("sft", "grpo"):
        values = state.get("eval_examples", {}).get(stage + suffix) or {}
        groups: dict[int, list[list]] = {}
        for key, row in values.items():
            groups.setdefault(int(key.split("-")[-3]), []).append(row)
        cells = []
        for length, rows in sorted(groups.items()):
            accuracy = sum(r[0] for r in rows) / len(rows)
            reads = [r[4] for r in rows if len(r) > 4]
            read = f", KV read/ex {sum(reads) / len(reads):,.0f}" if reads else ""
            cells.append(f"{length} tokens: acc {accuracy:.3f}{read} (n={len(rows)})")
        if cells:
            lines.append(f"by context length, {stage}: " + "; ".join(cells))
    return lines


def by_task(state: dict, run_dir: Path) -> list[str]:
    """Per task (read off the example ids): greedy ``da`` accuracy after SFT and after GRPO with the paired
    difference and its standard error, and after GRPO the ``da-nm`` / ``vanilla`` accuracy of the same
    examples (from ``RUN_DIR/eval/grpo.json``, whose rows are per task and length bin)."""
    examples = state.get("eval_examples", {})
    sft, grpo = examples.get("sft") or {}, examples.get("grpo") or {}
    tasks = sorted({key.rsplit("-", 3)[0] for key in grpo})
    unmasked: dict[tuple[str, str], list[float]] = {}
    report = run_dir / "eval" / "grpo.json"
    if report.is_file():
        for row in json.loads(report.read_text())["results"]:
            if row["mode"] != "da":
                cell = unmasked.setdefault((row["task"], row["mode"]), [0.0, 0])
                cell[0] += row["accuracy"] * row["n"]
                cell[1] += row["n"]
    lines = []
    for task in tasks:
        keys = sorted(k for k in grpo if k.rsplit("-", 3)[0] == task)
        after = [grpo[k][0] for k in keys]
        line = f"{task}: after GRPO {sum(after) / len(after):.3f} (n={len(after)})"
        paired = [k for k in keys if k in sft]
        if paired:
            before = [sft[k][0] for k in paired]
            diff = [grpo[k][0] - sft[k][0] for k in paired]
            mean = sum(diff) / len(diff)
            se = (sum((d - mean) ** 2 for d in diff) / max(len(diff) - 1, 1) / len(diff)) ** 0.5
            line += f", after SFT {sum(before) / len(before):.3f}, GRPO - SFT {mean:+.3f} ± {se:.3f}"
        for mode in ("da-nm", "vanilla"):
            total, n = unmasked.get((task, mode), (0.0, 0))
            if n:
                line += f"; {mode} {total / n:.3f}"
        lines.append(line)
    return lines


def gold_reads(run_dir: Path) -> tuple[float, float, int]:
    """Mean KV tokens read per test example by the gold traces as written and by their cheapest form."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from data.prompts import layout_example
    from rl.config import load_run_config
    from rollouts.masks import trace_completion
    from rollouts.protocol import token_bytes_table

    config = load_run_config(str(run_dir / "config.yaml"), [])
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    table, settings = token_bytes_table(tokenizer), config.run.prompt_layout()
    rows = load_from_disk(str(run_dir / "data"))[config.data.eval_split]
    written, cheapest = [], []
    for row in rows:
        layout = layout_example(row, tokenizer, settings)
        gold = row["gold_completion_thinking" if settings.thinking else "gold_completion"]

        def read(text: str, layout=layout, name=row["id"]):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            trace = trace_completion(layout, ids, table)
            if trace.parsed.violations:
                raise ValueError(
                    f"{name}: the gold form {text!r} breaks the protocol: {trace.parsed.violations}"
                )
            return trace

        as_written = read(gold)  # its parse names the chunks the cheaper forms focus
        cheaper = [plan_form(gold, as_written.parsed.focused_chunks)]
        if settings.protocol_version < 5 and not settings.thinking:
            cheaper.append(direct_form(gold))
        reads = [int(t.kv_tokens.sum()) for t in [as_written, *(read(f) for f in cheaper if f)]]
        written.append(reads[0])
        cheapest.append(min(reads))
    return sum(written) / len(written), sum(cheapest) / len(cheapest), len(written)


def main(run_dir: Path, config: str | None = None) -> None:
    if not (run_dir / "state.json").is_file():
        from rl.config import load_run_config
        from rl.train import train

        started = time.perf_counter()
        train(load_run_config(config, [f"run.output_dir={run_dir}"]))
        print(f"heed train wall time: {time.perf_counter() - started:.0f} s")
    elif "report" not in json.loads((run_dir / "state.json").read_text())["completed"]:
        sys.exit(f"{run_dir} holds an unfinished run: let it finish, or `heed train --resume {run_dir}`")
    state = json.loads((run_dir / "state.json").read_text())
    console = Console(width=120)
    print(f"machine: {platform.machine()}, {this_cpu()}, python {platform.python_version()}")
    environment = run_dir / "environment.json"  # where the run trained (rl/environment.py)
    if environment.is_file():
        env = json.loads(environment.read_text())
        packages = ", ".join(f"{k} {v}" for k, v in env["packages"].items())
        print(
            f"trained on: {env['cpu']}, {env['cores']} cores, simd {' '.join(env['simd']) or '-'}; {packages}"
        )
    print(f"run: {run_dir}")
    for suffix, what in (("", "greedy"), ("_sampled", "sampled at grpo.temperature")):
        table = before_after_table(state, suffix, title=f"held-out da, {what}")
        if table is not None:
            console.print(table)
            line = difference_line(state, suffix)
            if line:
                print(line)
            for line in by_length(state, suffix):
                print(line)
    for line in by_task(state, run_dir):
        print("by task, greedy da: " + line)
    written, cheapest, n = gold_reads(run_dir)
    print(
        f"gold traces, KV read per example (n={n}): as written {written:,.0f}, cheapest form {cheapest:,.0f}"
    )
    for stage, label in STAGES:
        by_mode = state["eval"].get(stage, {})
        others = ", ".join(f"{m} {by_mode[m]['accuracy']:.3f}" for m in ("da-nm", "vanilla") if m in by_mode)
        if others:
            print(f"accuracy {label}: {others}")
    walls = ", ".join(f"{k} {v:.0f} s" for k, v in state["wall_s"].items())
    print(f"wall time per phase: {walls}; total {sum(state['wall_s'].values()):.0f} s")


if __name__ == "__main__":
    main(
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench-tiny"),
        sys.argv[2] if len(sys.argv) > 2 else None,
    )

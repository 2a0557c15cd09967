"""The embedded default job, measured: held-out numbers after each phase and wall time per phase.

    .venv/bin/python -m bench.tiny_run [RUN_DIR] [CONFIG]

Runs ``heed train`` (CONFIG, default configs/tiny.yaml) into RUN_DIR (default ``runs/bench-tiny``) unless
RUN_DIR already holds a run (a finished one is summarized, an unfinished one refused), then prints what
``heed train`` prints at its end: the held-out ``da`` eval of the random model, after SFT and after GRPO
(accuracy, compliance, evidence coverage, KV-read saving, mode mix), greedy and sampled at the GRPO
temperature, each with the paired GRPO - SFT differences and their standard errors, then the
``da-nm`` / ``vanilla`` accuracy and the wall time of every phase. The header names the machine the
run trained on, with its package versions, when the run recorded them (``environment.json``).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from rich.console import Console

from rl.environment import this_cpu
from rl.summary import STAGES, before_after_table, difference_line


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

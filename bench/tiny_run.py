"""The embedded default job, measured: held-out numbers after each phase and wall time per phase.

    .venv/bin/python -m bench.tiny_run [RUN_DIR]

Runs ``heed train`` (configs/tiny.yaml) into RUN_DIR (default ``runs/bench-tiny``) unless RUN_DIR already
holds a run (a finished one is summarized, an unfinished one refused), then prints, for the random
model, after SFT and after GRPO, the ``da`` column of each held-out evaluation (accuracy, compliance,
evidence coverage, KV-read saving, mode mix) next to the ``da-nm`` / ``vanilla`` accuracy, the wall time
of every phase, and the GRPO-minus-SFT differences; the same for the sampled ``da`` evals after SFT and
GRPO when the run made them (``eval.sampled_samples``).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

STAGES = (("init", "random model"), ("sft", "after SFT"), ("grpo", "after GRPO"))
DA_COLUMNS = ("accuracy", "compliance", "coverage", "kv_saving", "mode_mix_focus", "decode_steps")


def main(run_dir: Path) -> None:
    if not (run_dir / "state.json").is_file():
        from rl.config import load_run_config
        from rl.train import train

        config = load_run_config(None, [f"run.output_dir={run_dir}"])
        started = time.perf_counter()
        train(config)
        print(f"heed train wall time: {time.perf_counter() - started:.0f} s")
    elif "report" not in json.loads((run_dir / "state.json").read_text())["completed"]:
        sys.exit(f"{run_dir} holds an unfinished run: let it finish, or `heed train --resume {run_dir}`")
    state = json.loads((run_dir / "state.json").read_text())
    print(
        f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}"
    )
    print(f"run: {run_dir}")
    header = f"{'':14}" + "".join(f"{c:>16}" for c in DA_COLUMNS) + f"{'acc da-nm':>12}{'acc vanilla':>13}"
    print("held-out eval, da mode (greedy):")
    print(header)
    for name, label in STAGES:
        by_mode = state["eval"].get(name)
        if not by_mode:
            continue
        others = f"{_fmt(by_mode.get('da-nm', {}).get('accuracy')):>12}{_fmt(by_mode.get('vanilla', {}).get('accuracy')):>13}"
        _print_row(label, by_mode["da"], others)
    _print_difference(state, "sft", "grpo")
    if "sft_sampled" in state["eval"] or "grpo_sampled" in state["eval"]:
        print("held-out eval, da mode (sampled at the GRPO temperature, eval.sampled_samples per example):")
        for name, label in (("sft_sampled", "after SFT"), ("grpo_sampled", "after GRPO")):
            if name in state["eval"]:
                _print_row(label, state["eval"][name]["da"])
        _print_difference(state, "sft_sampled", "grpo_sampled")
    walls = ", ".join(f"{k} {v:.0f} s" for k, v in state["wall_s"].items())
    print(f"wall time per phase: {walls}; total {sum(state['wall_s'].values()):.0f} s")


def _print_row(label: str, da: dict, others: str = "") -> None:
    cells = "".join(f"{_fmt(da.get(c)):>16}" for c in DA_COLUMNS)
    print(f"{label:14}{cells}{others}  (n={da['n']})")


def _print_difference(state: dict, before: str, after: str) -> None:
    if before in state["eval"] and after in state["eval"]:
        first, then = state["eval"][before]["da"], state["eval"][after]["da"]
        diffs = ", ".join(f"{c} {then[c] - first[c]:+.3f}" for c in ("accuracy", "compliance", "kv_saving"))
        print(f"GRPO - SFT: {diffs}")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench-tiny"))

"""What a person sees while `heed train` runs: Heed's phases, progress and results on the console, and
every framework's chatter in the run directory's log file.

- ``console`` is the one rich console Heed prints to. On a terminal it takes the terminal's width; piped
  into a file or a CI log (no terminal to measure) it is ``PIPED_WIDTH`` columns wide instead of rich's
  80 (``COLUMNS`` overrides it). Tables go through ``rl.tables.print_table``, which prints them whole
  whatever the console's width.
- :func:`route_framework_logs` sends the Python logging of vLLM, Ray, transformers, TRL, datasets,
  DeepSpeed, accelerate and wandb, and Python warnings, to ``RUN_DIR/logs/heed.log``; only their errors
  still reach the console. Rollout actors (other processes) write their own output to
  ``RUN_DIR/logs/rollout.log`` (``rollouts.pool.ACTOR_LOG_ENV``).
- :class:`ProgressLines` prints one line per trainer log step when the output is not a terminal (HF's
  tqdm bar would write carriage-return frames into the log); on a terminal the bar stays.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from transformers import TrainerCallback

PIPED_WIDTH = 100
LOG_DIR = "logs"
FRAMEWORK_LOGGERS = (
    "vllm", "ray", "transformers", "trl", "datasets", "deepspeed", "DeepSpeed", "accelerate", "urllib3",
    "filelock", "httpx", "py.warnings",
)  # fmt: skip
FILE_ONLY_LOGGERS = ("wandb",)  # its shutdown complains about its own closed service: not the run's errors


def interactive() -> bool:
    """Whether standard output is a terminal (progress bars) rather than a file or a pipe (lines)."""
    return sys.stdout.isatty()


console = Console(width=None if interactive() else int(os.environ.get("COLUMNS", PIPED_WIDTH)))


def route_framework_logs(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Send framework logging and Python warnings to ``RUN_DIR/logs/heed.log`` (or ``path``; errors also
    to the console); returns the log file's path. A framework imported later may add its own console
    handler (Ray does on import): call this again after it, which replaces the handlers instead of adding."""
    path = Path(path) if path is not None else Path(run_dir) / LOG_DIR / "heed.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    errors = logging.StreamHandler(sys.stderr)
    errors.setLevel(logging.ERROR)
    logging.captureWarnings(True)
    os.environ.setdefault("WANDB_SILENT", "true")  # wandb's own banner lines; its files still say it all
    if "DS_ACCELERATOR" not in os.environ:  # DeepSpeed warns on import that it fell back to the CPU
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()  # transformers keeps its own stderr handler
    hf_logging.set_verbosity_info()
    if not interactive():  # tqdm bars (checkpoint shards, datasets) write carriage-return frames
        hf_logging.disable_progress_bar()
        with contextlib.suppress(ImportError):
            import datasets

            datasets.disable_progress_bars()
    for name in (*FRAMEWORK_LOGGERS, *FILE_ONLY_LOGGERS):
        log = logging.getLogger(name)
        for handler in list(log.handlers):
            if getattr(handler, "_heed", False) or isinstance(handler, logging.StreamHandler):
                log.removeHandler(handler)
                if getattr(handler, "_heed", False) and isinstance(handler, logging.FileHandler):
                    handler.close()
        for handler in (to_file,) if name in FILE_ONLY_LOGGERS else (to_file, errors):
            handler._heed = True
            log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return path


def quiet_trainer(trainer):
    """Off a terminal, take HF's ``PrinterCallback`` (a raw dict per log step; it replaces the tqdm bar
    that ``disable_tqdm`` switched off) out of ``trainer``: :class:`ProgressLines` prints instead."""
    from transformers.trainer_callback import PrinterCallback

    if not interactive():
        trainer.remove_callback(PrinterCallback)
    return trainer


class ProgressLines(TrainerCallback):
    """One console line per trainer log step (step, loss, learning rate, ``extra`` logged numbers,
    seconds per step), for output that is not a terminal; e.g.
    ``sft step 40/360 loss 0.4120 lr 1.0e-03 0.41 s/step``."""

    def __init__(self, phase: str, extra: tuple[str, ...] = ()):
        self.phase, self.extra = phase, extra
        self._started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._started, self._first_step = time.perf_counter(), state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        steps = max(state.global_step - self._first_step, 1)
        per_step = (time.perf_counter() - self._started) / steps
        lr = f" lr {logs['learning_rate']:.1e}" if "learning_rate" in logs else ""
        extra = "".join(
            f" {k.rsplit('/', 1)[-1]} {logs[k]:.3f}"
            for k in self.extra
            if isinstance(logs.get(k), int | float)
        )
        console.print(
            f"{self.phase} step {state.global_step}/{state.max_steps} loss {logs['loss']:.4f}{lr}{extra} "
            f"{per_step:.2f} s/step",
            highlight=False,
        )

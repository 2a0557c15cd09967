"""The Hugging Face trainer callbacks of `heed train`: a checkpoint marked complete once every rank has
written it, a clean stop on SIGTERM, and the run directory's log lines."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from transformers import TrainerCallback

from rl.distributed import TrainerRanks
from rl.export import COMPLETE_MARKER


class CheckpointMarker(TrainerCallback):
    """Marks a checkpoint complete once the trainer has written all of it: every rank has written its
    part (rank 0 the weights, each rank its RNG state and, under ZeRO, its shards), then rank 0."""

    def __init__(self, ranks: TrainerRanks | None = None):
        self.ranks = ranks or TrainerRanks()

    def on_save(self, args, state, control, **kwargs):
        self.ranks.barrier()
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            tmp = path / (COMPLETE_MARKER + ".tmp")
            tmp.write_text(json.dumps({"step": state.global_step, "time": time.time()}))
            os.replace(tmp, path / COMPLETE_MARKER)


class StopOnSignal(TrainerCallback):
    """SIGTERM -> save a checkpoint at the end of this step and stop (every rank, when any got it)."""

    def __init__(self, ranks: TrainerRanks | None = None):
        self.received = False  # this process got SIGTERM
        self.stopped = False  # training stopped for it (on every rank)
        self.ranks = ranks or TrainerRanks()

    def on_step_end(self, args, state, control, **kwargs):
        if self.ranks.any(self.received):
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
        return control


class RunDirLogger(TrainerCallback):
    """Appends a Hugging Face trainer's log lines to the run directory (copy warm-up and SFT phases)."""

    def __init__(self, writer, phase: str):
        self.writer, self.phase = writer, phase

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            numbers = {k: v for k, v in logs.items() if isinstance(v, int | float)}
            self.writer.log_metrics(state.global_step, self.phase, numbers)

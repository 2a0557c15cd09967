"""Where a GRPO step's time goes: the metrics that say whether rollouts, the weight sync, rewards or the
trainer's own compute bound a step (what decides, for instance, whether asynchronous rollouts would pay).

Each logged GRPO step carries, in seconds (``timing/*`` in ``metrics.jsonl``, ``heed/timing/*`` in wandb):

- ``step_s``: the optimizer step, from the trainer's step start to its end (rollouts included);
- ``optimizer_s``: ``optimizer.step()`` alone;
- ``generate_s``, ``reward_s``: the pool's generation of the step's batch and its scoring (with the batch's
  other rollout metrics, when the step generated one);
- ``weight_sync/seconds`` (already logged by the sync itself): the push to the engines before generating.

What is left of ``step_s`` is the trainer's forward and backward passes (the old-policy and reference
forwards included). These are wall times on rank 0; other ranks wait at the same collectives.
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


class StepTimer(TrainerCallback):
    """``timing/step_s`` and ``timing/optimizer_s`` of the latest optimizer step, in ``last``."""

    def __init__(self):
        self.last: dict[str, float] = {}
        self._started = self._optimizer_started = self._optimizer_s = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._started, self._optimizer_s = time.perf_counter(), 0.0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._optimizer_started = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._optimizer_s += time.perf_counter() - self._optimizer_started

    def on_step_end(self, args, state, control, **kwargs):
        self.last = {
            "timing/step_s": time.perf_counter() - self._started,
            "timing/optimizer_s": self._optimizer_s,
        }

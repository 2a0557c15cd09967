"""Which prompts each GRPO step trains on: a context-length schedule and a task mix, reproducibly.

Generation batch ``k`` (one per optimizer step in the default set-up) draws ``prompts_per_batch``
distinct examples with a generator seeded by ``(seed, k)``: only examples whose ``context_tokens``
fit the schedule's stage for that step are eligible (a stage covers optimizer steps up to and including its
``until_step``; batch ``k`` feeds step ``k * steps_per_batch + 1``), and each task's share follows ``task_mix`` (an
empty mix keeps the dataset's natural proportions). Because batch ``k`` depends on nothing but
``(seed, k)``, a resumed run that skips the first ``k`` batches sees exactly the prompts the
uninterrupted run would have seen — no repeats, no gaps.

The order honours TRL's ``RepeatSampler`` contract: each prompt ``num_generations`` times in a row
(one GRPO group), and the whole generation batch ``repeat_count`` times (TRL reuses one generation for
``num_iterations * steps_per_generation`` optimizer passes and expects the dataloader to repeat it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from torch.utils.data import Sampler

from rl.config.sections import ContextStage


class CurriculumSampler(Sampler[int]):
    """Dataset indices for GRPO, batch by batch (see the module docstring)."""

    def __init__(
        self,
        tasks: Sequence[str],  # [N] task of each dataset row
        context_tokens: Sequence[int],  # [N] context length of each dataset row
        *,
        prompts_per_batch: int,
        num_generations: int,
        num_batches: int,
        repeat_count: int = 1,
        steps_per_batch: float = 1.0,  # optimizer steps each generation batch covers (for the schedule)
        schedule: Sequence[ContextStage] = (),
        task_mix: Mapping[str, float] | None = None,
        seed: int = 0,
    ):
        if len(tasks) != len(context_tokens):
            raise ValueError(f"{len(tasks)} tasks but {len(context_tokens)} context lengths")
        self.tasks = np.asarray(tasks)
        self.context_tokens = np.asarray(context_tokens)
        self.prompts_per_batch, self.num_generations = prompts_per_batch, num_generations
        self.num_batches, self.repeat_count = num_batches, repeat_count
        self.steps_per_batch, self.schedule, self.seed = steps_per_batch, list(schedule), seed
        self.task_mix = dict(task_mix or {})
        unknown = sorted(set(self.task_mix) - set(self.tasks.tolist()))
        if unknown:
            raise ValueError(
                f"curriculum.task_mix names tasks the training data does not have: {unknown} "
                f"(it has {sorted(set(self.tasks.tolist()))})"
            )
        for stage in self.schedule or [ContextStage(None, math.inf)]:
            eligible = int(self._weights(stage.max_context_tokens).astype(bool).sum())
            if eligible < prompts_per_batch:
                raise ValueError(
                    f"curriculum stage until step {stage.until_step} (max_context_tokens="
                    f"{stage.max_context_tokens}) leaves {eligible} eligible prompts, fewer than the "
                    f"{prompts_per_batch} each step needs: raise max_context_tokens or add data"
                )

    def max_context_tokens(self, step: float) -> float:
        for stage in self.schedule:
            if stage.until_step is None or step < stage.until_step:
                return stage.max_context_tokens
        return math.inf

    def _weights(self, max_context_tokens: float) -> np.ndarray:
        """``[N]`` sampling weights: 0 for rows over the length limit or with a zero task weight."""
        eligible = self.context_tokens <= max_context_tokens
        if not self.task_mix:
            return eligible.astype(float)
        counts = Counter(self.tasks[eligible].tolist())
        per_row = [self.task_mix.get(t, 0.0) / counts[t] if counts[t] else 0.0 for t in self.tasks.tolist()]
        return np.where(eligible, per_row, 0.0)

    def batch(self, k: int) -> list[int]:
        """The distinct dataset indices of generation batch ``k``."""
        weights = self._weights(self.max_context_tokens(k * self.steps_per_batch))
        rng = np.random.default_rng([self.seed, k])
        return rng.choice(
            len(weights), self.prompts_per_batch, replace=False, p=weights / weights.sum()
        ).tolist()

    def __iter__(self) -> Iterator[int]:
        for k in range(self.num_batches):
            chosen = self.batch(k)
            for _ in range(self.repeat_count):
                for index in chosen:
                    yield from [index] * self.num_generations

    def __len__(self) -> int:
        return self.num_batches * self.prompts_per_batch * self.num_generations * self.repeat_count

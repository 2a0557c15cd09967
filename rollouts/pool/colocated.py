"""The rollout pool of a colocated run: engines that sleep whenever the trainer needs the GPU."""

from __future__ import annotations


class ColocatedPool:
    """The rollout pool of a colocated run (``cluster.colocate``): its engines share the trainer ranks'
    GPUs and sleep whenever they are not taking weights or generating, so SFT, evals' trainer side and
    every optimizer step have the GPU. Per GRPO step: wake, weights in, generate, sleep. Everything
    else is the pool's."""

    def __init__(self, pool, level: int = 1):
        self.pool, self.level = pool, level
        self.pool.sleep(level)  # from the start: SFT (or the first step) comes before any rollout
        self.asleep = True

    def __getattr__(self, name):
        return getattr(self.pool, name)

    def _awake(self) -> None:
        if self.asleep:
            self.pool.wake_up()
            self.asleep = False

    def update_weights(self, weights):
        self._awake()
        return self.pool.update_weights(weights)

    def generate(self, requests):
        self._awake()
        try:
            return self.pool.generate(requests)
        finally:
            self.pool.sleep(self.level)
            self.asleep = True

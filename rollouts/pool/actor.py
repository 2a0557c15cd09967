"""One rollout engine in one Ray actor process, and how the driver reads the errors its calls raise.

:class:`RolloutActor` is what the pool starts in every bundle of its placement group
(``ray.remote(RolloutActor)``): it owns a vLLM engine with the DA plugin, or the transformers reference
engine, and answers the pool's calls (generate, load or receive weights, sleep). It runs vLLM in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) without CPU pinning, so actors share cores fairly; its stdout and
stderr go to the file ``HEED_ACTOR_LOG`` names, when set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from rollouts.engines.base import RolloutRequest
from rollouts.trajectory import Trajectory

ACTOR_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
ACTOR_LOG_ENV = "HEED_ACTOR_LOG"  # set in an actor's environment: its stdout and stderr go to this file


def _log_to_file(path: str | None) -> None:
    """Point this process's stdout and stderr (the engine's logs and warnings) at ``path``, appending.
    Its errors still reach the driver: Ray raises them there as exceptions."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        os.dup2(log, stream.fileno())
    os.close(log)


class RolloutActor:
    """One engine in one Ray actor process: vLLM, or the transformers reference engine (``engine``)."""

    def __init__(self, model: str, block_size: int, engine_kwargs: dict[str, Any], engine: str = "vllm"):
        _log_to_file(os.environ.get(ACTOR_LOG_ENV))
        if engine == "reference":  # the oracle; Selective Attention too
            from rollouts.engines.reference import ReferenceEngine

            mode = engine_kwargs.get("logprobs_mode", "raw_logprobs")  # the only vLLM argument it takes
            self.engine = ReferenceEngine(model, num_threads=1, logprobs_mode=mode)
            return
        from rollouts.engines.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model, block_size=block_size, **engine_kwargs)

    def generate(self, requests: list[RolloutRequest]) -> list[Trajectory]:
        trajectories = self.engine.generate(requests)
        for trajectory in trajectories:
            trajectory.extra["actor_pid"] = os.getpid()
        return trajectories

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.engine.load_weights(weights)

    def join_weight_sync(
        self, host: str, port: int, world_size: int, rank_offset: int, backend: str, timeout_s: float
    ) -> list[int]:
        from rollouts.weight_sync import engine_join, engine_leave

        engine_leave(self.engine.llm)  # a previous group's channel, if any
        return engine_join(
            self.engine.llm, host, port, world_size, rank_offset, backend=backend, timeout_s=timeout_s
        )

    def receive_weights(self) -> list[dict[str, Any]]:
        from rollouts.weight_sync import engine_receive

        return engine_receive(self.engine.llm)

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, level: int = 1) -> None:
        """Free the GPU (engine started with ``enable_sleep_mode``): level 1 moves the weights to host
        memory and drops the KV cache; level 2 drops the weights too."""
        self.engine.llm.sleep(level=level)

    def wake_up(self) -> None:
        self.engine.llm.wake_up()


def is_rejection(err: Exception) -> bool:
    """A request the engine refused at submission: the engine itself is fine."""
    from ray.exceptions import RayTaskError

    cause = err.cause if isinstance(err, RayTaskError) else err
    return type(cause).__name__ in ("VLLMValidationError", "LayoutError")


def error_reason(err: Exception) -> str:
    """The error of an actor call as one line: the remote cause's type, and its message's first and last
    lines (a message that embeds a traceback says what failed last; one that ends in advice, as torch's
    compiler errors do, says it first).

    >>> error_reason(ValueError("bad budget"))
    'ValueError: bad budget'
    >>> error_reason(RuntimeError("backend='inductor' raised:\\nCompilationError\\n\\nsuppress_errors = True"))
    "RuntimeError: backend='inductor' raised: ... suppress_errors = True"
    """
    from ray.exceptions import RayTaskError

    cause = err.cause if isinstance(err, RayTaskError) and err.cause is not None else err
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    message = " ... ".join(dict.fromkeys(lines[:1] + lines[-1:]))  # one line when first is last
    return f"{type(cause).__name__}: {message}"[:500]

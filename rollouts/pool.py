"""The Ray rollout pool: N actors, each owning a vLLM engine with the DA plugin, behind one generate().

``RolloutPool.generate(requests)`` returns exactly one Trajectory per request, in request order:

- Requests are packed into one shard per actor, balanced by token budget (prompt + max new tokens,
  longest first onto the least loaded actor). Each shard is one remote call, decoded as one vLLM
  batch; a shard's results are accepted once, when its call succeeds — so nothing is duplicated.
- A call that fails is retried, never lost: if the actor died it is replaced by a fresh one (loaded
  with the latest weights) and the shard resubmitted; a failing shard is split in halves, so one bad
  request cannot keep failing its neighbours. A request that has failed ``max_attempts`` times comes
  back as a failed Trajectory (``finish_reason="error"``, ``error`` saying why) instead of an exception
  that would kill the RL step.
- Weights: ``update_weights`` puts the tensors in Ray's object store once; every actor loads them with
  vLLM's ``reload_weights`` (the CPU path, DESIGN.md "Facts measured") and drops its prefix cache.
  Replacement actors load the latest weights before their first shard. (GPU pools should broadcast
  through a group of their own as OpenRLHF/TRL do: ``rollouts/weight_sync.py`` builds that group,
  tested with gloo on CPU; wiring it into this pool is not done yet.)

Local Ray by default; ``ray_address`` joins an existing cluster. Each actor runs vLLM in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) without CPU pinning, so actors share cores fairly.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rollouts.engines.base import RolloutRequest, build_trajectory
from rollouts.trajectory import Trajectory

logger = logging.getLogger(__name__)

ACTOR_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass
class PoolConfig:
    """How many engines, on which model, and how hard to retry."""

    model: str  # model path (loaded by every actor)
    num_actors: int = 2  # vLLM engines, one per Ray actor
    block_size: int = 32  # KV block size; layouts must be built with it
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # extra vllm.LLM arguments
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the actors
    num_cpus_per_actor: float = 1.0  # Ray CPU resource each actor reserves
    num_gpus_per_actor: float = 0.0  # Ray GPU resource each actor reserves (1 per engine on a GPU node)
    max_attempts: int = 3  # tries per request before it is returned as a failed trajectory
    max_actor_restarts: int = 8  # replacements over the pool's lifetime before giving up
    ray_address: str | None = None  # None: start or reuse a local Ray; else an existing cluster

    def __post_init__(self):
        if self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {self.num_actors}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")


class RolloutActor:
    """One vLLM engine in one Ray actor process."""

    def __init__(self, model: str, block_size: int, engine_kwargs: dict[str, Any]):
        from rollouts.engines.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model, block_size=block_size, **engine_kwargs)

    def generate(self, requests: list[RolloutRequest]) -> list[Trajectory]:
        trajectories = self.engine.generate(requests)
        for trajectory in trajectories:
            trajectory.extra["actor_pid"] = os.getpid()
        return trajectories

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.engine.load_weights(weights)

    def pid(self) -> int:
        return os.getpid()


@dataclass
class _Shard:
    indices: list[int]  # positions in the caller's request list
    attempts: int = 0  # failed tries so far (every request in the shard shares them)


class RolloutPool:
    """N vLLM engines behind one ``generate``; see the module docstring for the guarantees."""

    def __init__(self, config: PoolConfig):
        import ray
        from transformers import AutoTokenizer

        from rollouts.protocol.tokens import token_bytes_table

        self.config = config
        if not ray.is_initialized():
            ray.init(address=config.ray_address, include_dashboard=False, ignore_reinit_error=True)
        self._actor_cls = ray.remote(
            num_cpus=config.num_cpus_per_actor, num_gpus=config.num_gpus_per_actor, max_restarts=0
        )(RolloutActor)
        self._weights = None  # ObjectRef of the latest weights, for replacement actors
        self.restarts = 0
        self.actors = [self._start_actor() for _ in range(config.num_actors)]
        ray.get([a.pid.remote() for a in self.actors])  # surface engine start-up errors here
        # failed trajectories are built here, so the driver needs the model's token table too
        self.token_table = token_bytes_table(AutoTokenizer.from_pretrained(config.model))

    def _start_actor(self):
        options = {"runtime_env": {"env_vars": {**ACTOR_ENV, **self.config.env}}}
        actor = self._actor_cls.options(**options).remote(
            self.config.model, self.config.block_size, self.config.engine_kwargs
        )
        if self._weights is not None:
            actor.load_weights.remote(self._weights)  # queued before any shard it will receive
        return actor

    def _replace_actor(self, slot: int) -> None:
        import ray

        if self.restarts >= self.config.max_actor_restarts:
            raise RuntimeError(
                f"rollout actors died {self.restarts} times; giving up (raise max_actor_restarts if expected)"
            )
        self.restarts += 1
        ray.kill(self.actors[slot], no_restart=True)  # a task error may leave a live but broken engine
        self.actors[slot] = self._start_actor()
        logger.warning("rollout actor %d replaced (%d replacements so far)", slot, self.restarts)

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Load new policy weights (HF checkpoint names) into every actor; returns when all have them."""
        import ray

        items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
        items = [(name, t.detach().to("cpu", copy=True)) for name, t in items]
        self._weights = ray.put(items)
        ray.get([a.load_weights.remote(self._weights) for a in self.actors])

    def generate(self, requests: Sequence[RolloutRequest]) -> list[Trajectory]:
        """One Trajectory per request, in order; failures come back as error trajectories."""
        import ray
        from ray.exceptions import RayActorError

        requests = list(requests)
        results: list[Trajectory | None] = [None] * len(requests)
        in_flight: dict[Any, tuple[int, _Shard]] = {}  # ObjectRef -> (actor slot, shard)

        def submit(shard: _Shard, slot: int | None = None) -> None:
            if slot is None:  # the actor with the fewest calls in flight
                busy = [0] * len(self.actors)
                for s, _ in in_flight.values():
                    busy[s] += 1
                slot = busy.index(min(busy))
            ref = self.actors[slot].generate.remote([requests[i] for i in shard.indices])
            in_flight[ref] = (slot, shard)

        for slot, indices in enumerate(self._balance(requests)):
            if indices:
                submit(_Shard(indices), slot)

        while in_flight:
            (ref,), _ = ray.wait(list(in_flight), num_returns=1)
            slot, shard = in_flight.pop(ref)
            try:
                trajectories = ray.get(ref)
            except Exception as err:
                reason = _reason(err)
                actor_died = isinstance(err, RayActorError)
                if actor_died or not _is_rejection(err):
                    self._replace_actor(slot)  # dead, or its engine may be broken mid-step
                    for other_ref, (other_slot, _) in list(in_flight.items()):
                        if other_slot == slot and not ray.wait([other_ref], timeout=0)[0]:
                            submit(in_flight.pop(other_ref)[1])  # queued on the replaced actor: move it
                self._retry(shard, reason, requests, results, submit, final=_is_rejection(err))
                continue
            for i, trajectory in zip(shard.indices, trajectories):
                results[i] = trajectory
        return results  # type: ignore[return-value]  (every slot is filled by now)

    def _retry(self, shard: _Shard, reason: str, requests, results, submit, final: bool = False) -> None:
        """Split a failed shard in halves and resubmit; a lone request out of attempts (or refused by
        the engine, ``final``: that does not change on retry) becomes a failed trajectory."""
        attempts = shard.attempts + 1
        if len(shard.indices) == 1 and (final or attempts >= self.config.max_attempts):
            i = shard.indices[0]
            logger.error("rollout request %d failed %d times: %s", i, attempts, reason)
            results[i] = build_trajectory(
                requests[i], [], None, self.token_table, finish_reason="error", error=reason
            )
            return
        half = (len(shard.indices) + 1) // 2
        for part in (shard.indices[:half], shard.indices[half:]):
            if part:
                submit(_Shard(part, attempts))

    def _balance(self, requests: list[RolloutRequest]) -> list[list[int]]:
        """Indices per actor: longest requests first, each onto the least loaded actor."""
        loads = [0] * len(self.actors)
        shards: list[list[int]] = [[] for _ in self.actors]
        cost = [r.layout.prompt_len + r.num_tokens for r in requests]
        for i in sorted(range(len(requests)), key=lambda i: -cost[i]):
            slot = loads.index(min(loads))
            shards[slot].append(i)
            loads[slot] += cost[i]
        return [sorted(s) for s in shards]

    def shutdown(self) -> None:
        """Stop the actors (the local Ray instance stays up for the caller to shut down)."""
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []


def _is_rejection(err: Exception) -> bool:
    """A request the engine refused at submission: the engine itself is fine."""
    from ray.exceptions import RayTaskError

    cause = err.cause if isinstance(err, RayTaskError) else err
    return type(cause).__name__ in ("VLLMValidationError", "LayoutError")


def _reason(err: Exception) -> str:
    from ray.exceptions import RayTaskError

    cause = err.cause if isinstance(err, RayTaskError) and err.cause is not None else err
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"[
        :500
    ]

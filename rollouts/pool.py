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
- Weights (``PoolConfig.weight_sync``): ``update_weights`` returns when every actor has them, with
  :class:`~rollouts.weight_sync.SyncStats` (tensors, bytes, seconds), and every actor drops its prefix
  cache (KV written by the old weights). Either way every actor is pinged first: one that died since
  the last call (between two RL steps) is replaced before the weights go out.

  ``"object_store"`` (default, CPU): the tensors go to Ray's object store once; every actor loads them
  with vLLM's ``reload_weights`` (the CPU path, DESIGN.md "Facts measured").

  ``"broadcast"`` (GPU pools): the driver — the trainer's rank 0 — broadcasts the tensors to every
  engine worker over a group of their own (``rollouts/weight_sync.py``: NCCL when the tensors are
  CUDA, gloo on CPU), as OpenRLHF/TRL do. Engines start with the receiver worker extension; the group
  is formed on the first update (its backend follows the tensors' device) at a port the driver binds,
  on 127.0.0.1 when every Ray node is the driver's machine, else on the driver's Ray node IP. Before
  each update every actor is pinged: a dead one is replaced, one that does not answer within
  ``weight_sync_timeout_s`` (busy or hung) fails the update with ``WeightSyncTimeout`` naming it;
  forming the group and each broadcast run under the same limit, so nothing hangs. A failed update
  drops the group; the next one forms a new one.

  Replacement actors (below) load the latest weights before their first shard: with the object
  store, its copy; with broadcast, a CPU copy the driver keeps of the last update (put in the object
  store only when a replacement needs it; not kept when ``max_actor_restarts=0``). A replacement is
  not in the broadcast group, so the next update re-forms the group (new port, every actor rejoins)
  before sending.

Local Ray by default; ``ray_address`` joins an existing cluster. Each actor runs vLLM in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) without CPU pinning, so actors share cores fairly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rollouts.engines.base import RolloutRequest, build_trajectory
from rollouts.trajectory import Trajectory
from rollouts.weight_sync import WORKER_EXTENSION, SyncStats, WeightSyncError, WeightSyncTimeout

logger = logging.getLogger(__name__)

ACTOR_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
WEIGHT_SYNC_MODES = ("object_store", "broadcast")


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
    # How update_weights reaches the engines: "object_store" (Ray's object store; CPU) or "broadcast"
    # (trainer rank 0 -> engine workers over NCCL, gloo on CPU); see the module docstring.
    weight_sync: str = "object_store"
    weight_sync_timeout_s: float = 300.0  # broadcast: limit for actors to answer, join and take one update

    def __post_init__(self):
        if self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {self.num_actors}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.weight_sync not in WEIGHT_SYNC_MODES:
            raise ValueError(
                f"weight_sync must be one of {', '.join(map(repr, WEIGHT_SYNC_MODES))}; got {self.weight_sync!r}"
            )
        if not self.weight_sync_timeout_s > 0:
            raise ValueError(f"weight_sync_timeout_s must be > 0, got {self.weight_sync_timeout_s}")
        if self.weight_sync == "broadcast" and "worker_extension_cls" in self.engine_kwargs:
            raise ValueError(
                "engine_kwargs.worker_extension_cls: weight_sync='broadcast' sets it to the weight "
                f"receiver ({WORKER_EXTENSION}); remove it"
            )

    @property
    def receivers_per_actor(self) -> int:
        """Engine workers per actor (each joins the broadcast group): tensor x pipeline parallel size."""
        kw = self.engine_kwargs
        return int(kw.get("tensor_parallel_size", 1)) * int(kw.get("pipeline_parallel_size", 1))


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
        self._latest = None  # broadcast: CPU copy of the latest weights, put in the store when needed
        self._sender = None  # broadcast: the WeightSender of the current group
        self._members: list[Any] = []  # broadcast: the actors in that group, by slot
        self._starting: set[int] = set()  # slots whose replacement engine may still be starting
        self.last_sync: SyncStats | None = None
        self.restarts = 0
        self.actors = [self._start_actor() for _ in range(config.num_actors)]
        ray.get([a.pid.remote() for a in self.actors])  # surface engine start-up errors here
        # failed trajectories are built here, so the driver needs the model's token table too
        self.token_table = token_bytes_table(AutoTokenizer.from_pretrained(config.model))

    def _start_actor(self):
        import ray

        options = {"runtime_env": {"env_vars": {**ACTOR_ENV, **self.config.env}}}
        engine_kwargs = dict(self.config.engine_kwargs)
        if self.config.weight_sync == "broadcast":
            engine_kwargs["worker_extension_cls"] = WORKER_EXTENSION  # by name: the worker imports it
        actor = self._actor_cls.options(**options).remote(
            self.config.model, self.config.block_size, engine_kwargs
        )
        if self._weights is None and self._latest is not None:
            self._weights, self._latest = ray.put(self._latest), None
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
        self._starting.add(slot)
        logger.warning("rollout actor %d replaced (%d replacements so far)", slot, self.restarts)

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> SyncStats:
        """Load new policy weights (HF checkpoint names) into every actor; returns when all have them.

        ``weight_sync="broadcast"`` raises :class:`~rollouts.weight_sync.WeightSyncTimeout` when an
        actor does not answer, join or receive within ``weight_sync_timeout_s``."""
        import ray

        items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
        started = time.monotonic()
        if self.config.weight_sync == "broadcast":
            stats = self._broadcast(items)
        else:
            self._check_actors()  # an actor that died since the last call is replaced, not a failed update
            items = [(name, t.detach().to("cpu", copy=True)) for name, t in items]
            self._weights = ray.put(items)
            ray.get([a.load_weights.remote(self._weights) for a in self.actors])
            nbytes = sum(t.numel() * t.element_size() for _, t in items)
            stats = SyncStats(len(items), nbytes, time.monotonic() - started)
        self.last_sync = stats
        logger.info("weights updated (%s): %d tensors, %.1f MB to %d actors in %.2fs",
                    self.config.weight_sync, stats.tensors, stats.bytes / 1e6, len(self.actors),
                    time.monotonic() - started)  # fmt: skip
        return stats

    # -- broadcast ---------------------------------------------------------------------------------------

    def _broadcast(self, items: list[tuple[str, torch.Tensor]]) -> SyncStats:
        import ray

        timeout = self.config.weight_sync_timeout_s
        self._check_actors()
        device = items[0][1].device if items else torch.device("cpu")
        members_changed = len(self._members) != len(self.actors) or any(
            a is not b for a, b in zip(self._members, self.actors)
        )
        if self._sender is None or members_changed or self._sender.device != device:
            self._form_group(device)
        refs = [a.receive_weights.remote() for a in self.actors]
        try:
            stats = self._sender.send(items)
            received = ray.get(refs, timeout=timeout)
        except Exception as err:
            self._leave_group()
            raise _sync_failure("update", refs, err, timeout) from err
        for slot, workers in enumerate(received):
            for got in workers:
                if (got["tensors"], got["bytes"]) != (stats.tensors, stats.bytes):
                    self._leave_group()
                    raise WeightSyncError(
                        f"rollout actor {slot} received {got['tensors']} tensors / {got['bytes']} bytes, "
                        f"sent {stats.tensors} / {stats.bytes}"
                    )
        if self.config.max_actor_restarts > 0:  # what a replacement actor will load
            self._weights = None
            self._latest = [(name, t.detach().to("cpu", copy=True)) for name, t in items]
        return stats

    def _check_actors(self) -> None:
        """Every actor alive and idle before a weight update: dead ones are replaced (and their engines
        waited for); one that does not answer within ``weight_sync_timeout_s`` fails the update, so no
        broadcast group is ever formed around it."""
        import ray
        from ray.exceptions import RayActorError

        timeout = self.config.weight_sync_timeout_s
        while True:
            for slot in sorted(self._starting):  # a new engine takes as long to start as the first did
                self._starting.discard(slot)
                with contextlib.suppress(RayActorError):  # died starting: found dead below
                    ray.get(self.actors[slot].pid.remote())
            refs = [a.pid.remote() for a in self.actors]
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
            if pending:
                slots = [i for i, ref in enumerate(refs) if ref in pending]
                raise WeightSyncTimeout(
                    f"weight sync: rollout actor(s) {slots} did not answer within {timeout:g}s (busy or "
                    "hung); no weights were sent (raise weight_sync_timeout_s if they are only slow)"
                )
            dead = []
            for slot, ref in enumerate(refs):
                try:
                    ray.get(ref)
                except RayActorError:
                    dead.append(slot)
            if not dead:
                return
            for slot in dead:
                self._replace_actor(slot)

    def _form_group(self, device: torch.device) -> None:
        """A new group: the driver binds a free port, every actor's workers join (rank 1 onwards)."""
        import ray

        from rollouts.weight_sync import WeightSender

        self._leave_group()
        timeout = self.config.weight_sync_timeout_s
        per_actor = self.config.receivers_per_actor
        sender = WeightSender(_sync_host(), 0, len(self.actors) * per_actor, device=device, timeout_s=timeout)
        refs = [
            actor.join_weight_sync.remote(
                sender.host, sender.port, sender.world_size, 1 + slot * per_actor, sender.backend, timeout
            )
            for slot, actor in enumerate(self.actors)
        ]
        try:
            seconds = sender.connect()
            ray.get(refs, timeout=timeout)
        except Exception as err:
            sender.close()
            raise _sync_failure("join", refs, err, timeout) from err
        self._sender, self._members = sender, list(self.actors)
        logger.info("weight sync group %s:%d formed (%s, %d actors) in %.2fs",
                    sender.host, sender.port, sender.backend, len(self.actors), seconds)  # fmt: skip

    def _leave_group(self) -> None:
        """Drop the current group on the driver's side (actors leave theirs when they next join)."""
        if self._sender is not None:
            self._sender.close()
        self._sender, self._members = None, []

    @property
    def weight_sync_address(self) -> tuple[str, int] | None:
        """``(host, port)`` of the current broadcast group; None before the first broadcast or after a failure."""
        return None if self._sender is None else (self._sender.host, self._sender.port)

    def generate(self, requests: Sequence[RolloutRequest]) -> list[Trajectory]:
        """One Trajectory per request, in order; failures come back as error trajectories."""
        import ray
        from ray.exceptions import RayActorError

        requests = list(requests)
        results: list[Trajectory | None] = [None] * len(requests)
        in_flight: dict[Any, tuple[int, Any, _Shard]] = {}  # ObjectRef -> (actor slot, actor, shard)

        def submit(shard: _Shard, slot: int | None = None) -> None:
            if slot is None:  # the actor with the fewest calls in flight
                busy = [0] * len(self.actors)
                for s, _, _ in in_flight.values():
                    busy[s] += 1
                slot = busy.index(min(busy))
            actor = self.actors[slot]
            ref = actor.generate.remote([requests[i] for i in shard.indices])
            in_flight[ref] = (slot, actor, shard)

        for slot, indices in enumerate(self._balance(requests)):
            if indices:
                submit(_Shard(indices), slot)

        while in_flight:
            (ref,), _ = ray.wait(list(in_flight), num_returns=1)
            slot, actor, shard = in_flight.pop(ref)
            try:
                trajectories = ray.get(ref)
            except Exception as err:
                reason = _reason(err)
                actor_died = isinstance(err, RayActorError)
                # only if the slot still holds the actor that failed: a call that failed on an actor
                # already replaced must not take its replacement down too
                if (actor_died or not _is_rejection(err)) and self.actors[slot] is actor:
                    self._replace_actor(slot)  # dead, or its engine may be broken mid-step
                    for other_ref, (_, other_actor, _) in list(in_flight.items()):
                        if other_actor is actor and not ray.wait([other_ref], timeout=0)[0]:
                            submit(in_flight.pop(other_ref)[2])  # queued on the replaced actor: move it
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

        self._leave_group()
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


def sync_host(driver_ip: str, node_ips: Iterable[str]) -> str:
    """Where the broadcast group meets: 127.0.0.1 when every Ray node is the driver's machine, else the
    driver's node IP (Ray's own traffic between nodes uses it, so every node reaches it)."""
    return "127.0.0.1" if set(node_ips) <= {driver_ip} else driver_ip


def _sync_host() -> str:
    import ray

    nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]
    return sync_host(ray.util.get_node_ip_address(), nodes)


def _sync_failure(stage: str, refs: list, err: BaseException, timeout: float) -> WeightSyncError:
    """The driver's error with what each actor did: which had not finished, which failed and why (their
    side runs under the same limit, so a few seconds' grace usually brings their reasons in too)."""
    import ray
    from ray.exceptions import GetTimeoutError

    _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
    late = [slot for slot, ref in enumerate(refs) if ref in pending]
    ray.wait(refs, num_returns=len(refs), timeout=min(timeout, 10.0))
    notes = []
    if late:
        verb = "joined" if stage == "join" else "received the weights"
        notes.append(f"rollout actor(s) {late} had not {verb} when the driver gave up")
    for slot, ref in enumerate(refs):
        if not ray.wait([ref], timeout=0)[0]:
            continue
        try:
            ray.get(ref)
        except Exception as actor_err:
            notes.append(f"rollout actor {slot}: {_reason(actor_err)}")
    timed_out = bool(late) or isinstance(err, WeightSyncTimeout | GetTimeoutError)
    cls = WeightSyncTimeout if timed_out else WeightSyncError
    return cls(f"weight sync {stage} failed ({'; '.join(notes) or 'every actor answered'}): {err}")

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
  with vLLM's ``reload_weights`` (the CPU path, docs/ARCHITECTURE.md, "Weight sync on vLLM CPU").

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

Placement. The pool reserves its resources up front in one Ray placement group of ``num_actors``
bundles, each ``PoolConfig.bundle`` (the actor's CPUs, GPUs when it has any, and ``resources_per_actor``,
e.g. ``{heed_rollout: 1}``, a custom resource only the rollout nodes carry), spread over the nodes by
``placement`` (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD). Actor N runs in bundle N, and so does every
replacement of it. A shape the cluster's nodes can never hold fails at once (judged by the nodes alive
when the pool starts: on an autoscaling cluster, bring the rollout nodes up first); one that does not fit
into what is free fails after ``placement_timeout_s`` — both with an error naming the shape and what each
node has, never a hang (the strategies and the shape check: ``rollouts/placement.py``). An engine of
tensor (or pipeline) parallel size > 1 lives in one bundle that holds all its GPUs and runs its workers
as its own processes (vLLM's ``mp`` executor, set by the pool): one engine stays on one node, and vLLM's
Ray executor is refused because it would look for one bundle per GPU in the pool's group (vLLM requires
at most one GPU per bundle).

Node loss. A lost node takes its actors with it; each is replaced in its bundle, which Ray moves to another
node when one has room. When none has, the bundle stays unplaced, and a replacement that is not placed
and started within ``replace_timeout_s`` is dropped: the pool logs ``rollout actor N lost with its node;
continuing with K engines``, counts it in ``lost_actors``, moves what was queued on it to the remaining
actors (it never ran there, so nothing is duplicated) and carries on with ``num_alive`` engines. Weight
updates skip dropped actors; the broadcast group is re-formed without them. Only when no actor is left
does the pool raise.

Local Ray by default; ``ray_address`` joins an existing cluster. Each actor runs vLLM in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) without CPU pinning, so actors share cores fairly.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollouts.engines.base import RolloutRequest, build_trajectory
from rollouts.placement import PLACEMENTS, PlacementError, placement_problem
from rollouts.trajectory import Trajectory
from rollouts.weight_sync import WORKER_EXTENSION, SyncStats, WeightSyncError, WeightSyncTimeout

logger = logging.getLogger(__name__)

ACTOR_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
WEIGHT_SYNC_MODES = ("object_store", "broadcast")
ENGINES = ("vllm", "reference")


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
    # The engine each actor runs: "vllm" (with the DA plugin) or "reference" (transformers, one request at a
    # time; the engine for Selective Attention models, whose attention vLLM does not run).
    engine: str = "vllm"
    # Custom Ray resources each actor's bundle holds besides its CPUs and GPUs: one that only the rollout
    # nodes carry (`ray start --resources='{"heed_rollout": 8}'`) keeps the engines there.
    resources_per_actor: dict[str, float] = field(default_factory=dict)
    placement: str = "PACK"  # bundles over nodes: PACK, SPREAD, STRICT_PACK (one node), STRICT_SPREAD
    placement_timeout_s: float = 300.0  # limit for the placement group to be placed when the pool starts
    # limit for a replacement actor to be placed and start its engine; past it the actor is dropped (its
    # node is gone and no other has room) and the pool goes on with fewer engines
    replace_timeout_s: float = 300.0

    def __post_init__(self):
        if self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {self.num_actors}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))}; got {self.engine!r}")
        if self.engine == "reference" and self.weight_sync != "object_store":
            raise ValueError(
                "the reference engine takes weights through the object store: weight_sync='object_store'"
            )
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
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}; got {self.placement!r}")
        for name, amount in self.resources_per_actor.items():
            if name in ("CPU", "GPU"):
                raise ValueError(
                    f"resources_per_actor.{name}: set num_{name.lower()}s_per_actor instead (custom resources only)"
                )
            if not amount >= 0:
                raise ValueError(f"resources_per_actor.{name} must be >= 0, got {amount}")
        if not self.bundle:
            raise ValueError(
                "an actor's placement bundle would hold no resource: give num_cpus_per_actor, "
                "num_gpus_per_actor or resources_per_actor a positive amount"
            )
        for name in ("placement_timeout_s", "replace_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.engine_kwargs.get("distributed_executor_backend") == "ray":
            raise ValueError(
                "engine_kwargs.distributed_executor_backend: 'ray' would look for one bundle per GPU in the "
                "pool's placement group; each engine holds one bundle with all its GPUs and runs its workers "
                "with 'mp' (the default the pool sets): remove it"
            )

    @property
    def bundle(self) -> dict[str, float]:
        """One actor's share of the placement group: CPUs, GPUs and custom resources (zeros left out)."""
        shape = {"CPU": self.num_cpus_per_actor, "GPU": self.num_gpus_per_actor, **self.resources_per_actor}
        return {name: float(amount) for name, amount in shape.items() if amount > 0}

    @property
    def receivers_per_actor(self) -> int:
        """Engine workers per actor (each joins the broadcast group): tensor x pipeline parallel size."""
        kw = self.engine_kwargs
        return int(kw.get("tensor_parallel_size", 1)) * int(kw.get("pipeline_parallel_size", 1))


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


@dataclass
class _Shard:
    indices: list[int]  # positions in the caller's request list
    attempts: int = 0  # failed tries so far (every request in the shard shares them)


def check_reachable(ray_address: str | None, timeout_s: float = 10.0) -> None:
    """Raise ``ConnectionError`` if ``ray_address`` names a ``host:port`` nobody answers on.

    ``ray.init(address=...)`` retries an unreachable GCS forever; one TCP connect fails fast instead.
    ``None``, ``"auto"`` and ``ray://`` client addresses are left to Ray.
    """
    if not ray_address or ray_address == "auto" or "://" in ray_address:
        return
    host, sep, port = ray_address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"ray_address must be host:port, 'auto' or ray://host:port, got {ray_address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()  # [::1]:6379 too
    except OSError as err:
        raise ConnectionError(
            f"no Ray cluster answers at {ray_address} ({err}): start its head (`ray start --head`) or fix "
            "rollout.ray_address (null starts a local Ray)"
        ) from err


class RolloutPool:
    """N vLLM engines behind one ``generate``; see the module docstring for the guarantees."""

    def __init__(self, config: PoolConfig):
        import ray
        from transformers import AutoTokenizer

        from rollouts.protocol.tokens import token_bytes_table

        self.config = config
        if not ray.is_initialized():
            check_reachable(config.ray_address)
            ray.init(address=config.ray_address, include_dashboard=False, ignore_reinit_error=True)
        self._actor_cls = ray.remote(
            num_cpus=config.num_cpus_per_actor, num_gpus=config.num_gpus_per_actor, max_restarts=0
        )(RolloutActor)
        self._weights = None  # ObjectRef of the latest weights, for replacement actors
        self._latest = None  # broadcast: CPU copy of the latest weights, put in the store when needed
        self._sender = None  # broadcast: the WeightSender of the current group
        self._members: list[Any] = []  # broadcast: the actors in that group, by slot
        # replacement engines not yet known to be up, by bundle: (ping ObjectRef, monotonic deadline)
        self._starting: dict[int, tuple[Any, float]] = {}
        self.last_sync: SyncStats | None = None
        self.restarts = 0
        self.lost_actors = 0  # actors dropped because their replacement could not be placed (node lost)
        self.placement_group = self._place()
        # Live actors by slot, and the bundle each one runs in (its stable number in logs and errors).
        # A dropped actor leaves both lists, so slots shift; bundles do not.
        self.bundles = list(range(config.num_actors))
        self.actors = [self._start_actor(bundle) for bundle in self.bundles]
        try:
            ray.get([a.pid.remote() for a in self.actors])  # surface engine start-up errors here
        except BaseException:
            self.shutdown()
            raise
        # failed trajectories are built here, so the driver needs the model's token table too
        self.token_table = token_bytes_table(AutoTokenizer.from_pretrained(config.model))

    @property
    def num_alive(self) -> int:
        """Engines the pool still has: ``num_actors`` less the ones lost with their nodes."""
        return len(self.actors)

    # -- placement ---------------------------------------------------------------------------------------

    def _place(self):
        """The pool's placement group, placed: one bundle per actor, or a PlacementError saying why not."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        cfg = self.config
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        problem = placement_problem(
            cfg.bundle, cfg.num_actors, cfg.placement, [n["Resources"] for n in nodes]
        )
        if problem:
            raise PlacementError(
                f"{_shape(cfg)} can never be placed on this cluster: {problem}. Nodes: "
                f"{_describe_nodes(nodes, cfg.bundle)}. Change rollout.num_actors, num_cpus_per_actor, "
                "num_gpus_per_actor, resources_per_actor or placement, or add nodes that carry those resources"
            )
        group = placement_group([cfg.bundle] * cfg.num_actors, strategy=cfg.placement)
        if not group.wait(timeout_seconds=cfg.placement_timeout_s):
            remove_placement_group(group)
            available = ray.available_resources()  # (leaves out what is all taken)
            free = {name: available.get(name, 0.0) for name in cfg.bundle}
            raise PlacementError(
                f"{_shape(cfg)} was not placed within {cfg.placement_timeout_s:g}s: the nodes could hold it, "
                f"but other work holds their resources (free now in the whole cluster: {_amounts(free)}; nodes: "
                f"{_describe_nodes(nodes, cfg.bundle)}). Free them (e.g. fewer trainer ranks on the rollout "
                "nodes), or raise rollout.placement_timeout_s if nodes are still joining"
            )
        logger.info("rollout placement group ready: %s", _shape(cfg))
        return group

    def _bundle_node_alive(self, bundle: int) -> bool:
        """Whether the bundle is placed on a live node (after a node loss Ray moves it if it can)."""
        import ray
        from ray.util.placement_group import placement_group_table

        node = placement_group_table(self.placement_group).get("bundles_to_node_id", {}).get(bundle)
        return bool(node) and any(n["NodeID"] == node for n in ray.nodes() if n.get("Alive"))

    # -- actors ------------------------------------------------------------------------------------------

    def _start_actor(self, bundle: int):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = {
            "runtime_env": {"env_vars": {**ACTOR_ENV, **self.config.env}},
            "resources": {k: v for k, v in self.config.resources_per_actor.items() if v > 0},
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=bundle
            ),
        }
        engine_kwargs = dict(self.config.engine_kwargs)
        if self.config.weight_sync == "broadcast":
            engine_kwargs["worker_extension_cls"] = WORKER_EXTENSION  # by name: the worker imports it
        if self.config.receivers_per_actor > 1:
            # inside a placement group vLLM would pick its Ray executor; the engine's workers are its own
            # processes on its bundle's GPUs instead (module docstring, "Placement")
            engine_kwargs.setdefault("distributed_executor_backend", "mp")
        actor = self._actor_cls.options(**options).remote(
            self.config.model, self.config.block_size, engine_kwargs, self.config.engine
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
        bundle = self.bundles[slot]
        ray.kill(self.actors[slot], no_restart=True)  # a task error may leave a live but broken engine
        self.actors[slot] = self._start_actor(bundle)
        # the ping runs after the engine is up (and has the latest weights), before any shard sent to it
        deadline = time.monotonic() + self.config.replace_timeout_s
        self._starting[bundle] = (self.actors[slot].pid.remote(), deadline)
        logger.warning("rollout actor %d replaced (%d replacements so far)", bundle, self.restarts)

    def _next_deadline_s(self) -> float | None:
        """Seconds until the first starting replacement is due; None when none is starting."""
        if not self._starting:
            return None
        return max(0.0, min(deadline for _, deadline in self._starting.values()) - time.monotonic())

    def _settle_replacements(self) -> list[Any]:
        """Replacements that answered (or died: the caller sees that on its own calls) are no longer
        starting; those past their deadline are dropped and returned — nothing sent to them has run."""
        import ray

        dropped = []
        for bundle, (ping, deadline) in list(self._starting.items()):
            if ray.wait([ping], timeout=0)[0]:
                del self._starting[bundle]
            elif time.monotonic() >= deadline:
                del self._starting[bundle]
                dropped.append(self._drop(bundle))
        return dropped

    def _await_replacements(self) -> None:
        """Wait for every starting replacement, each until its deadline (dropping those that miss it)."""
        import ray

        while self._starting:
            pings = [ping for ping, _ in self._starting.values()]
            ray.wait(pings, num_returns=len(pings), timeout=self._next_deadline_s())
            self._settle_replacements()

    def _drop(self, bundle: int):
        """Give up on the actor in ``bundle``: the pool goes on with the others; none left is an error."""
        import ray

        slot = self.bundles.index(bundle)
        actor = self.actors.pop(slot)
        self.bundles.pop(slot)
        self.lost_actors += 1
        node_lost = not self._bundle_node_alive(bundle)
        ray.kill(actor, no_restart=True)  # a replacement still waiting for a node to be placed on
        if node_lost:
            logger.warning(
                "rollout actor %d lost with its node; continuing with %d engine(s)", bundle, len(self.actors)
            )
        else:
            logger.warning(
                "rollout actor %d dropped: its replacement did not start within replace_timeout_s=%gs; "
                "continuing with %d engine(s)", bundle, self.config.replace_timeout_s, len(self.actors),
            )  # fmt: skip
        if not self.actors:
            raise RuntimeError(
                f"all {self.config.num_actors} rollout actors are lost (their nodes are gone and no node has "
                f"room for {_shape(self.config)}, or their replacements did not start within "
                f"replace_timeout_s={self.config.replace_timeout_s:g}s): bring rollout nodes back and resume"
            )
        return actor

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
            raise _sync_failure("update", refs, err, timeout, self.bundles) from err
        for bundle, workers in zip(self.bundles, received):
            for got in workers:
                if (got["tensors"], got["bytes"]) != (stats.tensors, stats.bytes):
                    self._leave_group()
                    raise WeightSyncError(
                        f"rollout actor {bundle} received {got['tensors']} tensors / {got['bytes']} bytes, "
                        f"sent {stats.tensors} / {stats.bytes}"
                    )
        if self.config.max_actor_restarts > 0:  # what a replacement actor will load
            self._weights = None
            self._latest = [(name, t.detach().to("cpu", copy=True)) for name, t in items]
        return stats

    def _check_actors(self) -> None:
        """Every actor alive and idle before a weight update: dead ones are replaced (and their engines
        waited for, each up to ``replace_timeout_s``: one not placed and started by then is dropped, and
        the update goes to the others); one that does not answer within ``weight_sync_timeout_s`` fails the
        update, so no broadcast group is ever formed around it."""
        import ray
        from ray.exceptions import RayActorError

        timeout = self.config.weight_sync_timeout_s
        while True:
            # a new engine takes as long to start as the first did; one that cannot be placed is dropped
            # (one that died starting is found dead below)
            self._await_replacements()
            refs = [a.pid.remote() for a in self.actors]
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
            if pending:
                slots = [self.bundles[i] for i, ref in enumerate(refs) if ref in pending]
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
            raise _sync_failure("join", refs, err, timeout, self.bundles) from err
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
        in_flight: dict[Any, tuple[Any, _Shard]] = {}  # ObjectRef -> (actor, shard)

        def submit(shard: _Shard, slot: int | None = None) -> None:
            if slot is None:  # the actor with the fewest calls in flight
                busy = [sum(a is actor for a, _ in in_flight.values()) for actor in self.actors]
                slot = busy.index(min(busy))
            actor = self.actors[slot]
            ref = actor.generate.remote([requests[i] for i in shard.indices])
            in_flight[ref] = (actor, shard)

        def move_off(actor, done_ok: bool) -> None:
            """Resubmit what is queued on ``actor`` elsewhere (``done_ok``: leave calls that finished)."""
            for other_ref, (other_actor, _) in list(in_flight.items()):
                if other_actor is actor and not (done_ok and ray.wait([other_ref], timeout=0)[0]):
                    submit(in_flight.pop(other_ref)[1])

        for slot, indices in enumerate(self._balance(requests)):
            if indices:
                submit(_Shard(indices), slot)

        while in_flight:
            # wake up by the next replacement's deadline: one that cannot be placed must not stall the batch
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=self._next_deadline_s())
            for dropped in self._settle_replacements():
                move_off(dropped, done_ok=False)  # it never started, so nothing queued on it ran
            if not ready or ready[0] not in in_flight:
                continue
            ref = ready[0]
            actor, shard = in_flight.pop(ref)
            try:
                trajectories = ray.get(ref)
            except Exception as err:
                reason = _reason(err)
                actor_died = isinstance(err, RayActorError)
                slot = next((i for i, a in enumerate(self.actors) if a is actor), None)
                # only if the slot still holds the actor that failed: a call that failed on an actor
                # already replaced (or dropped) must not take its replacement down too
                if (actor_died or not _is_rejection(err)) and slot is not None:
                    self._replace_actor(slot)  # dead, or its engine may be broken mid-step
                    move_off(actor, done_ok=True)  # queued on the replaced actor: move it
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

    def sleep(self, level: int = 1) -> None:
        """Every engine frees its GPU (colocated with the trainer; engines need ``enable_sleep_mode``)."""
        import ray

        ray.get([a.sleep.remote(level) for a in self.actors])

    def wake_up(self) -> None:
        """Every engine takes its GPU memory back (weights restored, KV cache reallocated)."""
        import ray

        ray.get([a.wake_up.remote() for a in self.actors])

    def shutdown(self) -> None:
        """Stop the actors and free their placement group (the local Ray instance stays up for the caller
        to shut down)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        self._leave_group()
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors, self.bundles = [], []
        self._starting.clear()
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None


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


def _amounts(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in resources.items()) + "}"


def _shape(config: PoolConfig) -> str:
    return (
        f"the rollout placement group ({config.num_actors} x {_amounts(config.bundle)}, {config.placement})"
    )


def _describe_nodes(nodes: Sequence[Mapping[str, Any]], bundle: Mapping[str, float]) -> str:
    """Each live node's total of the resources a bundle asks for."""
    if not nodes:
        return "none alive"
    return "; ".join(
        f"{n['NodeID'][:8]} at {n.get('NodeManagerAddress', '?')} "
        f"{_amounts({name: n['Resources'].get(name, 0.0) for name in bundle})}"
        for n in nodes
    )


def sync_host(driver_ip: str, node_ips: Iterable[str]) -> str:
    """Where the broadcast group meets: 127.0.0.1 when every Ray node is the driver's machine, else the
    driver's node IP (Ray's own traffic between nodes uses it, so every node reaches it)."""
    return "127.0.0.1" if set(node_ips) <= {driver_ip} else driver_ip


def _sync_host() -> str:
    import ray

    nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]
    return sync_host(ray.util.get_node_ip_address(), nodes)


def _sync_failure(
    stage: str, refs: list, err: BaseException, timeout: float, names: Sequence[int] | None = None
) -> WeightSyncError:
    """The driver's error with what each actor did: which had not finished, which failed and why (their
    side runs under the same limit, so a few seconds' grace usually brings their reasons in too).
    ``names``: the actors' numbers (their bundles), by position in ``refs``; default 0, 1, ..."""
    import ray
    from ray.exceptions import GetTimeoutError

    names = list(range(len(refs))) if names is None else list(names)
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
    late = [name for name, ref in zip(names, refs) if ref in pending]
    ray.wait(refs, num_returns=len(refs), timeout=min(timeout, 10.0))
    notes = []
    if late:
        verb = "joined" if stage == "join" else "received the weights"
        notes.append(f"rollout actor(s) {late} had not {verb} when the driver gave up")
    for name, ref in zip(names, refs):
        if not ray.wait([ref], timeout=0)[0]:
            continue
        try:
            ray.get(ref)
        except Exception as actor_err:
            notes.append(f"rollout actor {name}: {_reason(actor_err)}")
    timed_out = bool(late) or isinstance(err, WeightSyncTimeout | GetTimeoutError)
    cls = WeightSyncTimeout if timed_out else WeightSyncError
    return cls(f"weight sync {stage} failed ({'; '.join(notes) or 'every actor answered'}): {err}")

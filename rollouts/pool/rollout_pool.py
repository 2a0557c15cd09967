"""The rollout pool: N engine actors behind one ``generate``, and how a batch of requests is scheduled.

``RolloutPool.generate(requests)`` returns exactly one Trajectory per request, in request order:

- Requests are packed into one shard per actor, balanced by token budget (prompt + max new tokens,
  longest first onto the least loaded actor). Each shard is one remote call, decoded as one vLLM
  batch; a shard's results are accepted once, when its call succeeds — so nothing is duplicated.
- A call that fails is retried, never lost: if the actor died it is replaced by a fresh one (loaded
  with the latest weights; ``rollouts/pool/replacement.py``) and the shard resubmitted; a failing shard
  is split in halves, so one bad request cannot keep failing its neighbours. A request that has failed
  ``max_attempts`` times comes back as a failed Trajectory (``finish_reason="error"``, ``error`` saying
  why) instead of an exception that would kill the RL step.

New weights: :meth:`~rollouts.pool.weights.WeightUpdates.update_weights`. Local Ray by default;
``ray_address`` joins an existing cluster.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollouts.engines.base import RolloutRequest, build_trajectory
from rollouts.placement import PlacementError, describe_amounts, describe_nodes, placement_problem
from rollouts.pool.actor import RolloutActor, error_reason, is_rejection
from rollouts.pool.replacement import ActorReplacement
from rollouts.pool.settings import PoolConfig, PoolSettings
from rollouts.pool.weights import WeightUpdates
from rollouts.trajectory import Trajectory
from rollouts.weight_sync import SyncStats

logger = logging.getLogger(__name__)


def place_actors(settings: PoolSettings):
    """The pool's placement group, placed: ``num_actors`` bundles of ``settings.bundle`` spread by
    ``settings.placement``, or a :class:`PlacementError` saying why not (judged by the nodes alive now)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    problem = placement_problem(
        settings.bundle, settings.num_actors, settings.placement, [n["Resources"] for n in nodes]
    )
    if problem:
        raise PlacementError(
            f"{settings.shape} can never be placed on this cluster: {problem}. Nodes: "
            f"{describe_nodes(nodes, settings.bundle)}. Change rollout.num_actors, num_cpus_per_actor, "
            "num_gpus_per_actor, resources_per_actor or placement, or add nodes that carry those resources"
        )
    group = placement_group([settings.bundle] * settings.num_actors, strategy=settings.placement)
    if not group.wait(timeout_seconds=settings.placement_timeout_s):
        remove_placement_group(group)
        available = ray.available_resources()  # (leaves out what is all taken)
        free = {name: available.get(name, 0.0) for name in settings.bundle}
        raise PlacementError(
            f"{settings.shape} was not placed within {settings.placement_timeout_s:g}s: the nodes could "
            f"hold it, but other work holds their resources (free now in the whole cluster: {describe_amounts(free)}; "
            f"nodes: {describe_nodes(nodes, settings.bundle)}). Free them (e.g. fewer trainer ranks on the "
            "rollout nodes), or raise rollout.placement_timeout_s if nodes are still joining"
        )
    logger.info("rollout placement group ready: %s", settings.shape)
    return group


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


class RolloutPool(ActorReplacement, WeightUpdates):
    """N engines behind one ``generate``; the guarantees are in the module docstring, keeping the actors
    in :class:`ActorReplacement`, new weights in :class:`WeightUpdates`."""

    def __init__(self, config: PoolConfig, *, wait: bool = True):
        """Start the actors; with ``wait=False`` return while their engines still start (the caller does
        other work, then :meth:`wait_ready`)."""
        import ray

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
        self.placement_group = place_actors(config)
        # Live actors by slot, and the bundle each one runs in (its stable number in logs and errors).
        # A dropped actor leaves both lists, so slots shift; bundles do not.
        self.bundles = list(range(config.num_actors))
        self.actors = [self._start_actor(bundle) for bundle in self.bundles]
        self.token_table = None
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until every engine has started; an engine's start-up error is raised here, with the pool
        shut down."""
        import ray
        from transformers import AutoTokenizer

        from rollouts.protocol.tokens import token_bytes_table

        try:
            ray.get([a.pid.remote() for a in self.actors])
        except BaseException:
            self.shutdown()
            raise
        # failed trajectories are built here, so the driver needs the model's token table too
        self.token_table = token_bytes_table(AutoTokenizer.from_pretrained(self.config.model))

    @property
    def num_alive(self) -> int:
        """Engines the pool still has: ``num_actors`` less the ones lost with their nodes."""
        return len(self.actors)

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
                reason = error_reason(err)
                actor_died = isinstance(err, RayActorError)
                slot = next((i for i, a in enumerate(self.actors) if a is actor), None)
                # only if the slot still holds the actor that failed: a call that failed on an actor
                # already replaced (or dropped) must not take its replacement down too
                if (actor_died or not is_rejection(err)) and slot is not None:
                    self._replace_actor(slot, reason)  # dead, or its engine may be broken mid-step
                    move_off(actor, done_ok=True)  # queued on the replaced actor: move it
                self._retry(shard, reason, requests, results, submit, final=is_rejection(err))
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

"""How the rollout pool keeps its engines: each actor in its own bundle, a dead one replaced in the same
bundle, one that cannot be placed again dropped.

A call that fails on a dead actor (or leaves its engine broken mid-step) replaces it: a fresh actor in
the same bundle of the pool's placement group, loaded with the latest weights before its first shard
(``rollouts/pool/weights.py``), at most ``max_actor_restarts`` times over the pool's lifetime.

Node loss. A lost node takes its actors with it; each is replaced in its bundle, which Ray moves to another
node when one has room. When none has, the bundle stays unplaced, and a replacement that is not placed
and started within ``replace_timeout_s`` is dropped: the pool logs ``rollout actor N lost with its node;
continuing with K engines``, counts it in ``lost_actors``, moves what was queued on it to the remaining
actors (it never ran there, so nothing is duplicated) and carries on with ``num_alive`` engines. Weight
updates skip dropped actors; the broadcast group is re-formed without them. Only when no actor is left
does the pool raise.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rollouts.placement import bundle_node_alive
from rollouts.pool.actor import ACTOR_ENV
from rollouts.weight_sync import WORKER_EXTENSION

logger = logging.getLogger(__name__)


class ActorReplacement:
    """The actor-keeping part of :class:`~rollouts.pool.RolloutPool`. It reads the pool's ``config``,
    ``placement_group`` and ``_actor_cls``, and keeps ``actors`` and ``bundles`` (live actors by slot, and
    the bundle each runs in: its stable number in logs and errors; a dropped actor leaves both lists, so
    slots shift and bundles do not), ``_starting`` (replacements not yet known to be up, by bundle: their
    ping and its deadline), ``restarts`` and ``lost_actors``."""

    def _start_actor(self, bundle: int):
        """A new actor in ``bundle``, given the latest weights (when there are any) before anything else."""
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
            # processes on its bundle's GPUs instead (rollouts/pool/__init__.py, "Placement")
            engine_kwargs.setdefault("distributed_executor_backend", "mp")
        actor = self._actor_cls.options(**options).remote(
            self.config.model, self.config.block_size, engine_kwargs, self.config.resolved_engine
        )
        if self._weights is None and self._latest is not None:
            self._weights, self._latest = ray.put(self._latest), None
        if self._weights is not None:
            actor.load_weights.remote(self._weights)  # queued before any shard it will receive
        return actor

    def _replace_actor(self, slot: int, reason: str = "died") -> None:
        """Kill the actor in ``slot`` and start another on its bundle; ``reason``: why (the log says it)."""
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
        logger.warning(
            "rollout actor %d replaced (%d replacements so far): %s", bundle, self.restarts, reason
        )

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
        node_lost = not bundle_node_alive(self.placement_group, bundle)
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
                f"room for {self.config.shape}, or their replacements did not start within "
                f"replace_timeout_s={self.config.replace_timeout_s:g}s): bring rollout nodes back and resume"
            )
        return actor

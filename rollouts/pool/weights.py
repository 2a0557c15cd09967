"""How the rollout pool's engines get new weights: :meth:`WeightUpdates.update_weights`.

``update_weights`` returns when every actor has the weights, with :class:`~rollouts.weight_sync.SyncStats`
(tensors, bytes, seconds), and every actor drops its prefix cache (KV written by the old weights). Either
way every actor is pinged first: one that died since the last call (between two RL steps) is replaced
before the weights go out. ``PoolSettings.weight_sync`` picks the path:

``"object_store"`` (default, CPU): the tensors go to Ray's object store once; every actor loads them with
vLLM's ``reload_weights`` (the CPU path, docs/ARCHITECTURE.md, "Weight sync on vLLM CPU").

``"broadcast"`` (GPU pools): the driver — the trainer's rank 0 — broadcasts the tensors to every engine
worker over a group of their own (``rollouts/weight_sync.py``: NCCL when the tensors are CUDA, gloo on
CPU), as OpenRLHF/TRL do. Engines start with the receiver worker extension; the group is formed on the
first update (its backend follows the tensors' device) at a port the driver binds, on 127.0.0.1 when every
Ray node is the driver's machine, else on the driver's Ray node IP. Before each update every actor is
pinged: a dead one is replaced, one that does not answer within ``weight_sync_timeout_s`` (busy or hung)
fails the update with ``WeightSyncTimeout`` naming it; forming the group and each broadcast run under the
same limit, so nothing hangs. A failed update drops the group; the next one forms a new one.

Replacement actors (``rollouts/pool/replacement.py``) load the latest weights before their first shard:
with the object store, its copy; with broadcast, a CPU copy the driver keeps of the last update (put in
the object store only when a replacement needs it; not kept when ``max_actor_restarts=0``). A replacement
is not in the broadcast group, so the next update re-forms the group (new port, every actor rejoins)
before sending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence

import torch

from rollouts.pool.actor import error_reason
from rollouts.weight_sync import SyncStats, WeightSyncError, WeightSyncTimeout

logger = logging.getLogger(__name__)


class WeightUpdates:
    """The weight-update part of :class:`~rollouts.pool.RolloutPool` (it reads the pool's ``config``,
    ``actors`` and ``bundles``; replacing dead actors is :class:`~rollouts.pool.replacement.ActorReplacement`'s).
    Its state: ``_weights`` (ObjectRef of the latest weights, for replacement actors), ``_latest``
    (broadcast: a CPU copy of them, put in the store when needed), ``_sender`` and ``_members`` (broadcast:
    the current group's :class:`~rollouts.weight_sync.WeightSender` and the actors in it, by slot)."""

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
            self._load_on_every_actor()
            nbytes = sum(t.numel() * t.element_size() for _, t in items)
            stats = SyncStats(len(items), nbytes, time.monotonic() - started)
        self.last_sync = stats
        logger.info("weights updated (%s): %d tensors, %.1f MB to %d actors in %.2fs",
                    self.config.weight_sync, stats.tensors, stats.bytes / 1e6, len(self.actors),
                    time.monotonic() - started)  # fmt: skip
        return stats

    def _load_on_every_actor(self) -> None:
        """Every actor loads ``_weights`` from the object store. One that dies meanwhile (it answered the
        ping, then went: a kill or an OOM is not instant) is replaced like one found dead before: its
        replacement loads ``_weights`` before anything else, and is waited for."""
        for slot in _dead_slots([a.load_weights.remote(self._weights) for a in self.actors]):
            self._replace_actor(slot, "died while loading weights")
        self._await_replacements()

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
            dead = _dead_slots(refs)
            if not dead:
                return
            for slot in dead:
                self._replace_actor(slot, "died before the weight sync")

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
            notes.append(f"rollout actor {name}: {error_reason(actor_err)}")
    timed_out = bool(late) or isinstance(err, WeightSyncTimeout | GetTimeoutError)
    cls = WeightSyncTimeout if timed_out else WeightSyncError
    return cls(f"weight sync {stage} failed ({'; '.join(notes) or 'every actor answered'}): {err}")


def _dead_slots(refs: list) -> list[int]:
    """The slots whose call (one per actor, by slot) failed because its actor died."""
    import ray
    from ray.exceptions import RayActorError

    dead = []
    for slot, ref in enumerate(refs):
        try:
            ray.get(ref)
        except RayActorError:
            dead.append(slot)
    return dead

"""The Ray rollout pool: N actors, each owning a rollout engine (vLLM with the DA plugin), behind one
``generate``.

One idea per module:

- ``settings.py`` — :class:`PoolSettings` (every setting, documented and checked once; a run config's
  ``rollout:`` section is this class) and :class:`PoolConfig` (the settings plus the model and block size).
- ``actor.py`` — :class:`RolloutActor`, the engine in one Ray actor process.
- ``rollout_pool.py`` — :class:`RolloutPool`: ``generate`` (one trajectory per request, in order; shards
  balanced by token budget, failed calls retried and split, never lost, never duplicated).
- ``replacement.py`` — a dead actor replaced in its bundle; one whose node is gone dropped (node loss).
- ``weights.py`` — ``update_weights``: through Ray's object store, or broadcast from the trainer's rank 0.
- ``colocated.py`` — :class:`ColocatedPool`: engines that sleep while the trainer has the GPUs.

Placement. The pool reserves its resources up front in one Ray placement group of ``num_actors``
bundles, each ``PoolSettings.bundle`` (the actor's CPUs, GPUs when it has any, and ``resources_per_actor``,
e.g. ``{heed_rollout: 1}``, a custom resource only the rollout nodes carry), spread over the nodes by
``placement`` (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD). Actor N runs in bundle N, and so does every
replacement of it. A shape the cluster's nodes can never hold fails at once (judged by the nodes alive
when the pool starts: on an autoscaling cluster, bring the rollout nodes up first); one that does not fit
into what is free fails after ``placement_timeout_s`` — both with an error naming the shape and what each
node has, never a hang (``rollouts/placement.py``). An engine of tensor (or pipeline) parallel size > 1
lives in one bundle that holds all its GPUs and runs its workers as its own processes (vLLM's ``mp``
executor, set by the pool): one engine stays on one node, and vLLM's Ray executor is refused because it
would look for one bundle per GPU in the pool's group (vLLM requires at most one GPU per bundle).
"""

from .actor import ACTOR_ENV, ACTOR_LOG_ENV, RolloutActor
from .colocated import ColocatedPool
from .rollout_pool import RolloutPool, check_reachable
from .settings import ENGINE_CHOICES, ENGINES, WEIGHT_SYNC_MODES, PoolConfig, PoolSettings, SettingError
from .weights import sync_host

__all__ = [
    "ACTOR_ENV",
    "ACTOR_LOG_ENV",
    "ENGINES",
    "ENGINE_CHOICES",
    "WEIGHT_SYNC_MODES",
    "ColocatedPool",
    "PoolConfig",
    "PoolSettings",
    "RolloutActor",
    "RolloutPool",
    "SettingError",
    "check_reachable",
    "sync_host",
]

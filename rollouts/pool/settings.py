"""The rollout pool's settings, one schema: what ``heed train`` reads as its ``rollout:`` section.

:class:`PoolSettings` holds every setting with its help text (the comment after each field) and its
checks; ``rl.config.cluster.RolloutSection`` *is* this class (it adds the YAML key paths and the
engine arguments the run sets itself), so a setting is declared, documented and checked here only.
:class:`PoolConfig` is a pool to start: the settings plus the model every engine loads and the KV block
size its layouts use. A bad value raises :class:`SettingError`, which names the field and says what to
change (``rollout.`` in front of it when it comes from a run config).

Imports neither torch nor Ray: a run config validates against these names without loading an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from rollouts.placement import PLACEMENTS, describe_amounts

ENGINES = ("vllm", "reference")  # what an actor runs (rollouts/pool/actor.py)
ENGINE_CHOICES = ("auto", *ENGINES)  # what a setting may name; auto is vllm
WEIGHT_SYNC_MODES = ("object_store", "broadcast")  # how update_weights reaches the engines


class SettingError(ValueError):
    """A pool setting that cannot run. ``key``: the field (dotted below it, ``engine_kwargs.model``);
    ``reason``: what is wrong and what to change. Reads ``key must be ...``, or ``key: reason``."""

    def __init__(self, key: str, reason: str):
        self.key, self.reason = key, reason
        super().__init__(f"{key} {reason}" if reason.startswith("must ") else f"{key}: {reason}")


def _check(ok, key: str, reason: str) -> None:
    if not ok:
        raise SettingError(key, reason)


@dataclass(kw_only=True)
class PoolSettings:
    """How many engines, where they run, how new weights reach them, and how hard to retry."""

    num_actors: int = 1  # rollout engines, one Ray actor each
    num_cpus_per_actor: float = 1.0  # Ray CPUs each actor reserves
    num_gpus_per_actor: float = 0.0  # Ray GPUs each actor reserves: 0 on CPU, 1 per engine on a GPU node
    ray_address: str | None = None  # None: start or reuse a local Ray; "auto" or host:port joins a cluster
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # extra vllm.LLM arguments
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the actors (e.g. VLLM_*)
    max_attempts: int = 3  # tries per request before it comes back as a failed trajectory
    max_actor_restarts: int = 8  # engine replacements over the pool's lifetime before it gives up
    # How new weights reach the engines after an optimizer step: object_store (through Ray's object store
    # into every engine; CPU runs) or broadcast (trainer rank 0 -> every engine worker over NCCL on GPUs,
    # gloo on CPU; for GPU pools). rollouts/pool/weights.py has the details.
    weight_sync: str = "object_store"
    weight_sync_timeout_s: float = 300.0  # broadcast: limit for engines to answer, join and take one update
    # Which engine each actor runs: vllm (with the Heed plugin: DA, and Selective Attention models), reference
    # (transformers, one request at a time: the oracle, and the fallback where vLLM is not installed), or auto
    # (vllm).
    engine: str = "auto"
    # The actors live in one Ray placement group, one bundle each: num_cpus/gpus_per_actor plus these custom
    # resources, e.g. {heed_rollout: 1} where only the rollout nodes were started with
    # `ray start --resources='{"heed_rollout": 8}'` (that keeps the engines there and off the trainer's nodes)
    resources_per_actor: dict[str, float] = field(default_factory=dict)
    placement: str = "PACK"  # bundles over nodes: PACK, SPREAD, STRICT_PACK (one node), STRICT_SPREAD
    placement_timeout_s: float = 300.0  # the pool fails (naming its shape) if not placed within this
    # A lost engine is replaced in its bundle (Ray moves the bundle when a node has room); a replacement not
    # placed and started within this is dropped and the run goes on with fewer engines (a lost node)
    replace_timeout_s: float = 300.0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise :class:`SettingError` for the first setting that cannot run."""
        for name, low in (("num_actors", 1), ("max_attempts", 1), ("max_actor_restarts", 0)):
            _check(getattr(self, name) >= low, name, f"must be >= {low}, got {getattr(self, name)}")
        for name in ("num_cpus_per_actor", "num_gpus_per_actor"):
            _check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        _check(self.ray_address is None or self.ray_address, "ray_address", "must be an address or null")
        _check(
            self.engine in ENGINE_CHOICES,
            "engine",
            f"must be one of {', '.join(ENGINE_CHOICES)}; got {self.engine!r}",
        )
        _check(
            self.weight_sync in WEIGHT_SYNC_MODES,
            "weight_sync",
            f"must be one of {', '.join(WEIGHT_SYNC_MODES)}; got {self.weight_sync!r}",
        )
        _check(
            self.resolved_engine == "vllm" or self.weight_sync == "object_store",
            "weight_sync",
            "the reference engine takes weights through the object store: use object_store",
        )
        for name in ("weight_sync_timeout_s", "placement_timeout_s", "replace_timeout_s"):
            _check(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        _check(
            self.weight_sync != "broadcast" or "worker_extension_cls" not in self.engine_kwargs,
            "engine_kwargs.worker_extension_cls",
            "weight_sync broadcast sets it (the engines' weight receiver); remove it",
        )
        _check(
            self.engine_kwargs.get("distributed_executor_backend") != "ray",
            "engine_kwargs.distributed_executor_backend",
            "'ray' would look for one bundle per GPU in the pool's placement group; each engine holds one "
            "bundle with all its GPUs and runs its workers with 'mp' (the default the pool sets): remove it",
        )
        _check(
            self.placement in PLACEMENTS,
            "placement",
            f"must be one of {', '.join(PLACEMENTS)}; got {self.placement!r}",
        )
        for name, amount in self.resources_per_actor.items():
            key = f"resources_per_actor.{name}"
            _check(
                name not in ("CPU", "GPU"),
                key,
                f"set num_{name.lower()}s_per_actor instead (custom resources only)",
            )
            _check(amount >= 0, key, f"must be >= 0, got {amount}")
        _check(
            self.bundle,
            "num_cpus_per_actor",
            "an actor's placement bundle would hold no resource: give num_cpus_per_actor, "
            "num_gpus_per_actor or resources_per_actor a positive amount",
        )

    @property
    def resolved_engine(self) -> str:
        """The engine the actors run: ``engine`` with ``auto`` resolved (vllm)."""
        return "vllm" if self.engine == "auto" else self.engine

    @property
    def bundle(self) -> dict[str, float]:
        """One actor's share of the placement group: CPUs, GPUs and custom resources (zeros left out)."""
        shape = {"CPU": self.num_cpus_per_actor, "GPU": self.num_gpus_per_actor, **self.resources_per_actor}
        return {name: float(amount) for name, amount in shape.items() if amount > 0}

    @property
    def shape(self) -> str:
        """The pool's placement group in words, for errors and logs.

        >>> PoolSettings(num_actors=2, resources_per_actor={"heed_rollout": 1}).shape
        'the rollout placement group (2 x {CPU: 1, heed_rollout: 1}, PACK)'
        """
        return f"the rollout placement group ({self.num_actors} x {describe_amounts(self.bundle)}, {self.placement})"

    @property
    def receivers_per_actor(self) -> int:
        """Engine workers per actor (each joins the broadcast group): tensor x pipeline parallel size."""
        kw = self.engine_kwargs
        return int(kw.get("tensor_parallel_size", 1)) * int(kw.get("pipeline_parallel_size", 1))


@dataclass
class PoolConfig(PoolSettings):
    """A pool to start: its settings, the model every engine loads and the KV block size of its layouts."""

    model: str  # model folder (or hub id) every actor loads
    block_size: int = 32  # KV block size; the requests' layouts must be built with it

    def validate(self) -> None:
        super().validate()
        _check(self.model, "model", "must name a model folder or hub id")
        _check(self.block_size > 0, "block_size", f"must be > 0, got {self.block_size}")
        for name in ("model", "block_size"):
            _check(name not in self.engine_kwargs, f"engine_kwargs.{name}", f"set {name} instead")

    @classmethod
    def from_settings(cls, settings: PoolSettings, *, model: str, block_size: int, **changes) -> PoolConfig:
        """A pool of ``settings`` (a run's ``rollout`` section is one) on ``model``; ``changes`` replace
        settings (a run adds its own engine arguments and environment).

        >>> PoolConfig.from_settings(PoolSettings(num_actors=2), model="m", block_size=32).num_actors
        2
        """
        values = {f.name: getattr(settings, f.name) for f in fields(PoolSettings)}
        return cls(model=model, block_size=block_size, **(values | changes))

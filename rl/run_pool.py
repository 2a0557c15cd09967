"""The rollout pool of a `heed train` run: the ``rollout`` section's pool, with what the run adds to it.

The run adds engine arguments (log-probs after temperature, which the importance-sampling correction
compares against; the model's dtype; sleep mode when colocated) and environment (vLLM's CPU KV cache, the
actors' log file, Selective Attention's kernel), all of which ``rollout.engine_kwargs`` and
``rollout.env`` override. Once the pool is up, every actor is checked to sit on a node with
``cluster.rollout_node_resource`` when the config names one; colocated engines sleep while the trainer
has the GPUs (:class:`~rollouts.pool.ColocatedPool`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from rl.config import RunConfig
from rl.console import LOG_DIR, console, route_framework_logs
from rollouts.placement import check_rollout_placement
from rollouts.pool import ACTOR_LOG_ENV
from rollouts.selective.constants import KERNEL_ENV


def start_pool(
    config: RunConfig, run_dir: Path, model_dir: Path, while_starting: Callable[[], object] | None = None
):
    """The run's rollout pool on the model in ``model_dir`` (trainer rank 0 alone starts one).
    ``while_starting`` runs while the engines start up in their own processes (the run builds its data
    then); an error in either shuts the pool down."""
    pool = _pool(config, run_dir, model_dir)
    try:
        if while_starting is not None:
            while_starting()
        pool.wait_ready()
    except BaseException:
        pool.shutdown()
        raise
    resource = config.cluster.rollout_node_resource
    if resource:
        try:
            nodes = check_rollout_placement(pool, resource)
        except Exception:
            pool.shutdown()
            raise
        console.print(f"[bold]rollout pool[/] actors on nodes {', '.join(nodes)} ({resource})")
    if config.cluster.colocate:  # the engines sleep while the trainer has the GPUs
        from rollouts.pool import ColocatedPool

        return ColocatedPool(pool)
    return pool


def _pool(config: RunConfig, run_dir: Path, model_dir: Path):
    from rollouts.pool import PoolConfig, RolloutPool

    cfg = config.rollout
    engine_kwargs = {
        # the importance-sampling correction compares against log-probs after temperature
        "logprobs_mode": "processed_logprobs",
        "dtype": config.model.dtype,
        **({"enable_sleep_mode": True} if config.cluster.colocate else {}),
        **cfg.engine_kwargs,
    }
    env = {
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        ACTOR_LOG_ENV: str((run_dir / LOG_DIR / "rollout.log").resolve()),
        **cfg.env,
    }
    if config.selective.enabled:
        env[KERNEL_ENV] = config.selective.kernel
    engine = {"vllm": "vLLM", "reference": "reference-engine"}[cfg.resolved_engine]
    console.print(f"[bold]rollout pool[/] {cfg.num_actors} {engine} actor(s) on {model_dir}")
    import ray  # noqa: F401  (Ray adds its console handler on import: route it to the log like the rest)

    route_framework_logs(run_dir)
    pool_config = PoolConfig.from_settings(
        cfg, model=str(model_dir), block_size=config.run.block_size, engine_kwargs=engine_kwargs, env=env
    )
    return RolloutPool(pool_config, wait=False)

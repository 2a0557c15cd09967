"""The GRPO trainer of a `heed train` run, built from its config: TRL's arguments, the curriculum's prompt
order, the reward functions priced by the policy's decode cost, and completions from the run's rollout pool.

The recipe (``rl/train.py``) owns what happens around it: resuming from the newest complete checkpoint,
stopping on SIGTERM, saving the final policy.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import TrainerCallback

from rl.config import RunConfig
from rl.console import ProgressLines, interactive, quiet_trainer

# what a GRPO progress line shows besides the loss (TRL's mean reward, the batch's accuracy and KV saving)
GRPO_PROGRESS = ("reward", "heed/reward/accuracy", "heed/reward/kv_saving")


def grpo_trainer(
    config: RunConfig, model, tokenizer, rows, *, examples: dict, pool, writer, run_dir: Path, world: int,
    callbacks: list[TrainerCallback],
):  # fmt: skip
    """The run's ``HeedGRPOTrainer`` on ``world`` trainer processes over ``rows`` (the train split; ``examples``
    the same rows by id), checkpointing to ``RUN_DIR/checkpoints`` and logging to ``writer``; ``callbacks``
    go first, then off a terminal one progress line per log step."""
    from datasets import Dataset

    from rewards.efficiency import DecodeCost
    from rewards.trl_rewards import trl_reward_functions
    from rl.curriculum import CurriculumSampler
    from rl.grpo import DARollout, HeedGRPOTrainer
    from rl.run_inputs import grpo_start
    from rollouts.protocol import token_bytes_table

    cfg, g = config, config.grpo
    args = g.to_grpo_config(
        cfg.run, cfg.model, output_dir=str(run_dir / "checkpoints"), world=world,
        report_to=report_to(cfg, run_dir), progress_bar=interactive(),
    )  # fmt: skip
    sampler = CurriculumSampler(
        rows["task"],
        rows["context_tokens"],
        prompts_per_batch=g.prompts_per_step,
        num_generations=g.num_generations,
        num_batches=g.max_steps * g.num_iterations,
        repeat_count=g.num_iterations * args.steps_per_generation,
        steps_per_batch=args.steps_per_generation / g.gradient_accumulation_steps,
        schedule=cfg.curriculum.context_schedule,
        task_mix=cfg.curriculum.task_mix,
        seed=cfg.run.seed,
    )
    decode_cost = DecodeCost.from_config(
        model.config, dtype=cfg.model.dtype, matmul_params=matmul_params(model)
    )
    funcs, weights = trl_reward_functions(cfg.rewards, decode_cost, token_bytes_table(tokenizer))
    args.reward_weights = weights
    rollout = DARollout(pool, examples, tokenizer, layout=cfg.run.prompt_layout(), seed=cfg.run.seed)
    if g.beta:
        # TRL loads the KL reference from the policy config's `_name_or_path`: the base the tag tokens
        # outgrew, or the checkpoint a resume loaded. The reference is the policy GRPO starts from.
        model.config._name_or_path = str(grpo_start(run_dir))
    trainer = HeedGRPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [str(i) for i in rows["id"]]}),
        reward_funcs=funcs,
        processing_class=tokenizer,
        rollout=rollout,
        run_writer=writer,
        sampler=sampler,
        log_trajectories=g.log_trajectories,
        prompt_log=str(run_dir / "grpo_prompts.jsonl"),
        decode_cost=decode_cost,
        reward_config=cfg.rewards,
        memory_loss=(cfg.selective.grpo_memory_eps, cfg.selective.memory_tau)
        if cfg.selective.enabled
        else None,
        eviction_gradient=cfg.selective.eviction_gradient,
        share_prompt=g.share_prompt,
        callbacks=list(callbacks) + ([] if interactive() else [ProgressLines("grpo", extra=GRPO_PROGRESS)]),
    )
    quiet_trainer(trainer)
    return trainer


def report_to(config: RunConfig, run_dir: Path) -> list[str]:
    """The trainer's loggers, with wandb's environment set (what the caller's environment leaves unset)."""
    for name, value in config.logging.wandb_environment(run_dir).items():
        os.environ.setdefault(name, value)
    return config.logging.report_to


def matmul_params(model: torch.nn.Module) -> int:
    """Weights each generated token multiplies: every linear layer (the LM head included, tied or not;
    the embedding lookup is no matmul). ZeRO-3 partitioned weights count in full (``ds_numel``)."""
    return sum(
        getattr(m.weight, "ds_numel", m.weight.numel())
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    )

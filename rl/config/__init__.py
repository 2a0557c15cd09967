"""The ``heed train`` run config: one YAML file, one section per phase, validated on load.

    run:        name, run directory, seed, thinking mode, KV block size
    model:      a hub model or the tiny built-in one; dtype, attention implementation
    tokenizer:  the model's tokenizer or the local BPE
    data:       a built dataset folder (data.path) or an inline data build (data.build); splits
    curriculum: context-length stages and the task mix GRPO samples prompts with
    sft:        the warm start on gold traces      grpo:    the RL phase (TRL's GRPO knobs, DeepSpeed)
    rollout:    the Ray pool of vLLM engines       rewards: rewards/config.py's RewardConfig
    eval:       which modes are evaluated, when    logging: wandb      export: the served checkpoint
    cluster:    trainer ranks and their resources on a Ray cluster (`heed launch`)

Every key is documented where it is defined, the comment after each field: ``rl/config/sections.py`` (run,
model, tokenizer, data, curriculum, eval, logging, export), ``rl/config/training.py`` (sft, grpo,
selective), ``rl/config/cluster.py`` (cluster; rollout, whose keys are ``rollouts/pool/settings.py``'s),
``rewards/config.py`` (rewards). Every key is checked before anything starts; an error names the key by
its dotted path and, for a typo, the near miss::

    heed: error: configs/tiny.yaml: unknown key 'grpo.num_generation' (did you mean 'num_generations'?)

``load_run_config(None)`` is the embedded default, ``configs/tiny.yaml``: the whole job (data build, SFT,
GRPO, evaluation, export) on a tiny model on CPU. Overrides are ``dotted.key=value`` with a YAML value
(``grpo.max_steps=5``, ``rollout.engine_kwargs.max_model_len=4096``). Secrets (``SECRET_FIELDS``) are
accepted but never written back (:func:`save_run_config`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import yaml

from data.config import read_yaml
from data.traces import FOCUS_FIRST
from rewards.config import RewardConfig
from rl.config.cluster import ClusterSection, RolloutSection
from rl.config.sections import (
    ContextStage,
    CurriculumSection,
    DataSection,
    EvalSection,
    ExportSection,
    LoggingSection,
    ModelSection,
    RunSection,
    TokenizerSection,
)
from rl.config.training import GRPOSection, SelectiveSection, SFTSection
from rl.config.validation import REPO_ROOT, SHARE_ROOT, ConfigError, Section, check, from_mapping
from rl.selective.frozen_selection import check_weight_decay

SECRET_FIELDS = frozenset({"logging.wandb_api_key"})  # dropped by to_dict(redact=True) and save_run_config
DEFAULT_CONFIG = Path("configs") / "tiny.yaml"  # the embedded default, relative to the repo or share dir


@dataclass(kw_only=True)
class RunConfig(Section):
    """A whole ``heed train`` job. Sections check themselves; this checks how they fit together."""

    SECTION: ClassVar[str] = ""

    run: RunSection = field(default_factory=RunSection)  # name, run dir, seed, thinking, block size
    model: ModelSection = field(default_factory=ModelSection)  # the policy
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)  # its tokenizer
    data: DataSection  # required: data.path or data.build
    curriculum: CurriculumSection = field(default_factory=CurriculumSection)  # what GRPO samples, when
    sft: SFTSection = field(default_factory=SFTSection)  # the warm start
    grpo: GRPOSection = field(default_factory=GRPOSection)  # the RL phase
    rollout: RolloutSection = field(default_factory=RolloutSection)  # the vLLM engines
    selective: SelectiveSection = field(default_factory=SelectiveSection)  # Selective Attention, KV budgets
    rewards: RewardConfig = field(default_factory=RewardConfig)  # the composite reward
    eval: EvalSection = field(default_factory=EvalSection)  # held-out evaluation
    logging: LoggingSection = field(default_factory=LoggingSection)  # wandb
    export: ExportSection = field(default_factory=ExportSection)  # the served checkpoint
    cluster: ClusterSection = field(default_factory=ClusterSection)  # trainer ranks on Ray (`heed launch`)

    def validate(self):
        check(
            self.model.path is None or self.tokenizer.path is not None,
            "tokenizer.path",
            "a pretrained model.path needs its own tokenizer: set tokenizer.path (usually model.path)",
        )
        if self.data.build is not None:
            built = self.data.build.get("tokenizer", "local")
            expected = "local" if self.tokenizer.path is None else self.tokenizer.path
            check(
                built == expected,
                "data.build.tokenizer",
                f"is {built!r} but the run trains with {expected!r} (tokenizer.path); build the data with "
                "the tokenizer you train with, or chunk sizes and context lengths will not match",
            )
            navigation = self.data.data_config().trace_navigation
            check(
                navigation == "global" or self.run.index_entry_tokens > 0,
                "data.build.trace_navigation",
                f"is {navigation!r}, but the run lays prompts out without an index: set "
                "run.index_entry_tokens (for example 10), or trace_navigation: global",
            )
            for blind in FOCUS_FIRST:
                check(
                    self.run.protocol_version < 5 or not self.data.data_config().trace_strategies.get(blind),
                    f"data.build.trace_strategies.{blind}",
                    "is a focus written before any chunk is read: under run.protocol_version 5 it chooses its "
                    "chunks blind. Drop it (plan, sentence and candidates read first), or use protocol_version 4",
                )
            tasks = {task.name for task in self.data.data_config().tasks}
            for name in self.curriculum.task_mix:
                check(
                    name in tasks,
                    f"curriculum.task_mix.{name}",
                    f"data.build makes no such task; it builds {', '.join(sorted(tasks))}",
                )
        if self.selective.enabled:
            self._validate_selective()
        self.cluster.check_colocation(self.rollout)
        max_model_len = self.rollout.engine_kwargs.get("max_model_len")
        if isinstance(max_model_len, int):
            for key, tokens in (
                ("grpo.max_completion_length", self.grpo.max_completion_length),
                ("eval.max_tokens", self.eval.max_tokens),
            ):
                check(
                    tokens < max_model_len,
                    key,
                    f"{tokens} leaves no room for the prompt in "
                    f"rollout.engine_kwargs.max_model_len={max_model_len}",
                )

    @property
    def rollout_engine(self) -> str:
        """The engine the rollout actors run: ``rollout.engine``, with ``auto`` resolved (vLLM)."""
        return self.rollout.resolved_engine

    def _validate_selective(self):
        budgets = self.selective.budgets
        split = self.selective.search_split
        searches = self.selective.search_budgets or self.selective.search_after_grpo
        if searches:
            check(
                split != self.data.eval_split,
                "selective.search_split",
                f"is the eval split ({split!r}): the budgets would be tuned on what the evals measure; "
                "search on another split (validation)",
            )
        if searches and self.data.build is not None:
            check(
                self.data.data_config().splits.get(split, 0) > 0,
                "selective.search_split",
                f"data.build.splits holds no {split!r} examples to search the budgets on: add some, or "
                "name another split",
            )
        check(
            self.grpo.enabled or not self.selective.search_after_grpo,
            "selective.search_after_grpo",
            "searches the budgets of the policy GRPO trained: set grpo.enabled, or search_after_grpo: false",
        )
        fade_in = self.selective.selection_from_step + self.selective.selection_ramp_steps
        check(
            not fade_in or (self.sft.enabled and fade_in <= self.sft.max_steps),
            "selective.selection_from_step",
            f"the selection fades in during SFT, so it must be whole by sft.max_steps ({self.sft.max_steps}): "
            f"selection_from_step + selection_ramp_steps is {fade_in}",
        )
        if self.selective.freeze_selection_in_sft:
            check(
                self.sft.enabled,
                "selective.freeze_selection_in_sft",
                "freezes the selection in SFT: set sft.enabled",
            )
            try:
                check_weight_decay(self.sft.weight_decay, "sft.weight_decay")
            except ValueError as error:
                raise ConfigError(f"selective.freeze_selection_in_sft: {error}") from None
        layers = self.model.num_layers()
        if budgets is not None and layers is not None:
            check(
                len(budgets) == layers,
                "selective.budgets",
                f"has {len(budgets)} budgets but the model has {layers} layers: give one per layer",
            )
        check(
            self.model.attn_implementation == "sdpa",
            "model.attn_implementation",
            "Selective Attention runs its own attention function over a dense mask: use sdpa",
        )
        if (
            self.rollout_engine == "vllm"
        ):  # the plugin's Selective Attention path (rollouts/engines/vllm_selective.py)
            kwargs = self.rollout.engine_kwargs
            check(
                not kwargs.get("enable_prefix_caching", False),
                "rollout.engine_kwargs.enable_prefix_caching",
                "a cached prompt has no query rows to compute Selective Attention's mask with: set false",
            )
            check(
                int(kwargs.get("tensor_parallel_size", 1)) == 1,
                "rollout.engine_kwargs.tensor_parallel_size",
                "head 0's Selective Attention mask is needed by every head: use 1",
            )

    def to_dict(self, redact: bool = True) -> dict:
        """Plain data that ``parse_run_config`` reads back; ``redact`` drops ``SECRET_FIELDS``."""
        out = asdict(self)
        if redact:
            for dotted in SECRET_FIELDS:
                section, name = dotted.split(".")
                out[section].pop(name, None)
        return out


def parse_run_config(raw: dict) -> RunConfig:
    """A validated ``RunConfig`` from plain data (``ConfigError`` names the offending dotted key)."""
    return from_mapping(RunConfig, raw, "")


def default_config_path() -> Path:
    """``configs/tiny.yaml`` of the source checkout (or editable install), else of the installed wheel."""
    for root in (REPO_ROOT, SHARE_ROOT):
        if (root / DEFAULT_CONFIG).is_file():
            return root / DEFAULT_CONFIG
    raise ConfigError(f"the embedded default {DEFAULT_CONFIG} is missing from {REPO_ROOT} and {SHARE_ROOT}")


def load_run_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run config (None: the embedded default), apply ``dotted.key=value`` overrides, validate.

    Relative ``data.build.imports[].path`` resolve against the config's folder (as in ``heed data build``),
    ``grpo.deepspeed`` against the working directory, then the repo (or installed share dir); every other
    relative path is relative to the working directory.
    """
    source = default_config_path() if path is None else Path(path)
    raw = read_yaml(source, ConfigError, "run config")
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: must be a mapping of sections (run:, model:, ...), got {type(raw).__name__}"
        )
    _resolve_import_paths(raw, source.parent)
    raw = apply_overrides(raw, overrides)
    try:
        return parse_run_config(raw)
    except ConfigError as err:
        raise ConfigError(f"{source}{' with overrides' if overrides else ''}: {err}") from None


def apply_overrides(raw: dict, overrides: Sequence[str]) -> dict:
    """A copy of ``raw`` with each ``dotted.key=value`` set (the value parsed as YAML; missing sections
    are created). Setting ``data.path`` drops the file's ``data.build`` and vice versa (one replaces the
    other).

    >>> apply_overrides({"grpo": {"max_steps": 40}}, ["grpo.max_steps=5", "sft.enabled=false"])
    {'grpo': {'max_steps': 5}, 'sft': {'enabled': False}}
    """
    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = str(item).partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise ConfigError(f"override {item!r}: expected dotted.key=value, e.g. grpo.max_steps=5")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not valid YAML: {err}") from None
        node = raw
        for depth, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"override {item!r}: {where} is {node!r}, not a section with keys")
        node[parts[-1]] = value
        if parts[0] == "data" and len(parts) > 1 and parts[1] in ("path", "build") and value is not None:
            raw["data"].pop("build" if parts[1] == "path" else "path", None)
    return raw


def save_run_config(config: RunConfig, path: str | Path) -> Path:
    """Write ``config`` as YAML (what ``load_run_config`` reads back), without secrets."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# The resolved heed run config (defaults filled in, overrides applied, secrets removed).\n"
    path.write_text(header + yaml.safe_dump(config.to_dict(redact=True), sort_keys=False))
    return path


def _resolve_import_paths(raw: dict, folder: Path) -> None:
    data = raw.get("data")
    build = data.get("build") if isinstance(data, dict) else None
    imports = build.get("imports") if isinstance(build, dict) else None
    for item in imports if isinstance(imports, list) else ():
        if (
            isinstance(item, dict)
            and isinstance(item.get("path"), str)
            and not Path(item["path"]).is_absolute()
        ):
            item["path"] = str((folder / item["path"]).resolve())


__all__ = [
    "SECRET_FIELDS",
    "ClusterSection",
    "ConfigError",
    "ContextStage",
    "CurriculumSection",
    "DataSection",
    "EvalSection",
    "ExportSection",
    "GRPOSection",
    "LoggingSection",
    "ModelSection",
    "RolloutSection",
    "RunConfig",
    "RunSection",
    "SFTSection",
    "TokenizerSection",
    "apply_overrides",
    "default_config_path",
    "load_run_config",
    "parse_run_config",
    "save_run_config",
]

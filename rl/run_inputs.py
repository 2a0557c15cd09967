"""What a `heed train` run starts from: its tokenizer, data and model, built into the run directory the first
time and loaded from it after (on a resume, and by the trainer ranks other than 0).

The model is the newest one the run directory holds: the final policy, the newest *complete* GRPO
checkpoint (one with ``heed_complete.json``), the budget search's, SFT's, the copy warm-up's, or the
starting model in ``init/``, built from ``model`` (a hub model, or the tiny one) when there is none. A
Selective Attention policy carries its KV budgets in its config (:func:`set_budgets`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from rl.added_tokens import add_protocol_tokens, grow_embeddings, protocol_spellings
from rl.config import RunConfig
from rl.config.validation import local_or_hub
from rl.console import console
from rl.export import complete_steps
from rollouts.selective.constants import SELECTIVE


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """``RUN_DIR/checkpoints/checkpoint-N`` folders that hold the completion marker, oldest first."""
    return [Path(run_dir) / "checkpoints" / f"checkpoint-{step}" for step in complete_steps(run_dir)]


# The folders the phases before GRPO save their policy to, the latest phase first: GRPO starts from the
# first of them that a run holds.
BEFORE_GRPO = ("grpo_budgets", "budget_search", "sft", "copy_warmup", "init")


def grpo_start(run_dir: str | Path) -> Path:
    """The folder holding the policy GRPO starts from: its KL reference (``grpo.beta > 0``), whether the
    run is fresh or resumes from a GRPO checkpoint."""
    for name in BEFORE_GRPO:
        if (Path(run_dir) / name / "config.json").is_file():
            return Path(run_dir) / name
    raise FileNotFoundError(f"{run_dir} holds no policy saved before GRPO (any of {', '.join(BEFORE_GRPO)})")


def run_tokenizer(config: RunConfig, run_dir: Path):
    """``RUN_DIR/tokenizer``, saved there first from ``tokenizer.path`` (or the model's), or the local BPE."""
    from transformers import AutoTokenizer

    saved = run_dir / "tokenizer"
    if saved.is_dir():
        return AutoTokenizer.from_pretrained(saved)
    path = source_tokenizer_path(config)
    if path:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=config.model.trust_remote_code)
        if config.tokenizer.protocol_tokens:
            add_protocol_tokens(tokenizer)  # the model's embedding grows to match (run_model)
    else:
        tokenizer = local_tokenizer(config)
    tokenizer.save_pretrained(saved)
    return tokenizer


def source_tokenizer_path(config: RunConfig) -> str | None:
    """Where the run's tokenizer comes from: ``tokenizer.path``, else the model's; None: the local BPE."""
    return local_or_hub(config.tokenizer.path or config.model.path)


def local_tokenizer(config: RunConfig):
    """The local BPE (data/tokenizer.py) with the run's ``tokenizer`` options."""
    from data.tokenizer import build_tokenizer

    return build_tokenizer(
        split_digits=config.tokenizer.split_digits, protocol_tokens=config.tokenizer.protocol_tokens
    )


def run_data(config: RunConfig, run_dir: Path, tokenizer):
    """``data.path``, or ``data.build`` built into ``RUN_DIR/data`` (once) with the run's tokenizer."""
    from datasets import load_from_disk

    from data.build import build_dataset
    from data.config import parse_config

    cfg = config.data
    if cfg.path:
        return load_from_disk(cfg.path)
    out = run_dir / "data"
    if (out / "dataset_dict.json").is_file():
        return load_from_disk(str(out))
    console.print(f"[bold]data[/] building {out}")
    return build_dataset(parse_config(cfg.build), out, overwrite=True, progress=True, tokenizer=tokenizer)


def run_model(config: RunConfig, run_dir: Path, tokenizer, budgets: Sequence[int] | None):
    """The model the run continues from, and the folder the rollout pool can load it from (``init/``,
    written here, when the run has none yet). ``budgets``: its Selective Attention KV budgets, or None."""
    from transformers import AutoModelForCausalLM

    from rl.model import build_tiny_model

    cfg = config.model
    dtype = getattr(torch, cfg.dtype)
    for folder in (
        run_dir / "final",
        *reversed(complete_checkpoints(run_dir)),
        *(run_dir / name for name in BEFORE_GRPO),
    ):
        if (folder / "config.json").is_file():
            return load_policy(config, folder, budgets), folder
    init = run_dir / "init"
    if cfg.path:  # a Selective Attention checkpoint (an SA export) loads only under its own attention
        model = AutoModelForCausalLM.from_pretrained(
            local_or_hub(cfg.path), dtype=dtype, trust_remote_code=cfg.trust_remote_code,
            attn_implementation=SELECTIVE if config.selective.enabled else cfg.attn_implementation,
        )  # fmt: skip
        if (
            config.tokenizer.protocol_tokens
        ):  # the tags run_tokenizer added: rows for them (rl/added_tokens.py)
            from transformers import AutoTokenizer

            before = AutoTokenizer.from_pretrained(
                source_tokenizer_path(config), trust_remote_code=cfg.trust_remote_code
            )
            grow_embeddings(model, protocol_spellings(before, tokenizer))
    else:
        model = build_tiny_model(tokenizer, cfg.tiny, dtype=dtype)
        model.config._attn_implementation = cfg.attn_implementation
    if config.selective.enabled:
        model.config.selective_attention = True
        model.set_attn_implementation(SELECTIVE)
    set_budgets(model, budgets)
    model.save_pretrained(init)
    tokenizer.save_pretrained(init)
    return model, init


def load_policy(config: RunConfig, folder: Path, budgets: Sequence[int] | None):
    """The policy saved in ``folder``, in the run's dtype and attention, with ``budgets``."""
    from transformers import AutoModelForCausalLM

    cfg = config.model
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, cfg.dtype), trust_remote_code=cfg.trust_remote_code,
        attn_implementation=SELECTIVE if config.selective.enabled else cfg.attn_implementation,
    )  # fmt: skip
    set_budgets(model, budgets)
    return model


def set_budgets(model, budgets: Sequence[int] | None) -> None:
    """Selective Attention KV budgets into the model config (saved with every checkpoint, read by the rollout
    engines, which evict under them, and by the trainer, which replays the evictions); None removes them."""
    from rollouts.selective.eviction import CONFIG_KEY, save_budgets

    if budgets is not None:
        save_budgets(model.config, list(budgets))
    elif hasattr(model.config, CONFIG_KEY):
        delattr(model.config, CONFIG_KEY)

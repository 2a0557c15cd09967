"""`heed pretrain`: Heed's own base model, a small Qwen3 trained from scratch on the corpus Heed generates.

Users post-train a pretrained model; the embedded default does the same with this one. The recipe is
nanochat's shape at toy scale: one YAML (``configs/base/tiny-base.yaml``), a tokenizer, a model built from
a config, AdamW with warm-up and cosine decay over batches that ``data.corpus`` packs (a pure function of
seed and step, so a resumed run sees what an uninterrupted one would), a checkpoint every ``save_every``
steps, and at the end the base written as a HF folder (bf16 safetensors, tokenizer, a model card with what
it can do). The run directory keeps the loss curve (``loss_curve.jsonl``: train loss every ``log_every``
steps, held-out loss every ``eval_every``) and the checkpoint to resume from.

With ``selective.enabled`` the base is a Selective Attention model from its first step, trained with the
paper's memory loss L_mem beside the next-token loss (arXiv 2410.02703, eq. 2): the base the Selective
Attention recipe (``configs/tiny-selective.yaml``) post-trains. Its selection can fade in over a span of
steps (``selective.selection_from_step``, ``selection_ramp_steps``): at full weight from the first step,
head 0 masks the context before the model has learned to read it, and this shape learns to copy slowly or
not at all (``rl.selective.losses.selection_weight``; bench/BENCHMARKS.md). Selective Attention cannot be switched on
over a base pretrained without it: its head 0 then masks what the other heads read, and SFT learns an
answer that reads no context (bench/BENCHMARKS.md, "A standard base under Selective Attention").

What is left out: data parallelism (one process, ``threads`` cores), mixed precision (CPU float32; the
weights are rounded to bf16 once, at the end, and the card's figures are measured on the rounded weights).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from data.corpus import Corpus, CorpusConfig
from rl.config.validation import ConfigError, check, from_mapping
from rl.console import console
from rl.model import TinyModelConfig
from rollouts.selective.constants import DEFAULT_EPS, DEFAULT_TAU, SELECTIVE

STANDARD_COMMAND = "heed pretrain --config configs/base/tiny-base.yaml"  # what a base card names by default
CHECKPOINT = "checkpoint.pt"
CURVE = "loss_curve.jsonl"
CARD = "README.md"
CARD_RESULTS = (
    "heed_base.json"  # the card's figures, machine-readable (tests and `heed pretrain` compare them)
)


@dataclass(kw_only=True)
class RecallWarmup:
    """The first ``steps`` of a run train on the easiest recall tables only (``Corpus.warmup_batch``), in
    rows of their own shape: binding a value to its key forms there first and carries over to the corpus's
    tables and questions (bench/BENCHMARKS.md, "Copying is learned, binding is not"). What it needs is
    updates, not tokens, so its rows are short."""

    steps: int = 0  # 0: no warm-up
    batch_size: int = 8  # rows a warm-up step
    seq_len: int = 128  # tokens a warm-up row
    # after the warm-up every step also trains on a batch of its tables (the losses added): the corpus's
    # gradients otherwise undo the binding before the corpus's own forms can use it
    replay: bool = False
    # from step `terse_after` on (and in replay), this share of the tables is in the tasks' form
    # (" silver-owl: 63."): the step from the easiest binding towards the corpus's forms
    terse_share: float = 0.0
    terse_after: int = 0
    # from step `near_after` on (and in replay), this share of the terse tables has look-alike keys
    # (" silver-owl: 63. silver-fox: 17."): the rung multikey's needles need
    near_share: float = 0.0
    near_after: int = 0
    # from step `sentence_after` on (and in replay), this share of the terse tables (drawn apart from
    # `near_share`) states its facts as the tasks' needles and restates each from its key
    # (" One of the special magic numbers for silver-owl is: 63. ... silver-owl is: 63."): the key
    # several tokens before its value, as a `keyed` focus reads it in a document
    sentence_share: float = 0.0
    sentence_after: int = 0
    # this share of the look-alike tables has every look-alike share the first key's noun
    # (" weak-church: 63. cold-church: 17."): the value then follows the same words in each fact, and only
    # the adjective several tokens back tells them apart, the twin a model that binds by the last word
    # before the value confuses; the rest share the adjective or the noun, drawn
    noun_share: float = 0.0

    def __post_init__(self):
        check(self.steps >= 0, "recall_warmup.steps", "must be >= 0")
        check(self.batch_size >= 1, "recall_warmup.batch_size", "must be >= 1")
        check(self.seq_len >= 16, "recall_warmup.seq_len", "must be >= 16 (a table is ~20-40 tokens)")
        check(0 <= self.terse_share <= 1, "recall_warmup.terse_share", "must be in [0, 1]")
        check(self.terse_after >= 0, "recall_warmup.terse_after", "must be >= 0")
        check(0 <= self.near_share <= 1, "recall_warmup.near_share", "must be in [0, 1]")
        check(self.near_after >= 0, "recall_warmup.near_after", "must be >= 0")
        check(0 <= self.sentence_share <= 1, "recall_warmup.sentence_share", "must be in [0, 1]")
        check(self.sentence_after >= 0, "recall_warmup.sentence_after", "must be >= 0")
        check(0 <= self.noun_share <= 1, "recall_warmup.noun_share", "must be in [0, 1]")
        check(
            not self.noun_share or self.near_share,
            "recall_warmup.noun_share",
            "needs near_share > 0: it is a share of the look-alike tables",
        )
        check(
            not self.near_share or self.terse_share,
            "recall_warmup.near_share",
            "needs terse_share > 0: look-alike keys come in the terse tables",
        )
        check(
            not self.sentence_share or self.terse_share,
            "recall_warmup.sentence_share",
            "needs terse_share > 0: sentence tables are terse tables with their facts in sentences",
        )


@dataclass(kw_only=True)
class SelectivePretrain:
    """Selective Attention from the first step, as the paper pretrains it: the model is built with
    ``selective_attention: true`` and each step's loss adds ``L_mem`` (``rl.selective.losses``)."""

    enabled: bool = False
    memory_eps: float = DEFAULT_EPS  # L_mem's weight (the paper's 0.1)
    memory_tau: float = DEFAULT_TAU  # F at which a key counts as fully masked
    # head 0's selection masks nothing before this step, then fades in linearly over selection_ramp_steps
    # (rl.selective.losses.selection_weight); 0 and 0: the paper's, at full weight from the first step
    selection_from_step: int = 0
    selection_ramp_steps: int = 0

    def __post_init__(self):
        check(self.memory_eps >= 0, "selective.memory_eps", f"must be >= 0, got {self.memory_eps}")
        check(self.memory_tau > 0, "selective.memory_tau", f"must be > 0, got {self.memory_tau}")
        for name in ("selection_from_step", "selection_ramp_steps"):
            check(getattr(self, name) >= 0, f"selective.{name}", f"must be >= 0, got {getattr(self, name)}")


@dataclass(kw_only=True)
class PretrainConfig:
    """One `heed pretrain` run; every key a comment."""

    name: str = "heed-tiny-base"  # the model's name on its card
    run_dir: str = "runs/pretrain"  # checkpoint, loss curve
    out: str = "models/heed-tiny-base"  # the base model folder written at the end
    seed: int = 0  # initialisation and the corpus's batches
    threads: int = 0  # torch threads; 0: every core
    vocab_size: int = 2048  # the local byte-level BPE (data/tokenizer.py), no DA tags
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    seq_len: int = 1024  # tokens a row; the corpus's longest document (24 chunks) is ~800
    batch_size: int = 8  # rows a step
    max_steps: int = 2000
    recall_warmup: RecallWarmup = field(default_factory=RecallWarmup)  # the first steps' tables
    selective: SelectivePretrain = field(default_factory=SelectivePretrain)  # a Selective Attention base
    learning_rate: float = 3.0e-3  # peak
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # the cosine decays to this share of the peak
    weight_decay: float = 0.1  # matrices only (not embeddings or norms)
    max_grad_norm: float = 1.0
    log_every: int = 10  # a progress line and a loss-curve row
    eval_every: int = 250  # held-out loss
    eval_batches: int = 8  # held-out batches (seed + 1's stream, never trained on)
    save_every: int = 100  # checkpoint (resume)
    card_examples: int = 48  # questions per task and phrasing family the card's answering check asks

    def __post_init__(self):
        for name in (
            "seq_len",
            "batch_size",
            "max_steps",
            "log_every",
            "eval_every",
            "eval_batches",
            "save_every",
        ):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.learning_rate > 0, "learning_rate", "must be > 0")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
        faded_in = self.selective.selection_from_step + self.selective.selection_ramp_steps
        check(
            faded_in <= self.max_steps,
            "selective.selection_from_step",
            f"the selection must be whole by max_steps ({self.max_steps}): selection_from_step + "
            f"selection_ramp_steps is {faded_in}",
        )


def load_pretrain_config(path: str | Path, overrides=()) -> PretrainConfig:
    from data.config import read_yaml
    from rl.config import apply_overrides

    raw = apply_overrides(read_yaml(Path(path), ConfigError, "pretrain config") or {}, overrides)
    try:
        return from_mapping(PretrainConfig, raw, "")
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def learning_rate(config: PretrainConfig, step: int) -> float:
    """Linear warm-up to the peak, then a cosine to ``min_lr_ratio`` of it at ``max_steps``; after a recall
    warm-up the corpus's first ``warmup_steps`` ramp up again from zero, so the new distribution's first
    large gradients do not overwrite what the tables taught.

    >>> c = PretrainConfig(max_steps=100, warmup_steps=10, learning_rate=1.0, min_lr_ratio=0.1)
    >>> learning_rate(c, 0), learning_rate(c, 9), round(learning_rate(c, 100), 6)
    (0.1, 1.0, 0.1)
    >>> c = PretrainConfig(max_steps=100, warmup_steps=10, learning_rate=1.0, min_lr_ratio=0.1,
    ...                    recall_warmup=RecallWarmup(steps=20))
    >>> round(learning_rate(c, 19), 3), round(learning_rate(c, 20), 3), round(learning_rate(c, 29), 3)
    (0.978, 0.097, 0.905)
    """
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    done = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    floor = config.min_lr_ratio
    lr = config.learning_rate * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))
    since_corpus = step - config.recall_warmup.steps
    if config.recall_warmup.steps and 0 <= since_corpus < config.warmup_steps:
        lr *= (since_corpus + 1) / config.warmup_steps
    return lr


class Pretraining:
    """The recipe: ``setup`` (tokenizer, model, optimizer, a checkpoint to resume), ``train`` (``step`` after
    ``step``, logging, held-out loss, checkpoints), ``save`` (the base folder and its card)."""

    def __init__(self, config: PretrainConfig):
        self.config = config
        self.run_dir = Path(config.run_dir)
        self.step = 0
        self.tokens = 0
        self.seconds = 0.0

    def setup(self, resume: bool) -> None:
        from data.tokenizer import build_tokenizer
        from rl.model import build_tiny_model

        cfg = self.config
        torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
        checkpoint = self.run_dir / CHECKPOINT
        if checkpoint.exists() and not resume:
            raise FileExistsError(
                f"{self.run_dir} holds a pretraining run: continue it with --resume, or set run_dir to another folder"
            )
        if resume and not checkpoint.exists():
            raise FileNotFoundError(f"{self.run_dir} holds no checkpoint to resume ({CHECKPOINT})")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tokenizer = build_tokenizer(vocab_size=cfg.vocab_size)
        self.model = build_tiny_model(self.tokenizer, cfg.model)
        if cfg.selective.enabled:  # as `heed train` switches a model it built (rl.run_inputs.run_model)
            from rollouts.selective.attention import register_selective_attention

            register_selective_attention()
            self.model.set_attn_implementation(SELECTIVE)  # the registry checks the config and sets the flag
        self.corpus = Corpus(self.tokenizer, cfg.corpus)
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2 and "embed" not in n]
        rest = [p for n, p in self.model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=cfg.learning_rate, betas=(0.9, 0.95), eps=1e-8,
        )  # fmt: skip
        if resume:
            state = torch.load(checkpoint, weights_only=True)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.step, self.tokens, self.seconds = state["step"], state["tokens"], state["seconds"]
            console.print(f"[bold]pretrain[/] resumed at step {self.step} from {checkpoint}")
        self.validation = [
            self.corpus.batch(cfg.seed + 1, i, cfg.batch_size, cfg.seq_len) for i in range(cfg.eval_batches)
        ]

    def train(self) -> None:
        cfg = self.config
        params = sum(p.numel() for p in self.model.parameters())
        console.print(
            f"[bold]pretrain[/] {cfg.name}: {params / 1e6:.2f}M parameters, {cfg.max_steps} steps of "
            f"{cfg.batch_size} x {cfg.seq_len} tokens, {torch.get_num_threads()} threads -> {cfg.out}"
        )
        window: list[float] = []
        started = time.perf_counter() - self.seconds
        while self.step < cfg.max_steps:
            window.append(self.train_step())
            self.seconds = time.perf_counter() - started
            if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                loss = sum(window) / len(window)
                window.clear()
                row = {"step": self.step, "loss": round(loss, 5), "lr": learning_rate(self.config, self.step - 1),
                       "tokens": self.tokens, "seconds": round(self.seconds, 1)}  # fmt: skip
                if self.step % cfg.eval_every == 0 or self.step == cfg.max_steps:
                    row["heldout_loss"] = round(self.heldout_loss(), 5)
                self._append_curve(row)
                self._progress(row)
            if self.step % cfg.save_every == 0 or self.step == cfg.max_steps:
                self.save_checkpoint()

    def train_step(self) -> float:
        """One optimizer step on the batch of ``self.step``; the mean next-token loss."""
        cfg = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(cfg, self.step)
        batches = self.batches(self.step)  # each [B, T]
        self.model.train()
        loss = sum(self.loss(b) for b in batches)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.step += 1
        self.tokens += sum(b.numel() for b in batches)
        return loss.item()

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        """The training loss of one batch ``[B, T]``: next-token, plus L_mem for a Selective Attention base."""
        selective = self.config.selective
        if not selective.enabled:
            return self.model(input_ids=ids, labels=ids).loss
        from rl.selective.losses import forward_with_memory_loss, selection_weight

        weight = selection_weight(self.step, selective.selection_from_step, selective.selection_ramp_steps)
        outputs, l_mem = forward_with_memory_loss(
            self.model, ids, labels=ids, eps=selective.memory_eps, tau=selective.memory_tau,
            selection_weight=weight,
        )  # fmt: skip
        return outputs.loss + l_mem

    def batches(self, step: int) -> list[torch.Tensor]:
        """The token ids ``step`` trains on: ``[recall_warmup.batch_size, recall_warmup.seq_len]`` recall
        tables during the warm-up, then ``[batch_size, seq_len]`` of the corpus (with a batch of tables
        beside it under ``recall_warmup.replay``)."""
        cfg, warmup = self.config, self.config.recall_warmup
        if step < warmup.steps:
            return [self._tables(step)]
        corpus = self.corpus.batch(cfg.seed, step, cfg.batch_size, cfg.seq_len)
        return [corpus, self._tables(step)] if warmup.replay else [corpus]

    def _tables(self, step: int) -> torch.Tensor:
        cfg, warmup = self.config, self.config.recall_warmup
        terse = warmup.terse_share if step >= warmup.terse_after else 0.0
        near = warmup.near_share if step >= warmup.near_after else 0.0
        sentences = warmup.sentence_share if step >= warmup.sentence_after else 0.0
        return self.corpus.warmup_batch(
            cfg.seed, step, warmup.batch_size, warmup.seq_len, terse, near, sentences, warmup.noun_share
        )

    def tokens_left(self) -> int:
        """Tokens the steps still to run will train on."""
        cfg, warmup = self.config, self.config.recall_warmup
        in_warmup = max(0, warmup.steps - self.step)
        in_corpus = max(0, cfg.max_steps - max(self.step, warmup.steps))
        tables = (in_warmup + (in_corpus if warmup.replay else 0)) * warmup.batch_size * warmup.seq_len
        return tables + in_corpus * cfg.batch_size * cfg.seq_len

    @torch.no_grad()
    def heldout_loss(self, model=None) -> float:
        """Mean next-token loss over the held-out batches (``seed + 1``'s stream)."""
        model = model or self.model
        model.eval()
        losses = [model(input_ids=b, labels=b).loss.float().item() for b in self.validation]
        return sum(losses) / len(losses)

    def save_checkpoint(self) -> None:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "step": self.step, "tokens": self.tokens, "seconds": self.seconds}  # fmt: skip
        tmp = self.run_dir / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.run_dir / CHECKPOINT)  # a run stopped mid-write keeps the previous checkpoint

    def save(self, command: str = STANDARD_COMMAND) -> dict:
        """Write the base folder (bf16 weights, tokenizer, card) and return the card's figures; ``command``:
        how the run was started, for the card."""
        from rl.base_card import answering, write_card

        cfg = self.config
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        self.model.to(torch.bfloat16).save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        rounded = self.model.to(torch.float32)  # the bf16-rounded weights, measured in float32
        results = {
            "name": cfg.name,
            "parameters": sum(p.numel() for p in rounded.parameters()),
            "steps": self.step,
            "tokens_seen": self.tokens,
            "train_seconds": round(self.seconds),
            "heldout_loss": round(self.heldout_loss(rounded), 4),
            "answering": answering(rounded, self.tokenizer, self.corpus, cfg.card_examples, cfg.seed + 2),
            "sha256": sha256(out / "model.safetensors"),
            "config": asdict(cfg),
            "command": command,
        }
        (out / CARD_RESULTS).write_text(json.dumps(results, indent=1) + "\n")
        write_card(out / CARD, results)
        return results

    def _append_curve(self, row: dict) -> None:
        with open(self.run_dir / CURVE, "a") as f:
            f.write(json.dumps(row) + "\n")

    def _progress(self, row: dict) -> None:
        cfg = self.config
        rate = row["tokens"] / max(row["seconds"], 1e-9)
        left = self.tokens_left() / max(rate, 1e-9)
        held = f" · held-out {row['heldout_loss']:.3f}" if "heldout_loss" in row else ""
        console.print(
            f"step {self.step}/{cfg.max_steps} · loss {row['loss']:.3f}{held} · {rate / 1e3:.1f}k tok/s · "
            f"{row['seconds'] / 60:.1f} min, ~{left / 60:.0f} min left"
        )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pretrain(config: PretrainConfig, resume: bool = False, command: str = STANDARD_COMMAND) -> dict:
    """Run the recipe and write the base; returns the card's figures. ``command``: the command line that
    started it, which the card records."""
    run = Pretraining(config)
    run.setup(resume)
    run.train()
    console.print("[bold]pretrain[/] writing the base and measuring what it answers")
    results = run.save(command)
    console.print(
        f"[bold]pretrain[/] done: held-out loss {results['heldout_loss']:.4f}, "
        + ", ".join(f"{k} {v['accuracy']:.2f}" for k, v in results["answering"].items())
        + f" -> {config.out}"
    )
    return results

"""SFT warm start: teach the protocol on gold DA traces, under the attention the model will have.

A model that has never seen the protocol rarely emits parseable tags (the paper: 58% parse success for
its smallest model), so RL starts from a short supervised phase on gold traces. Two choices matter:

- the loss is on the completion only (the prompt is context, not a target);
- every completion position is trained under the DA mask of its own trace: a token written in
  ``<focus magic_chunks="2">`` cannot see chunks 1 and 3 while it is learned, exactly as at inference.
  The mask comes from :func:`rl.logprobs.pack`, i.e. from the shared visibility function.

The loop is Hugging Face's ``Trainer`` (so accelerate/DeepSpeed configs apply unchanged) with a
collator that builds the masked batch; the model computes the shifted cross-entropy from ``labels``.
A Selective Attention model (``selective_attention: true``) adds the memory loss ``L_mem`` with weight
``memory_eps`` (:class:`MemoryLossTrainer`; logged as ``memory_loss``), which rewards masking context, and
can fade its selection in from a given step (:func:`selection_weight`, for a base pretrained without it).
``unmasked_share`` trains that share of the rows with full causal attention instead (the same gold trace,
every chunk in view: the ``da-nm`` eval's attention), so the policy still answers when served without its
mask, in plain transformers or stock vLLM. ``copy_rows`` adds, from step ``copy_from_step`` on, the loss of that many copy rows per step
(:func:`rl.copy_rows.with_copy_rows`; logged as ``copy_loss``): a model trained from scratch learns to
pick the evidence chunk from gold traces, but copying the value needs denser targets than they hold.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from transformers import Trainer

from data.prompts import gold_completion, layout_example
from rl.console import console, interactive, quiet_trainer
from rl.copy_rows import IGNORE_INDEX, ValueCopyRows, with_copy_rows
from rl.logprobs import pack
from rl.selective.frozen_selection import check_weight_decay, frozen_selection
from rl.selective.losses import forward_with_memory_loss, selection_weight
from rollouts.masks import trace_completion
from rollouts.protocol import (
    DEFAULT_LAYOUT,
    GLOBAL_STATE,
    PROTOCOL_VERSION,
    LayoutSettings,
    PromptLayout,
    token_bytes_table,
)
from rollouts.selective.attention import AttentionState


def encode_sft_row(example: Mapping, tokenizer, layout: LayoutSettings = DEFAULT_LAYOUT) -> dict:
    """Schema row -> the token-level fields the collator needs (msgpack/arrow friendly).

    ``layout``: how the run lays out prompts; the gold trace is taken in the matching (thinking or not)
    form. The row keeps what :class:`DACollator` needs to rebuild the layout's visibility.
    """
    prompt = layout_example(example, tokenizer, layout)
    gold = tokenizer(gold_completion(example, prompt.thinking), add_special_tokens=False)["input_ids"]
    return {
        "prompt_ids": list(prompt.input_ids),
        "chunk_spans": [list(s) for s in prompt.chunk_spans],
        "index_span": list(prompt.index_span),
        "completion_ids": gold + [tokenizer.eos_token_id],
        "block_size": prompt.block_size,
        "thinking": prompt.thinking,
        "protocol_version": prompt.protocol_version,
        # what a batch pads to, for group_by_length: the prompt's KV blocks (the completions are short). Not
        # the exact token count: sorting by it would also sort rows by trace form, one form a batch
        "length": prompt.num_blocks,
    }


@dataclass
class DACollator:
    """Encoded rows -> ``input_ids``, DA ``attention_mask``, ``position_ids`` and completion-only ``labels``."""

    tokenizer: object
    attn_implementation: str = "sdpa"
    padding_mask: bool = False  # also return ``padding_mask`` [B, T] (True = real token), for L_mem

    def __post_init__(self):
        self._table = token_bytes_table(self.tokenizer)

    def __call__(self, rows: Sequence[Mapping]) -> dict[str, torch.Tensor]:
        traces, completions = [], []
        for row in rows:
            layout = PromptLayout(
                tuple(row["prompt_ids"]),
                row["block_size"],
                tuple(tuple(s) for s in row["chunk_spans"]),
                bool(row["thinking"]),
                protocol_version=row.get("protocol_version", PROTOCOL_VERSION),
                index_span=tuple(row.get("index_span", ())),
            )
            completions.append(list(row["completion_ids"]))
            trace = trace_completion(layout, completions[-1], self._table)
            if row.get("unmasked"):  # every row reads as before any tag: the whole context (da-nm)
                trace = replace(trace, states=(GLOBAL_STATE,), row_state=np.zeros_like(trace.row_state))
            traces.append(trace)
        packed = pack(traces, completions, self.tokenizer.pad_token_id, self.attn_implementation)
        labels = torch.full_like(packed.input_ids, IGNORE_INDEX)
        completion_labels = labels[:, packed.prompt_width :]
        completion_labels[packed.completion_mask] = packed.input_ids[:, packed.prompt_width :][
            packed.completion_mask
        ]
        # only the completion is a target: compute logits for its rows only (position P - 1 predicts
        # the first completion token), which spares the vocabulary projection of every prompt row
        keep = labels.shape[1] - packed.prompt_width + 1
        batch = {
            "input_ids": packed.input_ids,
            "attention_mask": packed.attention_mask,
            "position_ids": packed.position_ids,
            "labels": labels[:, -keep:],
            "logits_to_keep": keep,
        }
        if self.padding_mask:
            prompt_lens = torch.tensor([len(row["prompt_ids"]) for row in rows])
            prompt_real = torch.arange(packed.prompt_width) >= packed.prompt_width - prompt_lens[:, None]
            batch["padding_mask"] = torch.cat([prompt_real, packed.completion_mask.cpu()], 1)
        return batch


@dataclass
class SFTConfig:
    """Warm-start hyperparameters. ``heed train`` fills them from its ``sft`` and ``run`` sections
    (:meth:`rl.config.training.SFTSection.to_sft_config`); the defaults are for calling :func:`train_sft`
    directly on a tiny model."""

    output_dir: str = "runs/sft"  # where checkpoints and logs go
    max_steps: int = 300  # optimizer steps
    per_device_batch_size: int = 16  # examples per step (per device)
    learning_rate: float = 1e-3  # AdamW peak learning rate
    warmup_steps: int = 100  # linear warm-up
    lr_scheduler_type: str = (
        "linear"  # transformers scheduler after the warm-up: linear (decay to 0), constant_with_warmup, ...
    )
    weight_decay: float = 0.0
    logging_steps: int = 10
    seed: int = 0
    layout: LayoutSettings = field(default_factory=LayoutSettings)  # the run's prompt layout; thinking
    # layouts train the <think> form of the gold traces
    deepspeed: str | None = (
        None  # path to a DeepSpeed config (configs/deepspeed/*.json), None for plain DDP/CPU
    )
    memory_eps: float = 0.0  # Selective Attention models: weight of L_mem in the loss (paper: 0.1); 0: off
    memory_tau: float = 1.0  # L_mem's tau
    # Selective Attention models: head 0's selection masks nothing before this step, then fades in over
    # selection_ramp_steps (selection_weight): for a model pretrained without Selective Attention
    selection_from_step: int = 0
    selection_ramp_steps: int = 0
    # Selective Attention models: head 0's query and key rows, the selection logits, get no gradient
    # (rl.selective.frozen_selection): the base's selection is kept while the rest learns to read under it
    freeze_selection: bool = False
    copy_rows: int = 0  # rl.copy_rows.ValueCopyRows rows added to each step's loss (0: none)
    copy_from_step: int = 0  # the first step that adds them
    copy_segment: int = 24  # tokens per segment of a copy row
    copy_until_loss: float | None = None  # copy rows stop once their logged loss is below it (None: never)
    unmasked_share: float = 0.0  # share of rows trained with full causal attention (module docstring)
    group_by_length: bool = False  # batches of rows of similar length (less padding; rows still shuffled)
    bf16: bool = False  # bf16 autocast for the matmuls; weights, optimizer and loss stay in the model's dtype

    def __post_init__(self):
        for name in ("max_steps", "per_device_batch_size", "logging_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"SFTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"SFTConfig.learning_rate must be > 0, got {self.learning_rate}")
        if min(self.selection_from_step, self.selection_ramp_steps) < 0:
            raise ValueError("SFTConfig.selection_from_step and selection_ramp_steps must be >= 0")
        if self.freeze_selection:
            check_weight_decay(self.weight_decay, "SFTConfig.weight_decay")


def training_arguments(config: SFTConfig, **overrides):
    """Hugging Face ``TrainingArguments`` for ``config`` (``overrides`` replace single fields)."""
    from transformers import TrainingArguments

    fields = dict(
        output_dir=config.output_dir,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_batch_size,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps,
        lr_scheduler_type=config.lr_scheduler_type,
        weight_decay=config.weight_decay,
        logging_steps=config.logging_steps,
        seed=config.seed,
        deepspeed=config.deepspeed,
        remove_unused_columns=False,  # the collator reads the encoded columns itself
        report_to=[],
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        # group_by_length: train_sft has already put the rows in an order of length-grouped batches
        train_sampling_strategy="sequential" if config.group_by_length else "random",
        disable_tqdm=not interactive(),  # off a terminal rl.console.ProgressLines prints lines instead
        bf16=config.bf16 and _bf16_here(),
    )
    return TrainingArguments(**{**fields, **overrides})


def _bf16_here() -> bool:
    """Whether ``sft.bf16`` can take effect here; when not, the phase runs in float32 and says so."""
    if bf16_kernels():
        return True
    console.print("[yellow]sft.bf16[/]: this machine has no bf16 matmul kernels; training runs in float32")
    return False


def train_sft(model, tokenizer, train_rows: Sequence[Mapping], config: SFTConfig, callbacks=()):
    """Run the warm start; returns the HF ``Trainer`` (its ``state.log_history`` holds the losses)."""
    from datasets import Dataset

    draw = random.Random(config.seed)
    encoded = Dataset.from_list(
        [
            {**encode_sft_row(r, tokenizer, config.layout), "unmasked": draw.random() < config.unmasked_share}
            for r in train_rows
        ]
    )
    args = training_arguments(config)
    if config.group_by_length:  # one length per optimizer step, so every rank's micro-batches share it
        step_rows = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
        encoded = encoded.select(length_grouped_order(encoded["length"], step_rows, config.seed))
    fade_in = config.selection_from_step or config.selection_ramp_steps
    memory = getattr(model.config, "selective_attention", False) and (config.memory_eps > 0 or fade_in)
    collator = DACollator(tokenizer, model.config._attn_implementation or "sdpa", padding_mask=memory)
    trainer_cls, extra = (MemoryLossTrainer, {"memory": config}) if memory else (Trainer, {})
    if config.copy_rows:
        size = config.copy_rows * max(config.max_steps - config.copy_from_step, 1)
        rows = ValueCopyRows.for_tokenizer(
            tokenizer, segment=config.copy_segment, size=size, seed=config.seed
        )
        trainer_cls = with_copy_rows(trainer_cls)
        extra |= {
            "copy_rows": rows,
            "copy_per_step": config.copy_rows,
            "copy_from_step": config.copy_from_step,
            "copy_until_loss": config.copy_until_loss,
        }
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=encoded,
        data_collator=collator,
        callbacks=list(callbacks),
        **extra,
    )
    frozen = frozen_selection(model) if config.freeze_selection else contextlib.nullcontext()
    with frozen:
        quiet_trainer(trainer).train()
    return trainer


def bf16_kernels() -> bool:
    """Whether bf16 autocast has fast matmuls here: a CUDA device that supports it, or a CPU with bf16
    instructions (AVX512-BF16, AMX), where oneDNN runs them natively rather than emulated (slower than
    float32)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int) -> list[int]:
    """Row indices in an order whose consecutive runs of ``batch_size`` rows share one length: rows are
    shuffled, cut into batches within each length, and the batches shuffled (the rows that fill no whole
    batch of their length come last). Unlike transformers' ``group_by_length``, which sorts each
    mega-batch, neither the rows of a batch nor the order of batches follows the length or anything
    that correlates with it (a sort by exact tokens would put one trace form in a batch).

    >>> order = length_grouped_order([7, 11, 7, 11, 7, 7], batch_size=2, seed=0)
    >>> sorted(order), [{[7, 11, 7, 11, 7, 7][i] for i in order[j : j + 2]} for j in (0, 2, 4)]
    ([0, 1, 2, 3, 4, 5], [{7}, {11}, {7}])
    """
    rng = random.Random(seed)
    rows = list(range(len(lengths)))
    rng.shuffle(rows)
    by_length: dict[int, list[int]] = {}
    for i in rows:
        by_length.setdefault(lengths[i], []).append(i)
    batches, rest = [], []
    for group in by_length.values():
        whole = len(group) - len(group) % batch_size
        batches += [group[j : j + batch_size] for j in range(0, whole, batch_size)]
        rest += group[whole:]
    rng.shuffle(batches)
    return [i for batch in batches for i in batch] + rest


class MemoryLossTrainer(Trainer):
    """``Trainer`` whose loss is the LM loss plus ``L_mem`` (paper eq. 2) of a Selective Attention model,
    computed in the same forward, with head 0's selection faded in as ``selection_weight`` says; the mean
    ``L_mem`` since the last log goes out as ``memory_loss``."""

    def __init__(self, *args, memory: SFTConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.memory = memory
        self._memory_losses: list[float] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        padding_mask = inputs.pop("padding_mask")
        cfg = self.memory
        outputs, l_mem = forward_with_memory_loss(
            model, padding_mask=padding_mask, eps=cfg.memory_eps, tau=cfg.memory_tau,
            selection_weight=self.step_selection_weight(), **inputs,
        )  # fmt: skip
        self._memory_losses.append(float(l_mem.detach()))
        loss = outputs.loss + l_mem
        return (loss, outputs) if return_outputs else loss

    def step_selection_weight(self) -> float:
        """Head 0's selection weight at this step (:func:`selection_weight`)."""
        cfg = self.memory
        return selection_weight(self.state.global_step, cfg.selection_from_step, cfg.selection_ramp_steps)

    def step_forward_kwargs(self) -> dict:
        """Model kwargs for this step's other training forwards (:func:`rl.copy_rows.with_copy_rows`' rows):
        the selection at this step's weight, so a fade-in fades it in for every row the step trains on (a
        forward without ``heed_state`` runs the full selection)."""
        return {"heed_state": AttentionState(selection_weight=self.step_selection_weight())}

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if self._memory_losses and "loss" in logs:
            logs = {**logs, "memory_loss": sum(self._memory_losses) / len(self._memory_losses)}
            self._memory_losses = []
        super().log(logs, *args, **kwargs)

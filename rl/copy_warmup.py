"""Copy warm-up: form the copying (induction) circuit before the SFT warm start.

Needle tasks are answered by copying: inside ``<focus magic_chunks="5">`` the policy writes the needle
sentence out of chunk 5 (key, then number), and ``<answer>`` repeats the number it just wrote. A model
trained from scratch on gold traces learns the protocol and even which chunk to focus long before it
can copy (bench/BENCHMARKS.md, "Training: the embedded default": after 520 SFT steps the tiny model
focuses the needle's chunk but writes a needle with an invented key and number).

Copying is what induction heads do (Olsson et al., 2022): attend to the token after the previous
occurrence of the current token and predict it. They form abruptly on text whose second half repeats
its first. So before SFT the model trains on exactly that, for a few hundred cheap steps: a span of
random vocabulary tokens shown twice, the loss on the repeat only (the first half is unpredictable
noise and would teach nothing but the unigram distribution). The tiny default model's copy accuracy on
the repeat jumps from ~0 to 100% between steps 200 and 250 of this. On the embedded default it then
cuts the SFT loss at equal steps (0.257 vs 0.345 at step 440) but has not yet made the greedy policy
answer, so ``configs/tiny.yaml`` leaves it off (bench/BENCHMARKS.md, "Training: the embedded default").

The loop is Hugging Face's ``Trainer`` with the SFT phase's arguments (DDP/DeepSpeed apply unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch.utils.data import Dataset
from transformers import Trainer

from rl.sft import IGNORE_INDEX, SFTConfig, training_arguments


@dataclass
class RepeatedSpans(Dataset):
    """Row ``i``: ``span`` random token ids, then the same ``span`` ids again; the labels are the repeat
    (its first token excepted: nothing before it predicts it). Deterministic in ``(seed, i)``."""

    token_ids: torch.Tensor  # [V'] the ids a span is drawn from (the tokenizer's ordinary tokens)
    span: int
    size: int
    seed: int = 0

    def __post_init__(self):
        if self.span < 2:
            raise ValueError(f"RepeatedSpans.span must be >= 2, got {self.span}")
        if len(self.token_ids) < 2:
            raise ValueError("RepeatedSpans needs at least two token ids to draw spans from")

    def __len__(self) -> int:
        return self.size

    def held_out(self, size: int = 16) -> RepeatedSpans:
        """``size`` rows none of these rows repeat: row ``i`` of seed ``s`` is drawn from ``s * 1000003 + i``,
        so seed ``s + 1`` overlaps only from index 1000003 on."""
        return replace(self, size=size, seed=self.seed + 1)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        span = self.token_ids[torch.randint(len(self.token_ids), (self.span,), generator=generator)]
        input_ids = torch.cat([span, span])  # [2 * span]
        labels = input_ids.clone()
        labels[: self.span + 1] = IGNORE_INDEX
        return {"input_ids": input_ids, "labels": labels}


def ordinary_token_ids(tokenizer) -> torch.Tensor:
    """Every id of ``tokenizer`` except special and added tokens (chat markers, ``<think>``, ...)."""
    excluded = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_encoder.values())
    return torch.tensor([i for i in range(len(tokenizer)) if i not in excluded])


def copy_accuracy(model, rows: RepeatedSpans, n: int = 16) -> float:
    """Greedy next-token accuracy on the repeated halves of the first ``n`` rows (1.0 = copies exactly)."""
    batch = torch.stack([rows[i]["input_ids"] for i in range(n)]).to(model.device)
    with torch.no_grad():
        predicted = model(input_ids=batch).logits[:, rows.span : -1].argmax(-1)  # [n, span - 1]
    return (predicted == batch[:, rows.span + 1 :]).float().mean().item()


def train_copy_warmup(model, tokenizer, config: SFTConfig, *, steps: int, span: int, callbacks=()) -> Trainer:
    """``steps`` optimizer steps on :class:`RepeatedSpans` with ``config``'s batch size, learning rate and
    warm-up (held constant afterwards, so the circuit can still form late); returns the ``Trainer``."""
    rows = RepeatedSpans(
        ordinary_token_ids(tokenizer), span, steps * config.per_device_batch_size, seed=config.seed
    )
    args = training_arguments(
        config,
        output_dir=f"{config.output_dir}/copy_warmup",
        max_steps=steps,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=min(config.warmup_steps, steps),
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=list(callbacks))
    trainer.train()
    return trainer

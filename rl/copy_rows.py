"""Copy rows: the skill needle tasks need, in miniature — find a value in the context and copy it.

Needle tasks are answered by copying: inside ``<focus magic_chunks="5">`` the policy writes the magic
number it sees in chunk 5, and ``<answer>`` repeats it. A tiny model trained only on gold traces learns
the protocol, and which chunk to focus, long before it copies: a gold trace holds two or three copy
targets among hundreds of context tokens, so attention to the one value token starts out diluted over
the whole context and its gradient is tiny (bench/BENCHMARKS.md, "Training: the embedded default": the
value's loss stays at chance for hundreds of SFT steps).

So the model also trains on that skill in miniature: rows of short segments, each holding random
ordinary tokens, one value token somewhere, then a protocol tag's last token (``">`` of a focus tag, and
``>`` of ``<answer>`` or the whole tag where the tokenizer has it as one token) and the value again, the
loss on that value only. In a ``segment``-token window the value is one token among two dozen, not
among hundreds, so the head that finds it and the copy through its values form within ~75 steps on the
tiny default alone (held-out copy accuracy 0 -> 0.99), or in ~200 steps mixed into SFT. Two ways to use
the rows:

- :func:`with_copy_rows`, rows added to every SFT step from a given step on (``sft.copy_mix_rows``,
  :func:`rl.sft.train_sft`). The embedded default does this: a model that copies *before* SFT learns
  which chunk to focus far more slowly (bench/BENCHMARKS.md), so the copy rows join once chunk choice is
  under way;
- :func:`rl.copy_warmup.train_copy_warmup`, a phase of them before SFT (``sft.copy_warmup_steps``).

What it leaves out: multi-token values (a value is one token, as the tiny default's two-digit numbers
are with the local tokenizer) and content-based induction (the row never repeats a span), which this
model does not form in the few hundred steps the default can afford.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch.utils.data import Dataset
from transformers import Trainer

from rl.console import console

IGNORE_INDEX = -100  # the label transformers' loss skips: every position but the copied values (and SFT's)
# The tag ends after which the protocol copies a value: a focus tag's and the answer tag's last token.
COPY_CUES = ('<focus magic_chunks="1">', "<answer>")


@dataclass
class ValueCopyRows(Dataset):
    """Row ``i``: ``segments`` segments of ``segment`` tokens, each ``noise.. VALUE noise.. CUE VALUE``;
    the labels are each segment's last token (the copied value). Deterministic in ``(seed, i)``."""

    noise_ids: torch.Tensor  # [N] ordinary tokens that are not values
    value_ids: torch.Tensor  # [V] the tokens a value can be
    cue_ids: torch.Tensor  # [C] the tokens right before a copied value
    segment: int = 24
    segments: int = 5
    size: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.segment < 4:
            raise ValueError(
                f"ValueCopyRows.segment must be >= 4 (value, cue, copy and a token of noise), got {self.segment}"
            )
        if min(len(self.noise_ids), len(self.value_ids), len(self.cue_ids)) < 1:
            raise ValueError("ValueCopyRows needs noise, value and cue token ids")

    def __len__(self) -> int:
        return self.size

    def held_out(self, size: int = 64) -> ValueCopyRows:
        """``size`` rows drawn from another seed (row ``i`` of seed ``s`` uses ``s * 1000003 + i``)."""
        return replace(self, size=size, seed=self.seed + 1)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        n, k = self.segment, self.segments
        draw = lambda pool, size: pool[torch.randint(len(pool), (size,), generator=g)]  # noqa: E731
        input_ids = draw(self.noise_ids, n * k).view(k, n)  # [k, n]
        values = draw(self.value_ids, k)
        where = torch.randint(n - 3, (k,), generator=g)  # the value sits before the cue, never on it
        input_ids[torch.arange(k), where] = values
        input_ids[:, -2] = draw(self.cue_ids, k)
        input_ids[:, -1] = values
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[:, -1] = values
        return {"input_ids": input_ids.flatten(), "labels": labels.flatten()}

    @classmethod
    def for_tokenizer(cls, tokenizer, **fields) -> ValueCopyRows:
        """Rows over ``tokenizer``: values are its number tokens written after a space (" 63"), noise every
        other ordinary token without a digit, cues the last tokens of ``COPY_CUES``."""
        ordinary = ordinary_token_ids(tokenizer).tolist()
        text = {i: tokenizer.decode([i]) for i in ordinary}
        values = [i for i in ordinary if text[i][:1] == " " and text[i][1:].isdigit()]
        noise = [i for i in ordinary if not any(ch.isdigit() for ch in text[i])]
        cues = sorted({tokenizer(c, add_special_tokens=False)["input_ids"][-1] for c in COPY_CUES})
        if not values:
            raise ValueError(
                "the tokenizer has no single-token numbers (' 63'): the copy warm-up has no values to copy"
            )
        return cls(torch.tensor(noise), torch.tensor(values), torch.tensor(cues), **fields)


def ordinary_token_ids(tokenizer) -> torch.Tensor:
    """Every id of ``tokenizer`` except special and added tokens (chat markers, ``<think>``, ...)."""
    excluded = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_encoder.values())
    return torch.tensor([i for i in range(len(tokenizer)) if i not in excluded])


def copy_accuracy(model, rows: ValueCopyRows, n: int = 64) -> float:
    """Greedy accuracy on the copied values of the first ``n`` rows (1.0 = every value copied)."""
    batch = [rows[i] for i in range(min(n, len(rows)))]
    input_ids = torch.stack([r["input_ids"] for r in batch]).to(model.device)  # [n, T]
    labels = torch.stack([r["labels"] for r in batch]).to(model.device)
    with torch.no_grad():
        predicted = model(input_ids=input_ids).logits[:, :-1].argmax(-1)  # [n, T - 1]: predicts t + 1
    scored = labels[:, 1:] != IGNORE_INDEX
    return (predicted[scored] == labels[:, 1:][scored]).float().mean().item()


def value_loss(model, input_ids: torch.Tensor, labels: torch.Tensor, **forward_kwargs) -> torch.Tensor:
    """The mean cross-entropy of the labelled tokens of copy rows, the loss ``model(input_ids, labels=labels)``
    computes, with logits for the rows that predict a label only: a copy row labels one token per segment,
    so the full ``[B, T, vocab]`` projection would be spent on ``T / segment`` useful rows. Every row of the
    batch must label the same positions (:class:`ValueCopyRows` rows do). ``forward_kwargs`` go to the
    model (a Selective Attention model's ``heed_state``).
    """
    labelled = labels != IGNORE_INDEX  # [B, T]
    if not bool((labelled == labelled[0]).all()) or bool(labelled[:, 0].any()):
        raise ValueError("value_loss: every row must label the same positions, none at position 0")
    targets = labelled[0].nonzero().squeeze(1)  # [K] positions of the labels
    logits = model(
        input_ids=input_ids, logits_to_keep=targets - 1, **forward_kwargs
    ).logits  # [B, K, vocab]: rows t - 1 predict t
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels[:, targets].flatten())


def with_copy_rows(trainer_cls: type[Trainer]) -> type[Trainer]:
    """``trainer_cls`` whose loss, from step ``copy_from_step`` on, adds the mean loss of
    ``copy_per_step`` :class:`ValueCopyRows` rows (the next ones each step; logged as ``copy_loss``):
    copy rows kept in the SFT mix, so copying is taught densely while the protocol is learned.
    ``copy_until_loss``: the rows stop once a logged ``copy_loss`` (their mean since the last log) is
    below it: copying has formed, and the gold traces' own values keep it (None: to the last step).
    The rows' forward takes the trainer's ``step_forward_kwargs()`` where it has one (a Selective
    Attention fade-in's weight: the rows train the model the traces train at this step)."""

    class CopyMixTrainer(trainer_cls):
        def __init__(
            self, *args, copy_rows: ValueCopyRows, copy_per_step: int, copy_from_step: int = 0,
            copy_until_loss: float | None = None, **kwargs,
        ):  # fmt: skip
            super().__init__(*args, **kwargs)
            self.copy_rows, self.copy_per_step, self.copy_from_step = copy_rows, copy_per_step, copy_from_step
            self.copy_until_loss = copy_until_loss
            self.copy_stopped_at: int | None = None  # the step after which no copy rows were added
            self._copy_losses: list[float] = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            step = self.state.global_step
            if step < self.copy_from_step or self.copy_stopped_at is not None:
                return out
            first = ((step - self.copy_from_step) * self.copy_per_step) % len(self.copy_rows)
            rows = [self.copy_rows[(first + i) % len(self.copy_rows)] for i in range(self.copy_per_step)]
            batch = {k: torch.stack([r[k] for r in rows]).to(model.device) for k in ("input_ids", "labels")}
            copy_loss = value_loss(model, **batch, **self.step_forward_kwargs())
            self._copy_losses.append(float(copy_loss.detach()))
            if return_outputs:
                loss, outputs = out
                return loss + copy_loss, outputs
            return out + copy_loss

        def step_forward_kwargs(self) -> dict:
            parent = getattr(super(), "step_forward_kwargs", None)
            return parent() if parent is not None else {}

        def log(self, logs: dict[str, float], *args, **kwargs) -> None:
            if self._copy_losses and "loss" in logs:
                copy_loss = sum(self._copy_losses) / len(self._copy_losses)
                # every rank logs at the same steps: their mean, so that all of them stop at one step
                copy_loss = self.accelerator.reduce(torch.tensor(copy_loss, device=self.args.device), "mean")
                copy_loss = float(copy_loss)
                logs = {**logs, "copy_loss": copy_loss}
                self._copy_losses = []
                if self.copy_until_loss is not None and copy_loss < self.copy_until_loss:
                    self.copy_stopped_at = self.state.global_step
                    console.print(
                        f"copy rows stop at step {self.copy_stopped_at}: copying has formed "
                        f"(copy_loss {copy_loss:.3f} < {self.copy_until_loss})"
                    )
            super().log(logs, *args, **kwargs)

    CopyMixTrainer.__name__ = CopyMixTrainer.__qualname__ = f"CopyMix{trainer_cls.__name__}"
    return CopyMixTrainer

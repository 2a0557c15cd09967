"""Copy warm-up: teach a model trained from scratch to find a value in its context and copy it, before SFT.

A model trained from scratch learns the protocol from gold traces long before it copies the values it
reads (rl/copy_rows.py says why). The copy warm-up trains on copy rows alone first: at most
``sft.copy_warmup_steps`` steps, until the held-out copy accuracy reaches ``target_accuracy`` (checked
every ``CHECK_EVERY`` steps). The embedded default mixes the rows into SFT instead (``sft.copy_mix_rows``):
a model that copies *before* SFT learns which chunk to focus far more slowly (bench/BENCHMARKS.md).

The loop is Hugging Face's ``Trainer`` with the SFT phase's arguments (DDP/DeepSpeed apply unchanged).
"""

from __future__ import annotations

from transformers import Trainer, TrainerCallback

from rl.console import quiet_trainer
from rl.copy_rows import ValueCopyRows, copy_accuracy
from rl.sft import SFTConfig, training_arguments

CHECK_EVERY = 25  # steps between held-out copy-accuracy checks


class StopAtCopyAccuracy(TrainerCallback):
    """Checks the held-out copy accuracy every ``CHECK_EVERY`` steps and stops training at ``target``."""

    def __init__(self, model, held_out: ValueCopyRows, target: float):
        self.model, self.held_out, self.target = model, held_out, target
        self.accuracy: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % CHECK_EVERY == 0 or state.global_step == state.max_steps:
            training = self.model.training
            self.model.eval()
            self.accuracy = copy_accuracy(self.model, self.held_out)
            self.model.train(training)
            state.log_history.append({"step": state.global_step, "copy_accuracy": self.accuracy})
            if self.accuracy >= self.target:
                control.should_training_stop = True
        return control


def train_copy_warmup(
    model, tokenizer, config: SFTConfig, *, steps: int, segment: int = 24, target_accuracy: float = 0.95,
    callbacks=(),
) -> tuple[Trainer, StopAtCopyAccuracy]:  # fmt: skip
    """At most ``steps`` optimizer steps on :class:`ValueCopyRows` (two rows' worth of segments per SFT
    example: batch ``2 x`` SFT's), SFT's learning rate and warm-up (held constant afterwards), until the
    held-out copy accuracy reaches ``target_accuracy``. Returns the ``Trainer`` and the criterion (its
    ``accuracy`` is the last one measured)."""
    batch = 2 * config.per_device_batch_size
    rows = ValueCopyRows.for_tokenizer(tokenizer, segment=segment, size=steps * batch, seed=config.seed)
    args = training_arguments(
        config,
        output_dir=f"{config.output_dir}/copy_warmup",
        max_steps=steps,
        per_device_train_batch_size=batch,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=min(config.warmup_steps, steps),
    )
    criterion = StopAtCopyAccuracy(model, rows.held_out(), target_accuracy)
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[criterion, *callbacks])
    quiet_trainer(trainer).train()
    return trainer, criterion

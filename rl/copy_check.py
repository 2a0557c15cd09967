"""Does the policy copy? The teacher-forced loss of the answer's tokens in gold traces.

Retrieval needs a model that, having focused the evidence chunk, writes the value it reads there. A tiny
model can learn the protocol (tags, chunk choice) and still invent every value, which leaves GRPO
nothing to reinforce: accuracy-gated rewards never pay. So after SFT the recipe measures, on held-out
gold traces under their own DA masks, the cross-entropy of the tokens that spell a reference answer
(the value inside `<focus>` and inside `<answer>`) and compares it with a uniform guess over the
vocabulary (``log V``). A policy that copies sits far below uniform; one that guesses, near it.

Left out: which occurrence is wrong when it fails (focus or answer: both are averaged), and answers the
trace does not spell verbatim (aggregation, counting).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from data.prompts import gold_completion
from rl.sft import DACollator, encode_sft_row
from rollouts.protocol import DEFAULT_LAYOUT, LayoutSettings


class CopyCheckFailed(RuntimeError):
    """The SFT policy's value loss is above ``sft.copy_check_max_nll``."""


@dataclass(frozen=True)
class CopyCheck:
    """Value tokens' teacher-forced loss on ``n`` gold traces."""

    value_nll: float  # mean cross-entropy (nats) of the answer's tokens wherever the trace writes them
    value_accuracy: float  # share of those tokens that are the model's argmax
    uniform_nll: float  # log(vocabulary size): what a guess would score
    tokens: int  # value tokens measured
    n: int  # traces

    def summary(self) -> str:
        return (
            f"value copy (teacher-forced, {self.n} held-out gold traces, {self.tokens} value tokens): "
            f"NLL {self.value_nll:.3f} nats (uniform {self.uniform_nll:.2f}), argmax right {self.value_accuracy:.3f}"
        )


def value_token_mask(completion: str, answers: Sequence[str], tokenizer) -> list[bool]:
    """One flag per token of ``completion``: does the token lie inside a verbatim occurrence of an answer?

    >>> class Chars:  # a tokenizer with one token per character
    ...     def __call__(self, text, add_special_tokens, return_offsets_mapping):
    ...         return {"input_ids": list(range(len(text))), "offset_mapping": [(i, i + 1) for i in range(len(text))]}
    >>> "".join("^" if f else "." for f in value_token_mask("<f> 42</f><a> 42</a>", ["42"], Chars()))
    '....^^........^^....'
    """
    spans = []
    for answer in answers:
        start = completion.find(answer) if answer else -1
        while start >= 0:
            spans.append((start, start + len(answer)))
            start = completion.find(answer, start + 1)
    offsets = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    # a token belongs to the value when it holds a value character (" 42": the space comes along)
    return [any(s < b and a < e for a, b in spans) for s, e in offsets]


@torch.no_grad()
def check_copying(
    model,
    tokenizer,
    examples: Sequence[Mapping],
    layout: LayoutSettings = DEFAULT_LAYOUT,
    *,
    batch_size: int = 16,
) -> CopyCheck | None:
    """Teacher-force the gold traces of ``examples`` (laid out with ``layout``) under their DA masks; the loss
    and argmax accuracy of their value tokens (None when no trace writes its answer verbatim)."""
    collator = DACollator(tokenizer, model.config._attn_implementation or "sdpa")
    was_training = model.training
    model.eval()
    nll, right, tokens = 0.0, 0, 0
    for i in range(0, len(examples), batch_size):
        part = examples[i : i + batch_size]
        rows = [encode_sft_row(e, tokenizer, layout) for e in part]
        batch = collator(rows)
        labels = batch.pop("labels")  # [B, K]: column 0 is the last prompt row, 1.. the completion
        device = next(model.parameters()).device
        logits = model(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).cpu()  # [B, K-1, V]: row t predicts label t+1
        for b, example in enumerate(part):
            text = gold_completion(example, rows[b]["thinking"])
            flags = value_token_mask(text, [str(a) for a in example["answers"]], tokenizer)
            cols = torch.tensor([1 + j for j, f in enumerate(flags) if f], dtype=torch.long)
            if not len(cols):
                continue
            target = labels[b, cols]
            nll -= float(logp[b, cols - 1].gather(-1, target[:, None]).sum())
            right += int((logp[b, cols - 1].argmax(-1) == target).sum())
            tokens += len(cols)
    model.train(was_training)
    if not tokens:
        return None
    return CopyCheck(nll / tokens, right / tokens, math.log(logp.shape[-1]), tokens, len(examples))

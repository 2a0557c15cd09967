"""The DA tags as new tokens of a pretrained model: the tokenizer gains them, the embedding grows to hold
them, and each new row starts as the mean of the rows of the text it replaces.

A pretrained tokenizer (Qwen3's, or Heed's own base) spells ``<global>`` as a few BPE pieces. Adding each
tag as one token (``rollouts.protocol.PROTOCOL_TAG_TOKENS``, as Qwen3 has ``<think>``) makes a mode tag one
forward instead of three and a focus tag three instead of eight; the tags decode to their text, so the
parser, the masks and the accounting see the same completions either way.

The rule for the new rows: the mean of the old spelling's rows. ``<global>`` starts as the average of what
the model read for ``<``, ``global``, ``>``: an input it already "understands", and (for an output head
that is not tied to the input) a logit that is the mean of the pieces' logits, so the tag is neither
forced nor impossible before SFT teaches it. HF's own default (the mean of *all* rows plus noise) would
start every tag at the same place, meaningless and indistinguishable. Tied embeddings (one matrix for
input and output, Qwen3-0.6B's) get the rule once.

An embedding padded beyond the vocabulary (Qwen3's 151,936 rows for 151,669 tokens) already has rows for
the new ids: they are initialised in place and the matrix keeps its size. What is left out: new rows of
other per-token tensors (a model with per-token biases would need them too; Qwen3 has none).
"""

from __future__ import annotations

import torch

from rollouts.protocol import PROTOCOL_TAG_TOKENS


def add_protocol_tokens(tokenizer) -> None:
    """Add the DA tags ``tokenizer`` lacks as added (not special) tokens, in protocol order: they decode to
    their text, as Qwen3's ``<think>`` does. Tags that are tokens already stay as they are."""
    vocab = tokenizer.get_vocab()
    tokenizer.add_tokens([tag for tag in PROTOCOL_TAG_TOKENS if tag not in vocab])


def protocol_spellings(before, after) -> dict[int, list[int]]:
    """For each DA tag that is a token of ``after`` but not of ``before`` (the same tokenizer before
    :func:`add_protocol_tokens`): its id in ``after`` -> the ids its text tokenized to in ``before``."""
    had = before.get_vocab()
    return {
        after.convert_tokens_to_ids(tag): before(tag, add_special_tokens=False)["input_ids"]
        for tag in PROTOCOL_TAG_TOKENS
        if tag not in had and tag in after.get_vocab()
    }


@torch.no_grad()
def grow_embeddings(model, spellings: dict[int, list[int]]) -> None:
    """Make room in ``model``'s embedding (and an untied output head) for every id in ``spellings`` and set
    each new row to the mean of its old spelling's rows (module docstring)."""
    if not spellings:
        return
    rows = model.get_input_embeddings().weight.shape[0]
    needed = max(spellings) + 1
    if needed > rows:
        # the old rows are kept; HF initialises the new ones, which are overwritten below
        model.resize_token_embeddings(needed, mean_resizing=False)
    matrices = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != matrices[0].data_ptr():  # untied: its rows too
        matrices.append(head.weight)
    for weight in matrices:
        for new, old in spellings.items():
            if not old or max(old) >= new:
                raise ValueError(f"token {new}'s old spelling {old} must be earlier tokens of the vocabulary")
            weight[new] = weight[old].float().mean(0).to(weight.dtype)

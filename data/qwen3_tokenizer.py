"""A tokenizer of Qwen3's size and layout, built locally: what a user's Qwen3 run tokenizes with, for runs
that cannot download it.

Qwen3's tokenizer is a byte-level BPE of 151,643 tokens, then 26 added tokens at fixed ids (``<|endoftext|>``
151,643, ``<|im_start|>`` 151,644, ``<|im_end|>`` 151,645, ..., ``<think>`` 151,667, ``</think>`` 151,668),
151,669 in all, and its models pad the embedding to 151,936 rows. Paths that only a vocabulary this size
exercises (a 151,936-row embedding tied to the output head, the DA tags added past the added tokens and
inside the padding, a weight sync and an export of a model whose embedding is a fifth of its weights) need
that layout, not Qwen's merges.

So the merges are Heed's: the local BPE (:func:`data.tokenizer.build_tokenizer`) trained on the shipped word
list, then filled to 151,643 tokens with merges of bytes that ASCII text never holds (pairs, then triples,
of the byte-level alphabet's symbols for bytes 0x80-0xFF, in a fixed order). Text in the word list's
language tokenizes exactly as the small BPE tokenizes it; the filler tokens only change how non-ASCII
bytes split. The chat template is :data:`data.tokenizer.CHAT_TEMPLATE` (ChatML, tools, Qwen3's
``enable_thinking`` switch). What is left out: Qwen's merges and pre-tokenizer regex (a model trained on
one vocabulary reads nothing through the other anyway), and its vision and FIM tokens' meaning (they are
ids, as in Qwen3's text models).
"""

from __future__ import annotations

import itertools
import json

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rollouts.protocol.tokens import byte_decoder

from .tokenizer import CHAT_TEMPLATE, build_tokenizer

QWEN3_BPE_TOKENS = 151_643  # ids 0..151,642: the byte-level BPE
QWEN3_EMBEDDING_ROWS = 151_936  # the models' embedding, padded past the tokenizer
# Qwen3's added tokens from id 151,643 on, in order; True: special (skipped when decoding with
# skip_special_tokens), as in Qwen3's tokenizer_config.json.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
    ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)  # fmt: skip
QWEN3_VOCAB = QWEN3_BPE_TOKENS + len(QWEN3_ADDED_TOKENS)  # 151,669


def build_qwen3_sized_tokenizer(base_vocab: int = 4096) -> PreTrainedTokenizerFast:
    """Qwen3's vocabulary layout (module docstring) over the local BPE of ``base_vocab`` tokens."""
    small = build_tokenizer(vocab_size=base_vocab)
    vocab = small.backend_tokenizer.get_vocab(with_added_tokens=False)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in _merges(small)]
    if len(vocab) != max(vocab.values()) + 1:
        raise ValueError("the local BPE's ids are not contiguous")
    for left, right in _filler_pairs():
        if len(vocab) == QWEN3_BPE_TOKENS:
            break
        if left + right in vocab:
            continue
        vocab[left + right] = len(vocab)
        merges.append((left, right))

    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(
        [AddedToken(t, special=special, normalized=False) for t, special in QWEN3_ADDED_TOKENS]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
    )
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [t for t, special in QWEN3_ADDED_TOKENS if special]}
    )
    if len(tokenizer) != QWEN3_VOCAB:
        raise AssertionError(f"built {len(tokenizer)} tokens, Qwen3 has {QWEN3_VOCAB}")
    return tokenizer


def _merges(tokenizer) -> list:
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]


def _filler_pairs():
    """Pairs of byte-level symbols of bytes 0x80-0xFF, then (pair, symbol) triples: merges ASCII never meets."""
    byte_of = byte_decoder()
    high = sorted((s for s in pre_tokenizers.ByteLevel.alphabet() if byte_of[s] >= 0x80), key=byte_of.get)
    pairs = list(itertools.product(high, high))
    yield from pairs
    for (a, b), c in itertools.product(pairs, high):
        yield a + b, c

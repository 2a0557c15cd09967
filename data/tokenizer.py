"""A small byte-level BPE tokenizer with a ChatML-style chat template, built locally (no hub).

Tests, the demo and the embedded default job need a real HF tokenizer with a chat template that
knows tool calls and a thinking switch, like Qwen3's, without downloading one. This trains a
byte-level BPE (the same family as Qwen's and Llama 3's) on text made from the word list shipped in
``data/resources/words.txt`` plus the protocol's own tags, so tags tokenize into few tokens.
Training is deterministic: the same arguments give the same vocabulary.

``split_digits`` splits digits one per token before BPE, as Qwen's pre-tokenizer does. With merged
digits (the default, kept so that existing runs and datasets stay valid) a number tokenizes differently
by what precedes it ("is: 131" ends " 1" "31", "<answer>131" ends "13" "1"; and " 79" is another token
than "79"), so repeating a number is not a token copy; one digit per token makes it one.

``protocol_tokens`` adds the DA protocol's tags as single tokens (``PROTOCOL_TOKENS``), as Qwen3 has
``<think>`` and ``<tool_call>``. A mode tag is then one forward instead of three, and a focus tag three
instead of eight (its opening, the chunk ids, ``">``): a trace spends its forwards on what it writes, not
on spelling the markup. Off by default, so that existing runs and datasets stay valid.
"""

from __future__ import annotations

import random
from importlib import resources

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rollouts.protocol.parser import PROTOCOL_TAG_TOKENS

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (not special) tokens: they decode to their text, as Qwen3's do.
ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# The DA protocol's tags as added tokens (``protocol_tokens``), as the parser spells them: a focus tag is its
# opening, the chunk ids (BPE) and ``">``. Not ``">`` itself: an added token matches anywhere, and ``">`` is
# common in HTML and JSON, so adding it would change how text without tags tokenizes.
PROTOCOL_TOKENS = list(PROTOCOL_TAG_TOKENS)

# A ChatML template with tools, tool calls, tool results and Qwen3's `enable_thinking` switch.
CHAT_TEMPLATE = """\
{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools or sys is not none -%}
<|im_start|>system
{% if sys is not none %}{{ sys }}{% endif %}
{%- if tools %}{% if sys is not none %}{{ '\n\n' }}{% endif %}# Tools
You can call these functions:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call one as <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>.
{%- endif %}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}
<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' -%}
<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}<tool_call>
{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' -%}
<|im_start|>tool
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif -%}
{%- endif -%}"""

_PROTOCOL_SNIPPETS = [
    "<global>",
    "</global>",
    "<local>",
    "</local>",
    "</focus>",
    '<focus magic_chunks="',
    '">',
    "<answer>",
    "</answer>",
    "Magic Chunk ",
    "get_magic_chunk",
    '{"name": "get_magic_chunk", "arguments": {"chunk_id": ',
]


def word_list() -> list[str]:
    """The shipped English word list (a few hundred common words)."""
    text = resources.files("data").joinpath("resources/words.txt").read_text()
    return [w for w in text.split() if w]


def _corpus(seed: int, sentences: int) -> list[str]:
    rng = random.Random(seed)
    words = word_list()
    lines = []
    for i in range(sentences):
        n = rng.randint(4, 14)
        sentence = " ".join(rng.choice(words) for _ in range(n)).capitalize() + rng.choice(
            [".", ".", "?", "!", ";"]
        )
        if i % 3 == 0:
            sentence += f" {rng.randint(0, 99999)} = {rng.randint(0, 9999)} - {rng.randint(0, 999)}"
        if i % 5 == 0:
            sentence = rng.choice(_PROTOCOL_SNIPPETS) + str(rng.randint(1, 64)) + " " + sentence
        lines.append(sentence)
    return lines


def build_tokenizer(
    vocab_size: int = 2048,
    seed: int = 0,
    sentences: int = 20_000,
    split_digits: bool = False,
    protocol_tokens: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer and wrap it with the chat template.

    ``vocab_size`` counts the 256 byte symbols, merges and the added tokens; ``protocol_tokens`` adds its
    tags on top, so that the two vocabularies differ by those tokens alone.
    """
    backend = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS) - len(ADDED_TOKENS),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(seed, sentences), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.add_tokens(ADDED_TOKENS + (PROTOCOL_TOKENS if protocol_tokens else []))
    return tokenizer

"""A tokenizer of Qwen3's size (data/qwen3_tokenizer.py) and the DA tags added to it (their rows in a tied
151,936-row embedding: tests/rl/test_added_tokens.py). The ids below are Qwen3's, copied from its
tokenizer_config.json, not computed by the module."""

import copy

import pytest

from data.qwen3_tokenizer import QWEN3_EMBEDDING_ROWS, build_qwen3_sized_tokenizer
from data.tokenizer import build_tokenizer
from rl.added_tokens import add_protocol_tokens
from rollouts.protocol import PROTOCOL_TAG_TOKENS

QWEN3_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
             "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666,
             "<think>": 151667, "</think>": 151668}  # fmt: skip
TEXT = "The special magic number for silver-wolf is: 131.\nMagic Chunk 4 holds it; the answer is 131."


@pytest.fixture(scope="module")
def qwen3_sized():
    return build_qwen3_sized_tokenizer()


def test_the_layout_is_qwen3s(qwen3_sized):
    assert len(qwen3_sized) == 151_669
    assert {t: qwen3_sized.convert_tokens_to_ids(t) for t in QWEN3_IDS} == QWEN3_IDS
    assert qwen3_sized.eos_token == "<|im_end|>" and qwen3_sized.pad_token == "<|endoftext|>"
    assert qwen3_sized.decode([151644, 151645], skip_special_tokens=True) == ""  # special
    assert qwen3_sized.decode([151667], skip_special_tokens=True) == "<think>"  # added, not special
    # the chat template's thinking switch writes <think></think> as Qwen3's ids
    text = qwen3_sized.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    ids = qwen3_sized(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 151644 and 151667 in ids and 151668 in ids


def test_plain_text_tokenizes_as_the_small_bpe_and_round_trips(qwen3_sized):
    small = build_tokenizer(vocab_size=4096)
    assert qwen3_sized(TEXT)["input_ids"] == small(TEXT)["input_ids"]
    for text in (TEXT, "naïve café — 東京 🙂", "\x00\x7f\xff"):
        assert qwen3_sized.decode(qwen3_sized(text)["input_ids"]) == text


def test_the_tags_become_one_token_each_and_keep_their_ids_across_save_and_load(qwen3_sized, tmp_path):
    from transformers import AutoTokenizer

    tagged = copy.deepcopy(qwen3_sized)
    add_protocol_tokens(tagged)
    ids = [tagged.convert_tokens_to_ids(t) for t in PROTOCOL_TAG_TOKENS]
    assert ids == list(range(151_669, 151_669 + len(PROTOCOL_TAG_TOKENS)))  # past Qwen3's added tokens
    assert max(ids) < QWEN3_EMBEDDING_ROWS  # inside the padded embedding: no resize
    for tag, i in zip(PROTOCOL_TAG_TOKENS, ids, strict=True):
        assert tagged(tag, add_special_tokens=False)["input_ids"] == [i]
    assert tagged(TEXT)["input_ids"] == qwen3_sized(TEXT)["input_ids"]  # text without tags: as before
    tagged.save_pretrained(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert [loaded.convert_tokens_to_ids(t) for t in PROTOCOL_TAG_TOKENS] == ids
    trace = '<global>x</global><focus magic_chunks="4"> 131</focus><answer> 131</answer>'
    assert loaded(trace)["input_ids"] == tagged(trace)["input_ids"]
    assert loaded.decode(loaded(trace)["input_ids"]) == trace

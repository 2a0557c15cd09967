"""The local BPE tokenizer's digit handling: merged by default, one digit per token with ``split_digits``."""

import pytest

from data.tokenizer import build_tokenizer

NEEDLE, ANSWER = "The special magic number for silver-wolf is: 131.", "<answer>131</answer>"


@pytest.fixture(scope="module")
def split():
    return build_tokenizer(split_digits=True)


def pieces(tokenizer, text):
    return [tokenizer.decode([i]) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def test_split_digits_makes_a_number_the_same_tokens_wherever_it_stands(split, tokenizer):
    assert pieces(split, NEEDLE)[-4:] == ["1", "3", "1", "."]
    assert pieces(split, ANSWER)[3:6] == ["1", "3", "1"]
    # merged digits: the needle's number and the answer's number are different token sequences
    merged_needle = [p for p in pieces(tokenizer, NEEDLE) if p.strip().isdigit()]
    merged_answer = [p for p in pieces(tokenizer, ANSWER) if p.strip().isdigit()]
    assert "".join(merged_needle).strip() == "".join(merged_answer) == "131"
    assert merged_needle != merged_answer


@pytest.mark.parametrize("text", [NEEDLE, ANSWER, "x = 12345 - 6789", 'chunk_id": 12}'])
def test_split_digits_round_trips_and_keeps_the_vocabulary_size(split, tokenizer, text):
    ids = split(text, add_special_tokens=False)["input_ids"]
    assert split.decode(ids) == text
    assert all(len(p.strip()) <= 1 for p in pieces(split, text) if p.strip().isdigit())
    assert len(split) == len(tokenizer) == 2048

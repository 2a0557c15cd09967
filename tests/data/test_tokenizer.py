"""The local BPE tokenizer's options: one digit per token with ``split_digits``, every DA tag one token with
``protocol_tokens``."""

import pytest

from data.tokenizer import PROTOCOL_TOKENS, build_tokenizer

NEEDLE, ANSWER = "The special magic number for silver-wolf is: 131.", "<answer>131</answer>"
TRACE = '<global>Chunk 5.</global>\n<focus magic_chunks=" 5"> 63</focus>\n<answer> 63</answer>'


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


def test_protocol_tokens_make_each_tag_one_token(tagged_tokenizer, tokenizer):
    # hand-worked: the tags are single tokens, what they wrap is the default BPE's pieces
    assert pieces(tagged_tokenizer, TRACE) == [
        "<global>", "Ch", "unk", " 5", ".", "</global>", "\n",
        '<focus magic_chunks="', " 5", '">', " 63", "</focus>", "\n",
        "<answer>", " 63", "</answer>",
    ]  # fmt: skip
    assert len(pieces(tokenizer, TRACE)) == 31  # without them each tag is 3 tokens, the focus tag 8
    assert tagged_tokenizer.decode(tagged_tokenizer(TRACE, add_special_tokens=False)["input_ids"]) == TRACE
    assert all(
        len(tagged_tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1 for tag in PROTOCOL_TOKENS
    )


@pytest.mark.parametrize("text", [NEEDLE, "Magic Chunk 5: x = 12345 - 6789; silver-owl?", 'chunk_id": 12}'])
def test_protocol_tokens_leave_text_without_tags_as_it_was(tagged_tokenizer, tokenizer, text):
    assert (
        tagged_tokenizer(text, add_special_tokens=False)["input_ids"]
        == tokenizer(text, add_special_tokens=False)["input_ids"]
    )


def test_protocol_tokens_add_the_tags_alone_and_survive_a_save(tagged_tokenizer, tokenizer, tmp_path):
    """A run saves its tokenizer (RUN_DIR/tokenizer, every checkpoint, the export) and eval, serving and
    the rollout workers load it back: the tags must come back as the same single tokens."""
    from transformers import AutoTokenizer

    assert len(tagged_tokenizer) == len(tokenizer) + len(PROTOCOL_TOKENS)
    tagged_tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    ids = tagged_tokenizer(TRACE, add_special_tokens=False)["input_ids"]
    assert loaded(TRACE, add_special_tokens=False)["input_ids"] == ids and len(ids) == 16
    assert loaded.decode(ids) == TRACE


def test_protocol_tokens_are_the_parsers_tags_in_the_recorded_order(tagged_tokenizer, tokenizer):
    """The tokens come from the parser's own tags (rollouts/protocol/parser.py), one of each whole tag it
    reads; their order is the one the recorded runs were built with, which fixes the tokens' ids."""
    from rollouts.protocol import parser

    whole = set(parser._tag_table(False, parser.PROTOCOL_VERSION).exact)  # every whole tag, no <think>
    assert set(PROTOCOL_TOKENS[:-1]) == whole and len(PROTOCOL_TOKENS) == len(whole) + 1
    assert PROTOCOL_TOKENS[-1].startswith(parser._FOCUS_HEAD)
    assert PROTOCOL_TOKENS == [
        "<global>", "<local>", "<index>", "<answer>", "</global>", "</local>", "</index>", "</answer>", "</focus>",
        '<focus magic_chunks="',
    ]  # fmt: skip
    ids = tagged_tokenizer.convert_tokens_to_ids(PROTOCOL_TOKENS)
    assert ids == list(range(len(tokenizer), len(tokenizer) + len(PROTOCOL_TOKENS)))

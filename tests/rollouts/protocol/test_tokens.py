"""Token ids -> text for the streaming parser: exact bytes for byte-level and Metaspace vocabularies."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rollouts.protocol import ProtocolParser, TokenTextStream, token_bytes_table

SAMPLES = st.lists(
    st.sampled_from(
        [
            '<focus magic_chunks="2">',
            '<focus magic_chunks="',
            '">',
            "</focus>",
            "<local>",
            "</global>",
            "<answer>",
            "é",
            "日本",
            "🙂",
            " word",
            "\n",
            "<",
            "x",
            "<think>",
        ]
    ),
    max_size=20,
).map("".join)


@pytest.fixture(scope="module", params=[False, True], ids=["bpe", "protocol_tokens"])
def vocabulary(request, tokenizer, token_table, tagged_tokenizer, tagged_token_table):
    """The local BPE, as is and with every DA tag one token (a mode tag then arrives whole in one token)."""
    return (tagged_tokenizer, tagged_token_table) if request.param else (tokenizer, token_table)


def stream(table, ids):
    text = TokenTextStream(table)
    return "".join(text(i) for i in ids) + text.flush()


@settings(max_examples=100, deadline=None)
@given(text=SAMPLES)
def test_byte_level_stream_reproduces_text(vocabulary, text):
    tokenizer, token_table = vocabulary
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert stream(token_table, ids) == text


def test_special_tokens_are_silent_and_added_tokens_speak(tokenizer, token_table):
    ids = tokenizer("<think>a</think><|im_end|>", add_special_tokens=False)["input_ids"]
    assert stream(token_table, ids) == "<think>a</think>"
    assert stream(token_table, [10**9]) == ""  # out-of-vocabulary ids decode to nothing, never raise


@settings(max_examples=100, deadline=None)
@given(text=SAMPLES)
def test_token_states_equal_text_states(vocabulary, text):
    """The state after each token equals the state of a text parse of everything decoded so far."""
    tokenizer, token_table = vocabulary
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    text_stream, parser = TokenTextStream(token_table), ProtocolParser(3)
    for j, token in enumerate(ids):
        state = parser.feed(text_stream(token))
        prefix = tokenizer.decode(ids[: j + 1])
        reference = ProtocolParser(3)
        reference.feed(prefix.rstrip("\ufffd"))  # a split multi-byte character is held back
        assert state == reference.state


def test_metaspace_vocabulary():
    """A sentencepiece-style vocabulary (▁ for spaces, <0xNN> byte fallback) decodes exactly too."""
    chars = sorted(set('the focus is local and global <answer>8 years</answer>="_mk1') - {" "}) + ["\u2581"]
    vocab = {"<s>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    vocab.update({c: len(vocab) + i for i, c in enumerate(chars)})
    for piece in ("\u2581t", "\u2581th", "\u2581the"):  # a few merges, so multi-character pieces occur too
        vocab[piece] = len(vocab)
    backend = Tokenizer(
        models.BPE(
            vocab=vocab, merges=[("\u2581", "t"), ("\u2581t", "h"), ("\u2581th", "e")], byte_fallback=True
        )
    )
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>")
    table = token_bytes_table(tok)
    for text in ['the <focus magic_chunks="1">local é</focus>', "日本 <answer>8 years</answer>"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert stream(table, ids) == text

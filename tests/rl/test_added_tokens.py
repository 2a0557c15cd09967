"""The DA tags added to a pretrained tokenizer and model (rl/added_tokens.py): every tag one token that
decodes to its text, the embedding grown (tied or not, padded or not), each new row the mean of the rows
of the tag's old spelling, computed here from a copy of the weights taken before."""

import copy

import pytest
import torch

from data.tokenizer import build_tokenizer
from rl.added_tokens import add_protocol_tokens, grow_embeddings, protocol_spellings
from rl.config import load_run_config
from rollouts.protocol import PROTOCOL_TAG_TOKENS, token_bytes_table
from tests.rollouts.conftest import save_tiny_qwen3

SHAPE = {"hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128, "head_dim": 32,
         "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip


@pytest.fixture(scope="module")
def plain_tokenizer():
    """The local BPE without the tags as tokens: a pretrained tokenizer that spells them in pieces."""
    return build_tokenizer(protocol_tokens=False)


def model_for(tokenizer, tmp_path, **shape):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(save_tiny_qwen3(tmp_path / "m", tokenizer, **SHAPE, **shape))


def test_each_tag_becomes_one_token_that_decodes_to_its_text(plain_tokenizer):
    before, after = plain_tokenizer, copy.deepcopy(plain_tokenizer)
    assert all(len(before(tag, add_special_tokens=False)["input_ids"]) > 1 for tag in PROTOCOL_TAG_TOKENS)
    add_protocol_tokens(after)
    assert len(after) == len(before) + len(PROTOCOL_TAG_TOKENS)
    text = 'x <global>a</global><focus magic_chunks="2">b</focus><answer>8</answer>'
    ids = after(text, add_special_tokens=False)["input_ids"]
    assert after.decode(ids) == text
    table = token_bytes_table(after)  # what the engines and the parser read the tokens as
    assert b"".join(table[i] for i in ids).decode() == text
    for tag in PROTOCOL_TAG_TOKENS:
        assert after(tag, add_special_tokens=False)["input_ids"] == [after.convert_tokens_to_ids(tag)]
    spellings = protocol_spellings(before, after)
    assert sorted(spellings) == list(range(len(before), len(after)))
    assert (
        spellings[after.convert_tokens_to_ids("<global>")]
        == before("<global>", add_special_tokens=False)["input_ids"]
    )
    again = copy.deepcopy(after)
    add_protocol_tokens(again)  # tags already tokens stay as they are
    assert len(again) == len(after) and protocol_spellings(after, again) == {}


@pytest.mark.parametrize("tied", [True, False])
def test_new_rows_are_the_mean_of_the_old_spelling(plain_tokenizer, tmp_path, tied):
    model = model_for(plain_tokenizer, tmp_path, tie_word_embeddings=tied)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    after = copy.deepcopy(plain_tokenizer)
    add_protocol_tokens(after)
    spellings = protocol_spellings(plain_tokenizer, after)
    grow_embeddings(model, spellings)

    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert embedding.shape[0] == len(after) == model.config.vocab_size
    assert (head.data_ptr() == embedding.data_ptr()) is tied  # tied stays tied, untied stays untied
    torch.testing.assert_close(embedding[: len(plain_tokenizer)], old_in, rtol=0, atol=0)  # old rows kept
    torch.testing.assert_close(head[: len(plain_tokenizer)], old_out, rtol=0, atol=0)
    for new, old in spellings.items():
        torch.testing.assert_close(embedding[new], sum(old_in[i] for i in old) / len(old))
        torch.testing.assert_close(head[new], sum(old_out[i] for i in old) / len(old))
    # the grown model runs on the new tokens
    ids = after('<focus magic_chunks="3">', add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert torch.isfinite(model(ids).logits).all()


@pytest.mark.parametrize("vocabulary", ["local", "qwen3"])
def test_a_padded_embedding_keeps_its_size_and_fills_the_new_ids_in_place(
    plain_tokenizer, tmp_path, vocabulary
):
    """The local BPE with 64 spare rows, and Qwen3's layout: 151,669 tokens in 151,936 tied rows."""
    from data.qwen3_tokenizer import QWEN3_EMBEDDING_ROWS, build_qwen3_sized_tokenizer

    before = plain_tokenizer if vocabulary == "local" else build_qwen3_sized_tokenizer()
    padded = len(before) + 64 if vocabulary == "local" else QWEN3_EMBEDDING_ROWS
    model = model_for(before, tmp_path, vocab_size=padded)
    old = model.get_input_embeddings().weight.detach().clone()
    after = copy.deepcopy(before)
    add_protocol_tokens(after)
    spellings = protocol_spellings(before, after)
    assert sorted(spellings) == list(
        range(len(before), len(after))
    )  # past every earlier token, inside the rows
    grow_embeddings(model, spellings)
    weight = model.get_input_embeddings().weight
    assert weight.shape[0] == padded == model.config.vocab_size
    assert model.get_output_embeddings().weight is weight  # still tied
    for new, pieces in spellings.items():
        torch.testing.assert_close(weight[new], old[pieces].mean(0))
    untouched = torch.ones(padded, dtype=torch.bool)
    untouched[list(spellings)] = False
    torch.testing.assert_close(weight[untouched], old[untouched], rtol=0, atol=0)


def test_a_run_from_a_pretrained_folder_adds_the_tags_and_grows_the_model(plain_tokenizer, tmp_path):
    """What `heed train` does with model.path and tokenizer.protocol_tokens: the run's tokenizer gains the
    tags, its starting model (init/) has a row for each, and both are saved for the pool and the export."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.run_inputs import run_model, run_tokenizer

    source = save_tiny_qwen3(tmp_path / "pretrained", plain_tokenizer, **SHAPE)
    overrides = [f"model.path={source}", f"tokenizer.path={source}", f"data.build.tokenizer={source}"]
    config = load_run_config(None, [*overrides, "tokenizer.protocol_tokens=true"])
    run_dir = tmp_path / "run"
    tokenizer = run_tokenizer(config, run_dir)
    assert len(tokenizer) == len(plain_tokenizer) + len(PROTOCOL_TAG_TOKENS)
    model, folder = run_model(config, run_dir, tokenizer, budgets=None)
    assert folder == run_dir / "init"
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    saved = AutoModelForCausalLM.from_pretrained(folder)
    assert saved.config.vocab_size == len(AutoTokenizer.from_pretrained(folder)) == len(tokenizer)
    original = AutoModelForCausalLM.from_pretrained(source).get_input_embeddings().weight
    new = tokenizer.convert_tokens_to_ids("</answer>")
    pieces = plain_tokenizer("</answer>", add_special_tokens=False)["input_ids"]
    torch.testing.assert_close(saved.get_input_embeddings().weight[new], original[pieces].mean(0))

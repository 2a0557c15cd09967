"""SFT with the selection frozen: head 0's query and key rows keep their values, every other weight trains."""

import pytest
import torch

from rl.model import build_tiny_model
from rl.selective.frozen_selection import frozen_selection, selection_rows
from rl.sft import SFTConfig, encode_sft_row, train_sft
from tests.conftest import small_model_config
from tests.rl.test_sft import acme_rows


def _selective_model(tokenizer):
    from rollouts.selective.attention import SELECTIVE

    model = build_tiny_model(tokenizer, small_model_config())
    model.config.selective_attention = True
    model.set_attn_implementation(SELECTIVE)
    return model


@pytest.mark.parametrize("freeze", [True, False])
def test_sft_with_a_frozen_selection_keeps_head0s_query_and_key_rows(
    tokenizer, selective_attention, tmp_path, freeze
):
    """Four SFT steps with L_mem (whose whole gradient goes through the selection rows) and the selection
    at full weight: frozen, head 0's query rows and its group's key rows are bitwise the initial ones in
    every layer while the rest of both projections moved; not frozen, they move too (the check can fail)."""
    model = _selective_model(tokenizer)
    config = model.config
    head = config.head_dim
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sft = SFTConfig(
        output_dir=str(tmp_path), max_steps=4, per_device_batch_size=2, warmup_steps=0, memory_eps=0.5,
        freeze_selection=freeze,
    )  # fmt: skip
    train_sft(model, tokenizer, acme_rows(8), sft)
    layers = range(config.num_hidden_layers)
    for layer in layers:
        for proj in ("q_proj", "k_proj"):
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            now, was = dict(model.named_parameters())[name].detach(), before[name]
            if len(now) > head:  # the other heads' rows train (k_proj: when there are other groups)
                assert not torch.equal(now[head:], was[head:])
            assert torch.equal(now[:head], was[:head]) == freeze
        v = f"model.layers.{layer}.self_attn.v_proj.weight"
        assert not torch.equal(dict(model.named_parameters())[v].detach(), before[v])


def test_the_hooks_go_when_the_context_closes(tokenizer, selective_attention):
    model = _selective_model(tokenizer)
    ids = torch.tensor([encode_sft_row(acme_rows(1)[0], tokenizer)["prompt_ids"][:24]])
    with frozen_selection(model):
        pass
    model(ids, labels=ids).loss.backward()
    q = model.model.layers[0].self_attn.q_proj.weight.grad
    assert q[: model.config.head_dim].abs().sum() > 0


def test_a_model_without_q_and_k_projections_is_refused():
    with pytest.raises(ValueError, match="q_proj, k_proj and head_dim"):
        selection_rows(torch.nn.Linear(4, 4))


def test_weight_decay_is_refused_with_a_frozen_selection():
    with pytest.raises(ValueError, match="weight_decay"):
        SFTConfig(freeze_selection=True, weight_decay=0.01)

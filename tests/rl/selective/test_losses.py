"""Training side of Selective Attention: L_mem from a forward, the loss under budgets."""

import contextlib

import pytest
import torch
from transformers import AttentionInterface

from rl.selective.losses import forward_with_memory_loss, loss_under_budgets
from rollouts.selective.attention import SELECTIVE

from ...rollouts.selective.test_attention import VOCAB, standard_twin, tiny_model
from ...rollouts.selective.test_mask import reference_mask

pytestmark = pytest.mark.usefixtures("selective_attention")


@contextlib.contextmanager
def recorded_head0():
    """Record each layer's head-0 logits q_0 k_0^T * scaling as the model computes them."""
    original = AttentionInterface._global_mapping[SELECTIVE]
    logits = {}

    def recording(module, query, key, value, attention_mask, scaling=None, **kwargs):
        logits[module.layer_idx] = (query[:, 0] @ key[:, 0].transpose(-1, -2) * scaling).detach()
        return original(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    AttentionInterface.register(SELECTIVE, recording)
    try:
        yield logits
    finally:
        AttentionInterface.register(SELECTIVE, original)


def reference_l_mem(head0_logits, real, eps, tau):
    """eps * sum_l max_i M_i / (L * n_real) by loops for one unpadded-or-padded row (``real``: bools)."""
    keys = [k for k, r in enumerate(real) if r]
    peaks = []
    for logits in head0_logits:  # per layer, [n, n] lists
        vis = [[real[i] and real[k] for k in range(len(real))] for i in range(len(real))]
        f = reference_mask(logits, vis)
        peaks.append(max(sum(1 - min(f[i][k], tau) / tau for k in keys if k <= i) for i in keys))
    return eps * sum(peaks) / (len(peaks) * len(keys))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_memory_loss_matches_loop_reference(arch):
    model = tiny_model(arch)
    ids = torch.randint(1, VOCAB, (2, 8))
    attention_mask = torch.ones(2, 8, dtype=torch.long)
    attention_mask[1, :3] = 0  # row 1 left-padded
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad(), recorded_head0() as head0:
        _, l_mem = forward_with_memory_loss(
            model, ids, attention_mask, position_ids=position_ids, eps=0.1, tau=0.5
        )
    expected = [
        reference_l_mem(
            [head0[layer][b].tolist() for layer in (0, 1)], attention_mask[b].bool().tolist(), 0.1, 0.5
        )
        for b in range(2)
    ]
    assert l_mem.item() == pytest.approx(sum(expected) / 2, rel=1e-5)
    assert 0 < l_mem.item() < 0.1  # some masking happened; at most eps


def test_memory_loss_with_a_4d_mask_takes_the_padding_mask():
    # A Declarative-Attention-style 4D mask (padding rows see only themselves) with the 2D padding mask
    # beside it gives the same L_mem as transformers' own padding mask.
    model = tiny_model("qwen3")
    ids = torch.randint(1, VOCAB, (2, 8))
    real = torch.ones(2, 8, dtype=torch.bool)
    real[0, :2] = False
    real[1, 6:] = False
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    mask_4d = (causal & real[:, None, :] & real[:, :, None]) | torch.eye(8, dtype=torch.bool)
    position_ids = (real.long().cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        _, from_2d = forward_with_memory_loss(model, ids, real.long(), position_ids=position_ids)
        _, from_4d = forward_with_memory_loss(
            model, ids, mask_4d[:, None], padding_mask=real, position_ids=position_ids
        )
    assert from_4d.item() == pytest.approx(from_2d.item(), rel=1e-6)


def test_memory_loss_without_masking_is_eps():
    # Head 0's query at zero makes F = 0: then M_i is the number of keys seen, its max the number of real
    # tokens n, and L_mem = eps * sum_l n / (L * n) = eps exactly, padded or not.
    model = tiny_model("qwen3")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight[: model.config.head_dim] = 0
    ids = torch.randint(1, VOCAB, (2, 7))
    attention_mask = torch.tensor([[1] * 7, [0, 0] + [1] * 5])
    _, l_mem = forward_with_memory_loss(model, ids, attention_mask, eps=0.25)
    assert l_mem.item() == pytest.approx(0.25)


def test_memory_loss_trains_head_zero():
    # L_mem reaches the parameters through head 0's logits only: in the last layer, the query rows of
    # heads 1..3 get no gradient from it, head 0's do.
    model = tiny_model("qwen3")
    model.train()
    outputs, l_mem = forward_with_memory_loss(model, torch.randint(1, VOCAB, (2, 9)), labels=None)
    l_mem.backward()
    grad = model.model.layers[-1].self_attn.q_proj.weight.grad
    head_dim = model.config.head_dim
    assert grad[:head_dim].abs().sum() > 0
    assert grad[head_dim:].abs().sum() == 0
    assert outputs.logits.shape == (2, 9, VOCAB)


def test_memory_loss_needs_a_selective_model():
    with pytest.raises(ValueError, match="not a Selective Attention model"):
        forward_with_memory_loss(standard_twin(tiny_model("qwen3")), torch.ones(1, 4, dtype=torch.long))


def test_loss_under_budgets():
    model = tiny_model("qwen3")
    ids = torch.randint(1, VOCAB, (3, 10))
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]
    plain = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).item()
    assert loss_under_budgets(model, [ids], None) == pytest.approx(plain, rel=1e-5)
    assert loss_under_budgets(model, [ids[:2], ids[2:]], [10, 10]) == pytest.approx(plain, rel=1e-5)
    assert loss_under_budgets(model, [ids], [2, 3]) != pytest.approx(plain, rel=1e-3)
    with pytest.raises(ValueError, match="3 KV budgets for a model with 2 layers"):
        loss_under_budgets(model, [ids], [4, 4, 4])
    with pytest.raises(ValueError, match="integers >= 2"):
        loss_under_budgets(model, [ids], [4, -1])


def test_loss_under_budgets_ignores_padding():
    model = tiny_model("qwen3")
    ids = torch.randint(1, VOCAB, (1, 8))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    real = torch.tensor([[0, 0, 0] + [1] * 8])
    alone = loss_under_budgets(model, [ids], [3, 4])
    assert loss_under_budgets(model, [(padded, real)], [3, 4]) == pytest.approx(alone, rel=1e-5)

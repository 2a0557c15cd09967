"""The fused Triton Selective Attention forward (rollouts/selective_kernel.py) in Triton's interpreter on CPU:
against the loop reference, its running sums, and inside tiny models (HEED_SELECTIVE_KERNEL=triton) against
the dense path -- forward, backward, padding, decoding after a fused prefill.

Triton's interpreter must be on before Triton is first imported (its own reductions are jit functions), so
these cases run in a process of their own: test_selective_kernel.py starts it with TRITON_INTERPRET=1.
"""

import importlib
import os

import pytest
import torch
from transformers import DynamicCache

import rollouts.selective_attention as sa

from .test_selective import reference_mask
from .test_selective_attention import VOCAB, reference_attention, tiny_model


@pytest.fixture
def kernel():
    """The kernel module, its kernels built for Triton's interpreter (CPU tensors)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run these cases through test_selective_kernel.py"
    return importlib.import_module("rollouts.selective_kernel")


@pytest.fixture
def use_kernel(kernel, monkeypatch):
    monkeypatch.setattr(sa, "KERNEL", "triton")
    return kernel


def _inputs(b, h, kv_heads, n, d, mask, seed=0):
    torch.manual_seed(seed)
    query, key, value = (torch.randn(b, hh, n, d) for hh in (h, kv_heads, kv_heads))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if mask == "causal":
        return query, key, value, None, causal.expand(b, n, n)
    # a Declarative-Attention-like mask: earlier keys hidden at random, every token sees itself; the last
    # row is left-padded by 3 (its padding tokens see only themselves, its real tokens skip them)
    visible = causal & (torch.rand(b, n, n) > 0.35) | torch.eye(n, dtype=torch.bool)
    visible[-1, :, :3] = False
    visible[-1, :3, :3] = torch.eye(3, dtype=torch.bool)
    return query, key, value, visible, visible


@pytest.mark.parametrize(
    ("b", "h", "kv_heads", "n", "d", "block", "mask"),
    [
        (2, 4, 2, 40, 32, 16, "causal"),  # three query blocks, the last one partial; GQA
        (2, 4, 2, 40, 24, 16, "da"),  # head_dim not a power of two
        (1, 2, 1, 70, 16, 32, "da"),
        (2, 2, 2, 9, 16, 64, "causal"),  # one block larger than the sequence
    ],
)
def test_kernel_matches_the_loop_reference(kernel, b, h, kv_heads, n, d, block, mask):
    query, key, value, visible, reference_visible = _inputs(b, h, kv_heads, n, d, mask)
    out, _ = kernel.fused_selective_attention(query, key, value, visible, d**-0.5, block_size=block)
    expected = reference_attention(query, key, value, reference_visible, d**-0.5)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("mask", ["causal", "da"])
def test_total_is_the_next_querys_mask_row(kernel, mask):
    # total[k] = sum over every query of S[., k]: F's row for a query that would come after the last one.
    b, n, d = 2, 37, 16
    query, key, value, visible, reference_visible = _inputs(b, 2, 1, n, d, mask, seed=1)
    _, total = kernel.fused_selective_attention(query, key, value, visible, d**-0.5, block_size=16)
    for row in range(b):
        logits = (query[row, 0] @ key[row, 0].T * d**-0.5).tolist()
        extended = [line + [0.0] for line in logits] + [[0.0] * (n + 1)]  # one more query, one more key
        vis = [line + [False] for line in reference_visible[row].tolist()] + [[True] * (n + 1)]
        expected = torch.tensor(reference_mask(extended, vis)[n][:n])
        torch.testing.assert_close(total[row], expected, atol=1e-4, rtol=1e-5)


def test_model_forward_and_backward_match_the_dense_path(use_kernel, monkeypatch):
    model = tiny_model("qwen3")
    ids = torch.randint(1, VOCAB, (2, 21))
    attention_mask = torch.ones(2, 21, dtype=torch.long)
    attention_mask[1, :4] = 0  # row 1 left-padded
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    real = attention_mask.bool()

    def run():
        model.zero_grad()
        logits = model(ids, attention_mask=attention_mask, position_ids=position_ids).logits
        logits[real].logsumexp(-1).sum().backward()  # a loss over real tokens only
        return logits.detach()[real], [p.grad.clone() for p in model.parameters()]

    fused_logits, fused_grads = run()
    monkeypatch.setattr(sa, "KERNEL", "dense")
    dense_logits, dense_grads = run()
    torch.testing.assert_close(fused_logits, dense_logits, atol=1e-5, rtol=1e-5)
    for fused, dense in zip(fused_grads, dense_grads):
        torch.testing.assert_close(fused, dense, atol=1e-4, rtol=1e-4)
    assert max(g.abs().max() for g in dense_grads) > 1e-3  # the comparison compares something


def test_decoding_continues_from_a_fused_prefill(use_kernel):
    # The prefill runs fused and hands its running sums to the decoding steps, which run densely.
    model = tiny_model("llama")
    ids = torch.randint(1, VOCAB, (2, 14))
    state, cache = sa.AttentionState(), DynamicCache(config=model.config)
    with torch.no_grad():
        full = model(ids).logits
        pieces = [model(ids[:, :10], past_key_values=cache, use_cache=True, heed_state=state).logits]
        for t in range(10, 14):
            pieces.append(
                model(ids[:, t : t + 1], past_key_values=cache, use_cache=True, heed_state=state).logits
            )
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=1e-5)
    assert state.kv_reads[0].tolist() == [[14], [14]]  # the last step read every key


def test_forwards_that_need_f_stay_dense(use_kernel, monkeypatch):
    # L_mem's peak memory needs F itself: with tau set the forward takes the dense path and records it.
    calls = []
    monkeypatch.setattr(
        sa.FusedSelectiveAttention, "apply", lambda *args: calls.append(args) or pytest.fail("fused")
    )
    model = tiny_model("qwen3")
    state = sa.AttentionState(tau=1.0)
    with torch.no_grad():
        model(torch.randint(1, VOCAB, (1, 8)), heed_state=state)
    assert sorted(state.peak_memory) == [0, 1] and not calls

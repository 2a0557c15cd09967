"""The fused Triton Selective Attention forward (rollouts/selective/kernel.py) in Triton's interpreter on CPU:
against the loop reference, its running sums, and inside tiny models (kernel="triton") against
the dense path -- forward, backward, padding, decoding after a fused prefill.

Triton's interpreter must be on before Triton is first imported (its own reductions are jit functions), so
these cases run in a process of their own: test_kernel.py starts it with TRITON_INTERPRET=1.
"""

import importlib
import os

import pytest
import torch
from transformers import DynamicCache

import rollouts.selective.attention as sa

from .test_attention import VOCAB, reference_attention, tiny_model
from .test_mask import reference_mask

pytestmark = pytest.mark.usefixtures("selective_attention")


@pytest.fixture
def kernel():
    """The kernel module, its kernels built for Triton's interpreter (CPU tensors)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run these cases through test_kernel.py"
    return importlib.import_module("rollouts.selective.kernel")


@pytest.fixture
def use_kernel(kernel):
    sa.register_selective_attention(kernel="triton")  # the selective_attention fixture switches it back
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
    out, _, _, _ = kernel.selective_forward(query, key, value, visible, d**-0.5, block_size=block)
    expected = reference_attention(query, key, value, reference_visible, d**-0.5)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


class _Layer(torch.nn.Module):
    layer_idx = 0


@pytest.mark.parametrize(
    ("b", "h", "kv_heads", "n", "d", "block", "mask", "tau"),
    [
        (2, 4, 2, 40, 32, 16, "causal", None),
        (2, 4, 2, 40, 24, 16, "da", 1.0),
        (1, 2, 1, 70, 16, 32, "da", 0.5),
        (2, 2, 2, 9, 16, 64, "causal", 1.0),
        (1, 2, 1, 40, 128, None, "da", 1.0),  # head_dim 128 on the default tiles (tile_rows: 32, then 16)
    ],
)
def test_backward_matches_autograd_through_the_dense_path(kernel, b, h, kv_heads, n, d, block, mask, tau):
    # The dense path (tested against the loop reference) differentiated by autograd, L_mem's memory included.
    query, key, value, visible, _ = _inputs(b, h, kv_heads, n, d, mask, seed=3)
    query = query * 2  # larger logits: more of S is positive, F crosses tau
    inputs = [t.requires_grad_() for t in (query, key, value)]
    state = sa.AttentionState(tau=tau)
    hf_mask = None if visible is None else visible[:, None]
    out, _ = sa.selective_attention_forward(_Layer(), *inputs, hf_mask, d**-0.5, heed_state=state)
    grad_out, grad_memory = torch.randn_like(out), torch.randn(b, n)
    outputs, grads_in = [out], [grad_out]
    if tau is not None:
        # the dense path records only the peak; differentiate every row's M through the same F
        from rollouts.selective.mask import MaskAccumulator, effective_memory

        full = torch.ones(n, n, dtype=torch.bool).tril()[None] & (True if visible is None else visible)
        f = MaskAccumulator().step(query[:, 0] @ key[:, 0].transpose(-1, -2) * d**-0.5, full)
        outputs.append(effective_memory(f, full, tau))
        grads_in.append(grad_memory)
    expected = torch.autograd.grad(outputs, inputs, grads_in)
    with torch.no_grad():
        out, _, _, lse = kernel.selective_forward(*inputs, visible, d**-0.5, tau, block_size=block)
        got = kernel.selective_backward(
            *inputs, visible, out, lse, grad_out, grad_memory if tau else None, d**-0.5, tau, block_size=block
        )
    for name, g, e in zip("qkv", got, expected):
        torch.testing.assert_close(g, e, atol=2e-5, rtol=1e-4, msg=f"d{name}")


@pytest.mark.parametrize("mask", ["causal", "da"])
def test_total_is_the_next_querys_mask_row(kernel, mask):
    # total[k] = sum over every query of S[., k]: F's row for a query that would come after the last one.
    b, n, d = 2, 37, 16
    query, key, value, visible, reference_visible = _inputs(b, 2, 1, n, d, mask, seed=1)
    _, total, _, _ = kernel.selective_forward(query, key, value, visible, d**-0.5, block_size=16)
    for row in range(b):
        logits = (query[row, 0] @ key[row, 0].T * d**-0.5).tolist()
        extended = [line + [0.0] for line in logits] + [[0.0] * (n + 1)]  # one more query, one more key
        vis = [line + [False] for line in reference_visible[row].tolist()] + [[True] * (n + 1)]
        expected = torch.tensor(reference_mask(extended, vis)[n][:n])
        torch.testing.assert_close(total[row], expected, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(("mask", "tau"), [("causal", 1.0), ("da", 0.5)])
def test_memory_is_the_papers_effective_memory(kernel, mask, tau):
    # M_i = sum over the keys query i sees of (1 - min(F_ik, tau) / tau)   (paper eq. 2, i counted from 1)
    b, n, d = 2, 37, 16
    query, key, value, visible, reference_visible = _inputs(b, 2, 1, n, d, mask, seed=2)
    query = query * 3  # larger logits: F crosses tau
    _, _, memory, _ = kernel.selective_forward(query, key, value, visible, d**-0.5, tau, block_size=16)
    for row in range(b):
        vis = reference_visible[row].tolist()
        f = reference_mask((query[row, 0] @ key[row, 0].T * d**-0.5).tolist(), vis)
        expected = [sum(1 - min(f[i][k], tau) / tau for k in range(i + 1) if vis[i][k]) for i in range(n)]
        torch.testing.assert_close(memory[row], torch.tensor(expected), atol=1e-4, rtol=1e-5)
    assert (memory < reference_visible.sum(-1) - 0.5).any()  # some keys are masked


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
    sa.register_selective_attention(kernel="dense")
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


def test_memory_loss_and_its_gradients_match_the_dense_path(use_kernel, monkeypatch):
    # SFT's objective on a Selective Attention model: LM loss + L_mem, left padding, fused vs dense.
    from rl.selective.losses import forward_with_memory_loss

    model = tiny_model("qwen3", initializer_range=1.0)  # large logits: F crosses tau, L_mem has gradients
    ids = torch.randint(1, VOCAB, (2, 19))
    attention_mask = torch.ones(2, 19, dtype=torch.long)
    attention_mask[0, :5] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    labels = ids.clone()
    labels[0, :6] = -100  # no loss on padding, nor on the first real token (predicted from a padding row,
    # whose output is unspecified: the fused kernel returns 0 for a query that sees no key)

    def grads():
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]

    def run():
        model.zero_grad()
        outputs, l_mem = forward_with_memory_loss(
            model, ids, attention_mask, position_ids=position_ids, labels=labels
        )
        l_mem.backward()
        memory_grads = grads()  # L_mem's own (no gradient reaches V, the MLPs, the head)
        model.zero_grad()
        outputs, l_mem = forward_with_memory_loss(
            model, ids, attention_mask, position_ids=position_ids, labels=labels
        )
        (outputs.loss + l_mem).backward()
        return l_mem.detach(), memory_grads, grads()

    fused = run()
    sa.register_selective_attention(kernel="dense")
    dense = run()
    torch.testing.assert_close(fused[0], dense[0], atol=1e-6, rtol=1e-5)
    assert dense[0] > 0
    for fused_grads, dense_grads in zip(fused[1:], dense[1:]):
        for f, d in zip(fused_grads, dense_grads):
            torch.testing.assert_close(f, d, atol=1e-4, rtol=1e-4)
    assert max(g.abs().max() for g in dense[1]) > 1e-5  # L_mem alone moves the weights


def test_forwards_that_need_f_stay_dense(use_kernel, monkeypatch):
    # Replayed budgets need F itself (which keys each query still sees): the forward takes the dense path.
    monkeypatch.setattr(sa.FusedSelectiveAttention, "apply", lambda *args: pytest.fail("fused"))
    model = tiny_model("qwen3")
    state = sa.AttentionState(budgets=(4, 4))
    with torch.no_grad():
        model(torch.randint(1, VOCAB, (1, 8)), heed_state=state)
    assert [held.sum().item() for held in state.held.values()] == [4, 4]

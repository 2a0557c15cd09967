"""The Selective Attention model change: the attention function against a loop reference, and tiny
Qwen3 / Llama models (GQA) through the HF registry: F = 0 equals standard attention, KV-cache decoding
equals the full forward, padding, masks, save / from_pretrained, bad configs."""

import copy
import json
import math

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rollouts.selective.attention import (
    SELECTIVE,
    AttentionState,
    bind_state,
    enable_selective_attention,
    selective_attention_forward,
)

from .test_mask import reference_mask

pytestmark = pytest.mark.usefixtures("selective_attention")

ARCHS = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
VOCAB = 64


def tiny_config(arch, selective=True, **overrides):
    config_cls, _ = ARCHS[arch]
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA: query heads 0, 1 read KV head 0
        head_dim=16,
        initializer_range=0.3,  # logits large enough that F matters
        pad_token_id=0,
    )
    kwargs.update(overrides)
    config = config_cls(**kwargs)
    return enable_selective_attention(config) if selective else config


def tiny_model(arch, seed=0, **overrides):
    torch.manual_seed(seed)
    return ARCHS[arch][1](tiny_config(arch, **overrides)).eval()


def standard_twin(model, implementation="sdpa"):
    """The same weights and config under a standard attention implementation."""
    config = copy.deepcopy(model.config)
    config.selective_attention = False
    config._attn_implementation = implementation
    twin = type(model)(config).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def reference_attention(query, key, value, visible, scaling):
    """softmax(q k^T * scaling - F) v over visible keys, with loops; F from head 0 (reference_mask)."""
    b, h, n, d = query.shape
    groups = h // key.shape[1]
    out = torch.zeros(b, n, h, d)
    for bi in range(b):
        vis = visible[bi].tolist()
        head0 = [[float(query[bi, 0, i] @ key[bi, 0, j]) * scaling for j in range(n)] for i in range(n)]
        f = reference_mask(head0, vis)
        for hi in range(h):
            for i in range(n):
                keys = [j for j in range(i + 1) if vis[i][j]]
                logits = [
                    float(query[bi, hi, i] @ key[bi, hi // groups, j]) * scaling - f[i][j] for j in keys
                ]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                for w, j in zip(weights, keys):
                    out[bi, i, hi] += w / total * value[bi, hi // groups, j]
    return out


class _Layer(torch.nn.Module):
    layer_idx = 0


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_attention_function_matches_loop_reference(mask_kind):
    torch.manual_seed(0)
    b, h, kv_heads, n, d = 2, 4, 2, 7, 8
    query, key, value = (
        torch.randn(b, h, n, d),
        torch.randn(b, kv_heads, n, d),
        torch.randn(b, kv_heads, n, d),
    )
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if mask_kind == "none":
        visible, mask = causal.expand(b, n, n), None
    else:  # a DA-like mask: some earlier keys hidden, each token always sees itself; row 1 left-padded
        visible = causal & (torch.rand(b, n, n) > 0.35) | torch.eye(n, dtype=torch.bool)
        visible[1, :, :2] = False
        visible[1, :2, :2] = torch.eye(2, dtype=torch.bool)
        mask = visible[:, None]
        if mask_kind == "float":
            mask = torch.zeros(b, 1, n, n).masked_fill(~mask, torch.finfo(torch.float32).min)
    out, _ = selective_attention_forward(_Layer(), query, key, value, mask, scaling=d**-0.5)
    expected = reference_attention(query, key, value, visible, d**-0.5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_zero_mask_equals_standard_attention(arch):
    # Head 0's query projection set to zero makes its logits 0, so S = relu(0) = 0 and F = 0 everywhere:
    # the Selective Attention model must then equal the same weights under SDPA and eager attention.
    model = tiny_model(arch)
    head_dim = model.config.head_dim
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight[:head_dim] = 0
    ids = torch.randint(1, VOCAB, (2, 10))
    with torch.no_grad():
        selective = model(ids).logits
        for implementation in ("sdpa", "eager"):
            standard = standard_twin(model, implementation)(ids).logits
            torch.testing.assert_close(selective, standard, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_selective_attention_changes_the_model(arch):
    model = tiny_model(arch)
    ids = torch.randint(1, VOCAB, (2, 10))
    with torch.no_grad():
        diff = (model(ids).logits - standard_twin(model)(ids).logits).abs().max()
    assert diff > 1e-3


def test_a_selection_weight_scales_the_mask_and_zero_is_standard_attention():
    """``AttentionState.selection_weight``: 0 gives the same weights' standard attention (SDPA), and the first
    layer's running mask (its inputs do not depend on the weight) scales with it: relu(w x) = w relu(x)."""
    model = tiny_model("qwen3")
    ids = torch.randint(1, VOCAB, (2, 10))
    totals = {}
    with torch.no_grad():
        for weight in (0.0, 0.5, 1.0):
            state = AttentionState(selection_weight=weight)
            logits = model(ids, heed_state=state).logits
            totals[weight] = state.accumulators[0].total
            if weight == 0.0:
                torch.testing.assert_close(logits, standard_twin(model)(ids).logits, atol=1e-5, rtol=1e-5)
    assert totals[1.0].abs().max() > 1 and not totals[0.0].any()
    torch.testing.assert_close(totals[0.5], 0.5 * totals[1.0])
    with pytest.raises(ValueError, match="selection_weight"):
        model(ids, heed_state=AttentionState(selection_weight=-1.0))


def test_straight_through_eviction_keeps_the_evicted_forward_and_the_unevicted_backward():
    """``eviction_gradient="straight_through"``: the output is the budgeted forward's, value for value, and the
    gradient is that of the same attention without eviction (computed independently, no budgets), under a
    loss linear in the output; without it the gradient is the evicted forward's own, which differs."""
    torch.manual_seed(0)
    b, h, kv_heads, n, d = 2, 4, 2, 9, 8
    scaling, budgets = d**-0.5, (3,)  # 9 tokens through a 3-token budget: most keys evicted
    weights = torch.randn(b, n, h, d)  # the loss sum(out * weights): its gradient does not depend on out

    def run(state):
        inputs = [torch.randn(b, h, n, d, generator=torch.Generator().manual_seed(1))]
        inputs += [torch.randn(b, kv_heads, n, d, generator=torch.Generator().manual_seed(s)) for s in (2, 3)]
        for x in inputs:
            x.requires_grad_(True)
        out, _ = selective_attention_forward(_Layer(), *inputs, None, scaling=scaling, heed_state=state)
        (out * weights).sum().backward()
        return out.detach(), [x.grad for x in inputs]

    evicted, evicted_grads = run(AttentionState(budgets=budgets))
    straight, straight_grads = run(AttentionState(budgets=budgets, eviction_gradient="straight_through"))
    unevicted, unevicted_grads = run(None)
    torch.testing.assert_close(straight, evicted)
    assert (straight - unevicted).abs().max() > 1e-3  # the budget evicted something this forward needed
    for ours, soft, hard in zip(straight_grads, unevicted_grads, evicted_grads):
        torch.testing.assert_close(ours, soft)
        assert (ours - hard).abs().max() > 1e-4
    with pytest.raises(ValueError, match="eviction_gradient"):
        AttentionState(eviction_gradient="soft")


def test_qk_norm_makes_the_mask_at_initialisation_large_at_any_init_scale():
    """Why a Selective Attention Qwen3 fades its selection in (``rl.selective.losses.selection_weight``):
    QK-norm normalises head 0's query and key before their dot product, so its logits are O(1) however small
    the initial weights, ``relu`` keeps about 0.4 of each, and a key's running mask grows with every later
    token. Over 128 tokens the median key is masked by more than 10 at the default init scale and at a
    tenth of it alike (Llama, without QK-norm, by almost nothing at the smaller scale)."""
    ids = torch.randint(1, VOCAB, (4, 128), generator=torch.Generator().manual_seed(0))

    def median_mask(arch, scale):
        model = tiny_model(arch, initializer_range=scale, num_hidden_layers=1, max_position_embeddings=256)
        state = AttentionState()
        with torch.no_grad():
            model(ids, heed_state=state)
        return state.accumulators[0].total.median().item()  # [b, kv]: the next token's F row

    qwen3 = [median_mask("qwen3", scale) for scale in (0.02, 0.002)]
    assert min(qwen3) > 10 and abs(qwen3[0] - qwen3[1]) < 0.1 * qwen3[0], qwen3
    assert median_mask("llama", 0.002) < 0.1


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_decoding_equals_the_full_forward(arch):
    model = tiny_model(arch)
    ids = torch.randint(1, VOCAB, (2, 12))
    state, cache = AttentionState(), DynamicCache(config=model.config)
    with torch.no_grad():
        full = model(ids).logits
        pieces = [model(ids[:, :5], past_key_values=cache, use_cache=True, heed_state=state).logits]
        pieces.append(model(ids[:, 5:8], past_key_values=cache, use_cache=True, heed_state=state).logits)
        for t in range(8, 12):
            pieces.append(
                model(ids[:, t : t + 1], past_key_values=cache, use_cache=True, heed_state=state).logits
            )
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=1e-5)


def test_generate_with_bound_state_matches_greedy_full_forward():
    model = tiny_model("qwen3")
    prompt = torch.randint(1, VOCAB, (2, 5))
    with torch.no_grad(), bind_state(model):
        out = model.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        greedy = model(out).logits.argmax(-1)[:, 4:-1]
    assert (out[:, 5:] == greedy).all()
    assert not hasattr(model.model.layers[0].self_attn, "heed_state")  # unbound afterwards


def test_decoding_without_state_is_an_error():
    model = tiny_model("qwen3")
    cache = DynamicCache(config=model.config)
    ids = torch.randint(1, VOCAB, (1, 6))
    with torch.no_grad():
        model(ids[:, :5], past_key_values=cache, use_cache=True)
        with pytest.raises(ValueError, match="heed_state=AttentionState"):
            model(ids[:, 5:], past_key_values=cache, use_cache=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_does_not_change_real_tokens(arch):
    model = tiny_model(arch)
    ids = torch.randint(1, VOCAB, (2, 9))
    attention_mask = torch.ones(2, 9, dtype=torch.long)
    attention_mask[0, :3] = 0  # row 0 left-padded by 3
    attention_mask[1, 6:] = 0  # row 1 right-padded by 3
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        padded = model(ids, attention_mask=attention_mask, position_ids=position_ids).logits
        torch.testing.assert_close(padded[0, 3:], model(ids[:1, 3:]).logits[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(padded[1, :6], model(ids[1:, :6]).logits[0], atol=1e-5, rtol=1e-5)


def test_4d_bool_and_float_masks_agree():
    # A Declarative Attention mask reaches the attention function untouched, as bool or additive float.
    model = tiny_model("qwen3")
    n = 8
    ids = torch.randint(1, VOCAB, (1, n))
    visible = torch.ones(n, n, dtype=torch.bool).tril()
    visible[5:, 1:3] = False  # tokens 5.. may not read chunk {1, 2}
    additive = torch.zeros(n, n).masked_fill(~visible, torch.finfo(torch.float32).min)
    with torch.no_grad():
        from_bool = model(ids, attention_mask=visible[None, None]).logits
        from_float = model(ids, attention_mask=additive[None, None]).logits
        causal = model(ids).logits
    torch.testing.assert_close(from_bool, from_float)
    torch.testing.assert_close(from_bool[:, :5], causal[:, :5], atol=1e-5, rtol=1e-5)
    assert (from_bool[:, 5:] - causal[:, 5:]).abs().max() > 1e-4


def test_save_and_from_pretrained_keep_selective_attention(tmp_path):
    model = tiny_model("llama")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["selective_attention"] is True
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config._attn_implementation == SELECTIVE
    ids = torch.randint(1, VOCAB, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    with pytest.raises(ValueError, match="runs only with attn_implementation='heed_selective'"):
        AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")


def test_unsupported_configs_are_errors():
    with pytest.raises(ValueError, match="not supported for model_type 'gpt2'"):
        enable_selective_attention(GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ValueError, match="not supported for model_type 'gpt2'"):
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, selective_attention=True))
    with pytest.raises(ValueError, match="sliding-window"):
        tiny_config("qwen3", use_sliding_window=True, sliding_window=4, max_window_layers=0)

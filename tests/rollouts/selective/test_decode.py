"""The reference decoding loop with per-layer compact caches: it equals the eviction replayed in one
forward, reads what the budgets allow, and its H2O / TOVA decisions follow from the attention."""

import pytest
import torch

from rollouts.selective.attention import STANDARD, AttentionState
from rollouts.selective.decode import decode_with_eviction
from rollouts.selective.eviction import H2OEviction, SelectiveEviction, TOVAEviction

from .test_attention import VOCAB, standard_twin, tiny_model

pytestmark = pytest.mark.usefixtures("selective_attention")


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_compact_cache_equals_replayed_eviction(arch):
    model = tiny_model(arch)
    ids = torch.randint(1, VOCAB, (2, 14))
    budgets = (4, 6)
    run = decode_with_eviction(model, ids, budgets, SelectiveEviction())
    with torch.no_grad():
        replayed = model(ids, heed_state=AttentionState(budgets=budgets)).logits
        full = model(ids).logits
    torch.testing.assert_close(run.logits, replayed, atol=1e-4, rtol=1e-4)
    assert (run.logits - full).abs().max() > 1e-2  # the budgets bite
    expected_reads = torch.arange(1, 15)[:, None].clamp(max=torch.tensor(budgets))  # min(p + 1, K_l)
    assert (torch.from_numpy(run.kv_reads) == expected_reads).all()
    for layer in range(len(budgets)):
        assert (run.held[layer].sum(-1) == expected_reads[:, layer]).all()
        assert run.held[layer][:, :, 0].all()  # <BOS> stays


def test_large_budgets_change_nothing():
    model = tiny_model("qwen3")
    ids = torch.randint(1, VOCAB, (1, 9))
    run = decode_with_eviction(model, ids, 9, SelectiveEviction())
    with torch.no_grad():
        torch.testing.assert_close(run.logits, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_generation_and_completion_reads():
    model = tiny_model("qwen3")
    prompt = torch.randint(1, VOCAB, (2, 5))
    budgets = (3, 4)
    run = decode_with_eviction(model, prompt, budgets, SelectiveEviction(), max_new_tokens=6)
    assert run.token_ids.shape == (2, 11) and (run.token_ids[:, :5] == prompt).all()
    with torch.no_grad():  # greedy under the same eviction, replayed on the whole sequence
        greedy = model(run.token_ids, heed_state=AttentionState(budgets=budgets)).logits.argmax(-1)
    assert (run.token_ids[:, 5:] == greedy[:, 4:-1]).all()
    # The forward that predicted generated token j sits at position 4 + j and read min(5 + j, K_l) keys.
    assert run.completion_kv_tokens.shape == (2, 6, 2)
    assert run.completion_kv_tokens[0].tolist() == [[3, 4]] * 6


@pytest.mark.parametrize("prefill", [1, 6])
def test_masked_decoding_over_a_full_cache_equals_the_compact_cache(prefill):
    """Eviction as masking (every key stays cached, each layer masks what it evicted: the paged-engine
    form) takes the compacting loop's decisions: a prefill of ``prefill`` tokens, then one token per
    forward over a ``DynamicCache`` that never shrinks."""
    from transformers import DynamicCache

    model = tiny_model("qwen3")
    ids = torch.randint(1, VOCAB, (2, 13))
    budgets = (3, 5)
    compact = decode_with_eviction(model, ids, budgets, SelectiveEviction())
    state, cache = AttentionState(budgets=budgets), DynamicCache(config=model.config)
    with torch.no_grad():
        rows = [model(ids[:, :prefill], past_key_values=cache, heed_state=state).logits]
        reads = [torch.stack([state.kv_reads[layer][:, -1] for layer in range(2)], -1)]
        for t in range(prefill, ids.shape[1]):
            out = model(
                ids[:, t : t + 1], position_ids=torch.full((2, 1), t), past_key_values=cache, heed_state=state
            )
            rows.append(out.logits)
            reads.append(torch.stack([state.kv_reads[layer][:, 0] for layer in range(2)], -1))
    assert cache.get_seq_length() == ids.shape[1]  # nothing was freed: the mask did the evicting
    torch.testing.assert_close(torch.cat(rows, 1), compact.logits, atol=1e-4, rtol=1e-4)
    assert torch.stack(reads[1:], 1).tolist() == compact.kv_reads[:, prefill:].tolist()
    for layer in range(2):
        assert state.held[layer].sum(-1).tolist() == [budgets[layer]] * 2
        assert (state.held[layer] == compact.held[layer][:, -1]).all()


def test_masked_decoding_needs_the_prefill_state():
    from transformers import DynamicCache

    model = tiny_model("qwen3")
    ids = torch.randint(1, VOCAB, (1, 6))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        state = AttentionState()
        model(ids[:, :5], past_key_values=cache, heed_state=state)  # prefilled without budgets
        state.budgets = (2, 2)
        with pytest.raises(ValueError, match="continues a prefill"):
            model(ids[:, 5:], position_ids=torch.tensor([[5]]), past_key_values=cache, heed_state=state)


def test_selective_eviction_needs_a_selective_model():
    model = tiny_model("qwen3")
    with pytest.raises(ValueError, match="needs a Selective Attention model"):
        decode_with_eviction(standard_twin(model), torch.ones(1, 3, dtype=torch.long), 2, SelectiveEviction())
    with pytest.raises(ValueError, match="integers >= 2"):
        decode_with_eviction(model, torch.ones(1, 3, dtype=torch.long), [4, 0], SelectiveEviction())


@pytest.mark.parametrize("policy", [H2OEviction(), TOVAEviction()])
def test_attention_policies_follow_the_attention(policy):
    # One layer, so the loop's held sets form one mask: a dense forward under that mask gives the same
    # logits and the attention every decision was based on. H2O must have evicted the held token (not
    # <BOS>) with the least attention summed over earlier queries; TOVA the least attended by the last one.
    torch.manual_seed(0)
    model = standard_twin(tiny_model("qwen3", num_hidden_layers=1))
    ids = torch.randint(1, VOCAB, (2, 12))
    budget = 4
    run = decode_with_eviction(model, ids, [budget], policy)
    assert model.config._attn_implementation == "sdpa"  # restored after the run
    held = run.held[0]  # [b, n, n]
    model.set_attn_implementation(STANDARD)
    state = AttentionState(record_attention=True)
    with torch.no_grad():
        dense = model(ids, attention_mask=held[:, None], heed_state=state).logits
    torch.testing.assert_close(run.logits, dense, atol=1e-5, rtol=1e-5)
    probs = state.attention[0]  # [b, n, n], zero where not held
    evictions = 0
    for b in range(2):
        for t in range(1, 12):
            before = set(torch.nonzero(held[b, t - 1]).flatten().tolist())
            gone = before - set(torch.nonzero(held[b, t]).flatten().tolist())
            if len(before) < budget:
                assert not gone
                continue
            if isinstance(policy, H2OEviction):
                score = {j: float(probs[b, :t, j].sum()) for j in before}
            else:
                score = {j: float(probs[b, t - 1, j]) for j in before}
            expected = min(sorted(before - {0}), key=lambda j: score[j])
            assert gone == {expected}
            evictions += 1
    assert evictions == 2 * (12 - budget)

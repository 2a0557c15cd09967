"""Masked completion log-probs: one padded batch forward equals prefix-by-prefix decoding."""

import pytest
import torch

from rl.logprobs import completion_logprobs, pack
from rollouts.masks import visible_chunks


@pytest.fixture(scope="module")
def model(small_model):
    return small_model


@pytest.fixture(scope="module")
def rows(two_rows):
    return two_rows


def decode_reference(model, trace, completion):
    """g_j's log-prob from a forward over prompt + g_<j alone, with a mask written from the spans."""
    layout, out = trace.layout, []
    seq = list(layout.input_ids) + list(completion)
    for j in range(len(completion)):
        n = layout.prompt_len + j  # tokens before g_j
        state = trace.states[trace.row_state[j - 1]] if j else trace.states[0]
        vis = visible_chunks(state, layout.num_chunks)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        last = mask[n - 1]
        for c, (s, e) in enumerate(layout.chunk_spans, start=1):
            last[s:e] = bool(vis[c])
        # only the last row matters for g_j; earlier rows keep their own (already tested) visibility
        for q in range(layout.prompt_len, n - 1):
            row_vis = visible_chunks(trace.states[trace.row_state[q - layout.prompt_len]], layout.num_chunks)
            for c, (s, e) in enumerate(layout.chunk_spans, start=1):
                mask[q, s:e] = bool(row_vis[c])
        with torch.no_grad():
            logits = model(torch.tensor([seq[:n]]), attention_mask=mask[None, None]).logits[0, -1]
        out.append(torch.log_softmax(logits, -1)[completion[j]].item())
    return torch.tensor(out)


def test_batched_masked_logprobs_equal_prefix_decoding(model, rows):
    traces, completions = rows
    packed = pack(traces, completions, pad_token_id=0)
    with torch.no_grad():
        logps = completion_logprobs(model, packed)
    for b, (trace, ids) in enumerate(zip(traces, completions)):
        reference = decode_reference(model, trace, ids)
        assert torch.allclose(logps[b, : len(ids)], reference, atol=1e-5), f"row {b}"
        assert (logps[b, len(ids) :] == 0).all()


def test_attention_backends_agree_and_mask_matters(model, rows):
    traces, completions = rows
    with torch.no_grad():
        sdpa = completion_logprobs(model, pack(traces, completions, 0, "sdpa"))
        model.config._attn_implementation = "eager"
        eager = completion_logprobs(model, pack(traces, completions, 0, "eager"))
        model.config._attn_implementation = "sdpa"
    assert torch.allclose(sdpa, eager, atol=1e-5)
    # without the DA mask the steps predicted under focus/local differ
    causal = []
    with torch.no_grad():
        for trace, ids in zip(traces, completions):
            seq = torch.tensor([list(trace.layout.input_ids) + ids])
            logits = model(seq).logits[0, trace.layout.prompt_len - 1 : -1]
            causal.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1))
    for b, (trace, ids) in enumerate(zip(traces, completions)):
        predicted = trace.predicted_state
        masked = [j for j in range(len(ids)) if trace.states[predicted[j]].mode != "global"]
        first = masked[0]
        assert torch.allclose(sdpa[b, :first], causal[b][:first], atol=1e-5)
        assert (sdpa[b, masked] - causal[b][masked]).abs().max() > 1e-4


def test_pack_rejects_mismatched_rows(rows):
    traces, completions = rows
    with pytest.raises(ValueError, match="trace covers"):
        pack(traces, [completions[0][:-1], completions[1]], 0)
    with pytest.raises(ValueError, match="attn_implementation"):
        pack(traces, completions, 0, "flash")


def test_flex_attention_block_mask_matches_sdpa(model, rows):
    """The GPU path (HF flex_attention + our BlockMask) gives the same log-probs; forward only on CPU."""
    traces, completions = rows
    with torch.no_grad():
        sdpa = completion_logprobs(model, pack(traces, completions, 0, "sdpa"))
        model.config._attn_implementation = "flex_attention"
        try:
            flex = completion_logprobs(model, pack(traces, completions, 0, "flex_attention"))
        finally:
            model.config._attn_implementation = "sdpa"
    assert torch.allclose(sdpa, flex, atol=1e-5)


def test_selective_logprobs_replay_the_engines_evictions(small_model, tokenizer, rows, selective_attention):
    """A Selective Attention policy under KV budgets: the trainer's one padded forward, with the budgets
    replayed over each row's real tokens, gives the log-probs the reference engine decoded with eviction."""
    import copy

    import numpy as np

    from rl.logprobs import masked_completion_logps
    from rollouts.engines import RolloutRequest
    from rollouts.engines.reference import ReferenceEngine
    from rollouts.selective.attention import SELECTIVE, AttentionState

    model = copy.deepcopy(small_model)
    model.config.selective_attention = True
    model.set_attn_implementation(SELECTIVE)
    traces, completions = rows
    budgets = (24, 16)  # prompts are 100+ tokens: both layers evict from the start
    engine = ReferenceEngine(model, tokenizer, num_threads=1, budgets=budgets)
    runs = engine.generate(
        [RolloutRequest(t.layout, "da", forced_ids=ids) for t, ids in zip(traces, completions)]
    )

    packed = pack(traces, completions, pad_token_id=tokenizer.pad_token_id)
    real = torch.zeros(packed.input_ids.shape, dtype=torch.bool)
    for b, (trace, ids) in enumerate(zip(traces, completions)):
        real[b, packed.prompt_width - trace.layout.prompt_len : packed.prompt_width + len(ids)] = True
    width = packed.completion_mask.shape[1]
    with torch.no_grad():
        replayed, _ = masked_completion_logps(
            model,
            packed.input_ids,
            traces,
            width,
            heed_state=AttentionState(budgets=budgets, padding_mask=real),
        )
        full, _ = masked_completion_logps(model, packed.input_ids, traces, width)
    for b, (run, ids) in enumerate(zip(runs, completions)):
        assert np.abs(replayed[b, : len(ids)].numpy() - run.logprobs).max() <= 1e-4, f"row {b}"
        assert np.abs(full[b, : len(ids)].numpy() - run.logprobs).max() > 1e-3, f"row {b}: budgets bite"
        assert (run.kv_tokens_per_layer <= np.array(budgets)).all()

"""The Selective Attention path's batched decoding step (rollouts/engines/vllm_selective.py
``decode_together``) against one request at a time through the model's attention function, with requests
of different lengths, DA masks and (the prefill) KV budgets (the vLLM engine itself: test_vllm_selective.py)."""

import copy
import types

import numpy as np
import pytest
import torch

from rollouts.engines.vllm_selective import decode_together, prefill_together
from rollouts.selective.attention import AttentionState, selective_attention_forward

HEADS, KV_HEADS, D, LAYER = 4, 2, 16, 1


def prefilled(n: int, budgets, seed: int):
    """A request after its prefill of ``n - 1`` tokens plus the arriving token's key: ``(query [1, heads,
    1, d], keys, values [1, kv_heads, n, d], state)``."""
    g = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(1, KV_HEADS, n, D, generator=g) for _ in range(2))
    prompt_query = torch.randn(1, HEADS, n - 1, D, generator=g) * 2
    state = AttentionState(budgets=budgets)
    module = types.SimpleNamespace(layer_idx=LAYER)
    selective_attention_forward(
        module, prompt_query, keys[:, :, :-1], values[:, :, :-1], None, heed_state=state
    )
    return torch.randn(1, HEADS, 1, D, generator=g) * 2, keys, values, state


def test_decoding_together_is_decoding_one_at_a_time():
    # (under budgets requests decode in a HeldCache: tests/rollouts/selective/test_held_cache.py)
    lengths = [9, 14, 6, 11]  # padded to 14 in the batch: the shorter ones' padding must stay out of it
    rng = np.random.default_rng(0)
    requests = [prefilled(n, None, seed) for seed, n in enumerate(lengths)]
    da_keys = [None, rng.random(14) > 0.4, None, rng.random(11) > 0.3]
    for keys in da_keys:
        if keys is not None:
            keys[0] = keys[-1] = True  # <BOS> and the arriving token itself, as a DA mode always shows them
    alone = []
    for (query, keys, values, state), visible in zip(requests, da_keys):
        state = copy.deepcopy(state)
        mask = None if visible is None else torch.from_numpy(visible).view(1, 1, 1, -1)
        out, _ = selective_attention_forward(
            types.SimpleNamespace(layer_idx=LAYER), query, keys, values, mask, heed_state=state
        )
        alone.append((out[0, 0], state))

    out, reads = decode_together(
        LAYER,
        torch.cat([q for q, *_ in requests]),
        [(k, v, visible, state) for (_, k, v, state), visible in zip(requests, da_keys)],
        D**-0.5,
    )
    for r, ((expected, state_alone), (*_, state)) in enumerate(zip(alone, requests)):
        torch.testing.assert_close(out[r], expected, atol=1e-6, rtol=1e-5, msg=f"request {r}")
        assert reads[r].item() == state_alone.kv_reads[LAYER][0, 0].item()
        torch.testing.assert_close(state.accumulators[LAYER].total, state_alone.accumulators[LAYER].total)


@pytest.mark.parametrize("budgets", [None, (4, 5, 3)])
def test_prefilling_together_is_prefilling_one_at_a_time(budgets):
    """Prompts of 9, 14 and 6 tokens in one left-padded batch: each gets its own outputs, reads, running
    F sums and (under budgets) held tokens, and decoding continues from them as from its own prefill."""
    lengths = [9, 14, 6]
    g = torch.Generator().manual_seed(1)
    prompts = [
        (
            torch.randn(1, HEADS, n, D, generator=g) * 2,
            *(torch.randn(1, KV_HEADS, n, D, generator=g) for _ in "kv"),
        )
        for n in lengths
    ]
    module = types.SimpleNamespace(layer_idx=LAYER)
    alone = []
    for query, keys, values in prompts:
        state = AttentionState(budgets=budgets)
        out, _ = selective_attention_forward(module, query, keys, values, None, heed_state=state)
        alone.append((out[0], state))
    states = [AttentionState(budgets=budgets) for _ in prompts]
    outs, reads = prefill_together(
        LAYER,
        [q for q, *_ in prompts],
        [(k, v, s) for (_, k, v), s in zip(prompts, states)],
        D**-0.5,
        budgets,
    )
    for r, ((expected, state_alone), state) in enumerate(zip(alone, states)):
        torch.testing.assert_close(outs[r], expected, atol=1e-6, rtol=1e-5, msg=f"request {r}")
        assert torch.equal(reads[r], state_alone.kv_reads[LAYER][0])
        held = slice(None)
        if budgets:
            assert torch.equal(state.held[LAYER], state_alone.held[LAYER])
            held = state.held[LAYER][0]  # evicted keys' F sums are never read again (left at 0)
        total, total_alone = state.accumulators[LAYER].total, state_alone.accumulators[LAYER].total
        torch.testing.assert_close(total[:, held], total_alone[:, held])
    if budgets:
        assert reads[1].max().item() == budgets[LAYER]  # the budget bit inside the longest prompt

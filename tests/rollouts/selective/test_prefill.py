"""The chunked prefill under a KV budget against the dense prefill, one sequence at a time.

The oracle is :func:`rollouts.selective.attention.selective_attention_forward` with budgets on each
sequence alone and unpadded: ``F`` and the held sets replayed over ``[n, n]``. The chunked prefill must
give the same outputs, the same reads per query, and leave the same held tokens with the same ``F`` sums,
whatever the chunk size (one query per chunk, chunks across the budget boundary, one chunk for all) and
the left padding of each row.
"""

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollouts.selective.attention import AttentionState, selective_attention_forward
from rollouts.selective.prefill import budgeted_prefill

HEADS, KV_HEADS, D, SCALING = 4, 2, 16, 0.25


def check_against_dense(n: int, budget: int, chunk: int, pads: list[int], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rows = len(pads)
    query = torch.randn(rows, HEADS, n, D, generator=g) * 2  # logits large enough to select and evict
    key, value = (torch.randn(rows, KV_HEADS, n, D, generator=g) for _ in "kv")
    real = torch.arange(n)[None, :] >= torch.tensor(pads)[:, None]  # [rows, n] left padding
    got = budgeted_prefill(query, key, value, real, budget, SCALING, chunk)
    for r, pad in enumerate(pads):
        state = AttentionState(budgets=(budget,))
        out, _ = selective_attention_forward(
            types.SimpleNamespace(layer_idx=0),
            query[r : r + 1, :, pad:],
            key[r : r + 1, :, pad:],
            value[r : r + 1, :, pad:],
            None,
            scaling=SCALING,
            heed_state=state,
        )  # [1, n - pad, heads, d]
        torch.testing.assert_close(got.out[r, :, pad:], out[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
        assert torch.equal(got.reads[r, pad:], state.kv_reads[0][0]), f"row {r}"
        assert (got.reads[r, :pad] == 0).all()
        held = state.held[0][0].nonzero()[:, 0]  # ascending positions in the unpadded sequence
        kept = got.held[r][got.held[r] >= 0]
        assert torch.equal(kept, held + pad), f"row {r}"
        assert (got.held[r, len(kept) :] == -1).all()
        torch.testing.assert_close(got.total[r, : len(kept)], state.accumulators[0].total[0, held])


@pytest.mark.parametrize(
    "n, budget, chunk, pads",
    [
        (30, 5, 7, [0, 3, 10]),  # chunks across the budget boundary
        (30, 40, 7, [0, 2, 0]),  # a budget larger than the prompt: nothing evicted
        (40, 2, 1, [0, 4, 9]),  # the smallest budget, one query per chunk
        (40, 8, 100, [0, 5, 1]),  # one chunk for the whole prompt
        (150, 16, 64, [0, 30, 100]),
    ],
)
def test_chunked_prefill_is_the_dense_prefill(n, budget, chunk, pads):
    check_against_dense(n, budget, chunk, pads, seed=n + budget + chunk)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 48),
    budget=st.integers(2, 20),
    chunk=st.integers(1, 50),
    pad_fractions=st.lists(st.floats(0, 0.9), min_size=1, max_size=3),
    seed=st.integers(0, 1000),
)
def test_chunked_prefill_is_the_dense_prefill_for_any_shape(n, budget, chunk, pad_fractions, seed):
    check_against_dense(n, budget, chunk, [int(f * n) for f in pad_fractions], seed)

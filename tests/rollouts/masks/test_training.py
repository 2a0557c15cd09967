"""Training-side masks: dense and BlockMask forms against a loop reference, and in a real HF forward."""

import warnings

import numpy as np
import pytest
import torch

from rollouts.masks import (
    block_training_mask,
    dense_training_mask,
    mask_batch,
    visible_chunks,
)


@pytest.fixture(scope="module")
def batch_rows(two_rows):
    traces, completion_ids = two_rows
    layouts = [t.layout for t in traces]
    max_prompt = max(lay.prompt_len for lay in layouts)
    max_completion = max(len(t.row_state) for t in traces)
    starts = [max_prompt - lay.prompt_len for lay in layouts]  # TRL: prompts left-padded
    return traces, starts, max_prompt + max_completion, completion_ids


def reference_mask(trace, start, seq_len):
    """Loop over every (query, key) pair, deciding from spans and states alone."""
    layout = trace.layout
    n = len(trace.row_state)
    mask = np.zeros((seq_len, seq_len), dtype=bool)
    valid = range(start, start + layout.prompt_len + n)
    for q in range(seq_len):
        if q not in valid:
            mask[q, q] = True
            continue
        j = q - start - layout.prompt_len  # completion index of the query (negative: prompt row)
        state = trace.states[trace.row_state[j]] if j >= 0 else trace.states[0]
        vis = visible_chunks(state, layout.num_chunks)
        for k in range(start, q + 1):
            pos = k - start
            chunk = next((i for i, (s, e) in enumerate(layout.chunk_spans, start=1) if s <= pos < e), 0)
            mask[q, k] = bool(vis[chunk])
    return mask


def test_dense_mask_matches_loop_reference(batch_rows):
    traces, starts, seq_len, _ = batch_rows
    batch = mask_batch(traces, starts, seq_len)
    dense = dense_training_mask(batch)
    assert dense.shape == (2, 1, seq_len, seq_len) and dense.dtype == torch.bool
    for b, (trace, start) in enumerate(zip(traces, starts)):
        assert np.array_equal(dense[b, 0].numpy(), reference_mask(trace, start, seq_len)), f"row {b}"
    # positions count real tokens only, so left padding does not shift RoPE
    for b, (trace, start) in enumerate(zip(traces, starts)):
        n_real = trace.layout.prompt_len + len(trace.row_state)
        assert batch.position_ids[b, start : start + n_real].tolist() == list(range(n_real))


def test_block_mask_equals_dense(batch_rows):
    """FlexAttention with the BlockMask gives the same attention output as SDPA with the dense mask."""
    traces, starts, seq_len, _ = batch_rows
    batch = mask_batch(traces, starts, seq_len)
    dense = dense_training_mask(batch)
    block = block_training_mask(batch, block_size=32)
    from torch.nn.attention.flex_attention import flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, seq_len, 32) for _ in range(3))
    with warnings.catch_warnings():  # eager flex_attention warns (once per process) that it is not compiled
        warnings.filterwarnings("ignore", message=".*torch.compile.*", category=UserWarning)
        flex = flex_attention(q, k, v, block_mask=block)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    valid = batch.valid[:, None, :, None].expand_as(sdpa)
    assert torch.allclose(flex[valid], sdpa[valid], atol=1e-5)


def test_masked_forward_is_padding_invariant_and_really_masks(batch_rows, small_model):
    """A tiny Qwen3 in a padded batch gives the same logits as the row alone, and differs from causal."""
    traces, starts, seq_len, completion_ids = batch_rows
    model = small_model
    batch = mask_batch(traces, starts, seq_len)
    input_ids = torch.zeros(2, seq_len, dtype=torch.long)
    for b, (trace, start) in enumerate(zip(traces, starts)):
        ids = list(trace.layout.input_ids) + completion_ids[b]
        input_ids[b, start : start + len(ids)] = torch.tensor(ids)
    with torch.no_grad():
        padded = model(
            input_ids, attention_mask=dense_training_mask(batch), position_ids=batch.position_ids
        ).logits
        for b, (trace, start) in enumerate(zip(traces, starts)):
            n = trace.layout.prompt_len + len(trace.row_state)
            alone = mask_batch([trace], [0], n)
            solo = model(
                input_ids[b : b + 1, start : start + n],
                attention_mask=dense_training_mask(alone),
                position_ids=alone.position_ids,
            ).logits
            assert torch.allclose(padded[b, start : start + n], solo[0], atol=1e-5)
            causal = model(input_ids[b : b + 1, start : start + n]).logits
            p = trace.layout.prompt_len
            masked_rows = [
                p + j
                for j in range(len(trace.row_state))
                if trace.states[trace.row_state[j]].mode != "global"
            ]
            assert masked_rows, "the completion should have non-global steps"
            # identical up to the first masked row (later global rows read hidden states that were masked)
            before = slice(0, masked_rows[0])
            assert torch.allclose(solo[0, before], causal[0, before], atol=1e-5)
            assert (solo[0, masked_rows] - causal[0, masked_rows]).abs().amax(-1).min() > 1e-4


def test_mask_batch_rejects_rows_that_do_not_fit(batch_rows):
    traces, starts, seq_len, _ = batch_rows
    with pytest.raises(ValueError, match="does not fit"):
        mask_batch(traces, starts, seq_len - 1)
    with pytest.raises(ValueError, match="prompt_starts"):
        mask_batch(traces, starts[:1], seq_len)


@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_block_structure_matches_create_block_mask(batch_rows, block_size):
    """Tiles derived at block level equal those of torch's own T x T evaluation of the same mask_mod."""
    from torch.nn.attention.flex_attention import create_block_mask

    from rollouts.masks.training import _mask_mod

    traces, starts, seq_len, _ = batch_rows
    batch = mask_batch(traces, starts, seq_len)
    ours = block_training_mask(batch, block_size=block_size)
    reference = create_block_mask(
        _mask_mod(batch.state_keys, batch.query_state, batch.valid),
        2,
        None,
        seq_len,
        seq_len,
        device="cpu",
        BLOCK_SIZE=block_size,
    )
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        assert torch.equal(getattr(ours, name), getattr(reference, name)), name
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        counts = getattr(ours, num)
        for b in range(2):
            for q in range(counts.shape[-1]):
                n = int(counts[b, 0, q])
                assert set(getattr(ours, idx)[b, 0, q, :n].tolist()) == set(
                    getattr(reference, idx)[b, 0, q, :n].tolist()
                )

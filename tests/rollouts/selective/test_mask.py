"""Selective Attention math: F against loop references written here, the streaming form, L_mem by hand."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rollouts.selective.mask import (
    MaskAccumulator,
    accumulated_mask,
    effective_memory,
    memory_loss,
    selection_matrix,
)


def reference_mask(logits, visible=None):
    """F for one [n, n] matrix with explicit loops, from the paper's definition.

    S[i][k] = relu(logits[i][k]) if query i sees key k (causal and ``visible``), k is not i and k is
    not the first key query i sees (<BOS>); F[i][k] = sum of S[r][k] over r < i.
    """
    n = len(logits)
    s = [[0.0] * n for _ in range(n)]
    for i in range(n):
        seen = [k for k in range(i + 1) if visible is None or visible[i][k]]
        for k in seen:
            if k != i and k != seen[0]:
                s[i][k] = max(0.0, float(logits[i][k]))
    return [[sum(s[r][k] for r in range(i)) for k in range(n)] for i in range(n)]


def reference_batched(logits, visible=None):
    """Apply :func:`reference_mask` to every [n, n] matrix of a [..., n, n] tensor."""
    out = torch.zeros(logits.shape, dtype=torch.float32)
    for idx in itertools.product(*(range(d) for d in logits.shape[:-2])):
        vis = None if visible is None else visible[idx].tolist()
        out[idx] = torch.tensor(reference_mask(logits[idx].tolist(), vis))
    return out


@pytest.mark.parametrize(("batch", "n"), [((), 1), ((), 2), ((3,), 5), ((2, 3), 7), ((1,), 16)])
def test_accumulated_mask_matches_loop_reference(batch, n):
    torch.manual_seed(n)
    logits = torch.randn(*batch, n, n) * 2
    torch.testing.assert_close(accumulated_mask(logits), reference_batched(logits))


def test_accumulated_mask_paper_example_by_hand():
    # Above the diagonal (9s) is causal-masked, column 0 is <BOS>, the diagonal is self: all give S = 0.
    # The only selections left: S[2,1] = 1.5, S[3,1] = relu(-2) = 0, S[3,2] = 0.5.
    logits = torch.tensor(
        [
            [3.0, 9.0, 9.0, 9.0],
            [5.0, 2.0, 9.0, 9.0],
            [1.0, 1.5, 7.0, 9.0],
            [4.0, -2.0, 0.5, 6.0],
        ]
    )
    # F[i] = sum of S rows before i: rows 0..2 of F are zero but F[3,1] = S[2,1] = 1.5; S[3] is too late.
    expected = torch.zeros(4, 4)
    expected[3, 1] = 1.5
    torch.testing.assert_close(accumulated_mask(logits), expected)
    five = torch.cat([torch.cat([logits, torch.zeros(4, 1)], 1), torch.zeros(1, 5)])
    assert accumulated_mask(five)[4, 2] == 0.5  # a fifth token sees S[3,2]


def test_accumulated_mask_respects_visibility_and_moves_bos():
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 9, 9) * 3
    visible = torch.rand(2, 1, 9, 9) > 0.3
    visible[1, :, :, :2] = False  # left padding: row 1's first real token is key 2
    visible = visible.expand(2, 3, 9, 9)
    torch.testing.assert_close(accumulated_mask(logits, visible), reference_batched(logits, visible))


def test_accumulated_mask_rejects_non_square_logits():
    with pytest.raises(ValueError, match="square"):
        accumulated_mask(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="queries"):
        selection_matrix(torch.zeros(5, 4))


def test_streaming_accumulator_equals_f_row_by_row():
    torch.manual_seed(2)
    logits = torch.randn(3, 11, 11) * 2
    expected = reference_batched(logits)
    acc = MaskAccumulator()
    for i in range(11):
        row = acc.step(logits[:, i : i + 1, : i + 1])  # the new query over the i + 1 cached keys
        torch.testing.assert_close(row[:, 0], expected[:, i, : i + 1])
    # After the last step the running sums are the F row a twelfth token would get.
    padded = torch.zeros(3, 12, 12)
    padded[:, :11, :11] = logits
    torch.testing.assert_close(acc.total, reference_batched(padded)[:, 11, :11])


def test_streaming_accumulator_takes_a_chunked_prefill():
    torch.manual_seed(3)
    logits = torch.randn(2, 10, 10)
    expected = reference_batched(logits)
    acc = MaskAccumulator()
    first = acc.step(logits[:, :4, :4])  # prefill of 4 tokens
    second = acc.step(logits[:, 4:7, :7])  # 3 more queries over 7 keys
    third = acc.step(logits[:, 7:8, :8])  # then one decode step
    torch.testing.assert_close(first, expected[:, :4, :4])
    torch.testing.assert_close(second, expected[:, 4:7, :7])
    torch.testing.assert_close(third, expected[:, 7:8, :8])


def test_streaming_accumulator_follows_compaction():
    # After keeping keys [0, 2, 3] of 4, the next row over the compacted cache is the full row's columns.
    torch.manual_seed(4)
    logits = torch.randn(6, 6)
    expected = torch.tensor(reference_mask(logits.tolist()))
    acc = MaskAccumulator()
    acc.step(logits[:4, :4])
    acc.keep(torch.tensor([0, 2, 3]))
    kept = torch.tensor([0, 2, 3, 4])
    row = acc.step(logits[4:5, kept])
    torch.testing.assert_close(row[0], expected[4, kept])


def test_streaming_accumulator_rejects_a_cache_of_the_wrong_length():
    acc = MaskAccumulator()
    acc.step(torch.zeros(1, 3, 3))
    with pytest.raises(ValueError, match="holds 3 keys but the cache has 4"):
        acc.step(torch.zeros(1, 1, 5))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 10).flatmap(
        lambda n: arrays(np.float32, (2, n, n), elements=st.floats(-50, 50, width=32, allow_subnormal=False))
    )
)
def test_accumulated_mask_properties(logits):
    f = accumulated_mask(torch.from_numpy(logits))
    n = f.shape[-1]
    assert (f >= 0).all()
    assert (f[..., 1:, :] >= f[..., :-1, :]).all()  # masking only grows down the query axis
    assert (f.triu() == 0).all()  # zero on and above the diagonal
    assert (f[..., 0] == 0).all()  # <BOS> is never masked
    if n > 1:
        assert (f[..., 1, :] == 0).all()  # nothing before token 1 can select anything


# L_mem by hand. Two layers, four tokens, eps = 0.1, tau = 1.
#   Layer A: head-0 logits give S[2,1] = 1.5 (everything else is <BOS>, self or above the diagonal),
#            so F[3,1] = 1.5 and every other F is 0.
#            M_i = i - sum_k min(F[i,k], 1) (i from 1): M = [1, 2, 3, 4 - min(1.5, 1)] = [1, 2, 3, 3]; max 3.
#   Layer B: S[2,1] = 0.25, so F[3,1] = 0.25: M = [1, 2, 3, 4 - 0.25] = [1, 2, 3, 3.75]; max 3.75.
#   L_mem = 0.1 * (3 + 3.75) / (2 layers * 4 tokens) = 0.1 * 6.75 / 8 = 0.084375.
# With tau = 2: A: 4 - 1.5/2 = 3.25; B: 4 - 0.25/2 = 3.875; L_mem = 0.1 * 7.125 / 8 = 0.0890625.
LAYER_A = [[3.0, 9.0, 9.0, 9.0], [5.0, 2.0, 9.0, 9.0], [1.0, 1.5, 7.0, 9.0], [4.0, -2.0, 0.5, 6.0]]
LAYER_B = [[3.0, 9.0, 9.0, 9.0], [5.0, 2.0, 9.0, 9.0], [1.0, 0.25, 7.0, 9.0], [4.0, -2.0, 0.5, 6.0]]


def hand_masks():
    return [accumulated_mask(torch.tensor([layer])) for layer in (LAYER_A, LAYER_B)]  # 2 x [1, 4, 4]


def test_effective_memory_by_hand():
    a, b = hand_masks()
    torch.testing.assert_close(effective_memory(a)[0], torch.tensor([1.0, 2.0, 3.0, 3.0]))
    torch.testing.assert_close(effective_memory(b)[0], torch.tensor([1.0, 2.0, 3.0, 3.75]))


def test_memory_loss_by_hand():
    assert memory_loss(hand_masks()).item() == pytest.approx(0.084375)
    assert memory_loss(hand_masks(), tau=2.0).item() == pytest.approx(0.0890625)
    assert memory_loss(hand_masks(), eps=1.0).item() == pytest.approx(0.84375)
    assert memory_loss(torch.stack(hand_masks())).item() == pytest.approx(0.084375)


def test_memory_loss_is_padding_invariant():
    # The hand example padded right by 3 and left by 3 (garbage logits on padding) gives the same loss,
    # alone and as a batch of both rows.
    torch.manual_seed(5)
    right = torch.randn(2, 1, 7, 7) * 5
    left = torch.randn(2, 1, 7, 7) * 5
    for layer, logits in enumerate((LAYER_A, LAYER_B)):
        right[layer, 0, :4, :4] = torch.tensor(logits)
        left[layer, 0, 3:, 3:] = torch.tensor(logits)
    right_real = torch.tensor([[1, 1, 1, 1, 0, 0, 0]])
    left_real = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    # Padding keys are never seen, as in the model: the masks come from the padded logits.
    right_masks = [accumulated_mask(right[layer], right_real.bool()[:, None, :]) for layer in range(2)]
    left_masks = [accumulated_mask(left[layer], left_real.bool()[:, None, :]) for layer in range(2)]
    assert memory_loss(right_masks, right_real).item() == pytest.approx(0.084375)
    assert memory_loss(left_masks, left_real).item() == pytest.approx(0.084375)
    both = [torch.cat(pair) for pair in zip(right_masks, left_masks)]
    assert memory_loss(both, torch.cat([right_real, left_real])).item() == pytest.approx(0.084375)


def test_memory_loss_bad_input():
    with pytest.raises(ValueError, match="tau"):
        memory_loss(hand_masks(), tau=0.0)
    with pytest.raises(ValueError, match=r"\[layers, batch, n, n\]"):
        memory_loss(torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="padding_mask"):
        memory_loss(hand_masks(), torch.ones(1, 5))
    with pytest.raises(ValueError, match="real token"):
        memory_loss(hand_masks(), torch.zeros(1, 4))


def branched_layout(prefix: int, branches: list[int]):
    """``(ids [n], visible [n, n])`` of a row ``[prefix | b_1 | ... | b_k]`` whose branches cannot see each
    other (a GRPO group's prompt and completions in one row)."""
    ids = torch.tensor([0] * prefix + [j for j, n in enumerate(branches, start=1) for _ in range(n)])
    own = (ids[:, None] == ids[None, :]) | (ids[None, :] == 0)
    return ids, own & torch.ones(len(ids), len(ids), dtype=torch.bool).tril()


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.integers(1, 6),
    branches=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_branched_f_is_each_branch_in_a_row_of_its_own(prefix, branches, seed):
    """Each branch's F over the prefix and its own keys is the loop reference's F of ``prefix + branch``
    alone; keys of the other branches stay unmasked."""
    ids, visible = branched_layout(prefix, branches)
    logits = torch.randn(len(ids), len(ids), generator=torch.Generator().manual_seed(seed)) * 2
    f = accumulated_mask(logits[None], visible[None], ids[None])[0]
    for j in range(1, len(branches) + 1):
        alone = ((ids == 0) | (ids == j)).nonzero().flatten()
        sub_logits, sub_visible, sub_f = (t[alone][:, alone] for t in (logits, visible, f))
        expected = torch.tensor(reference_mask(sub_logits.tolist(), sub_visible.tolist()))
        torch.testing.assert_close(sub_f, expected, atol=1e-5, rtol=1e-5)
        others = (ids != 0) & (ids != j)
        assert (f[ids == j][:, others] == 0).all()

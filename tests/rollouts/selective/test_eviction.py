"""KV eviction: budgets, the one-step rule, and the replayed eviction against a brute-force reference."""

import pytest
import torch

from rollouts.selective.eviction import (
    H2OEviction,
    HeldTokens,
    SelectiveEviction,
    TOVAEviction,
    check_budgets,
    evict_index,
    selective_keep_mask,
)
from rollouts.selective.mask import accumulated_mask


def reference_keep(mask, budget, real):
    """Greedy eviction with Python lists: per query, the set of positions held when it attends.

    Each arriving real token first evicts, if ``budget`` tokens are held, the held token (never the first
    real one) with the largest ``mask[i][j]`` -- the oldest on ties -- then enters.
    """
    n = len(mask)
    bos = real.index(True)
    held, rows = [], []
    for i in range(n):
        if real[i]:
            if len(held) >= budget:
                held.remove(max((j for j in held if j != bos), key=lambda j: (mask[i][j], -j)))
            held.append(i)
        rows.append(set(held))
    return rows


def as_sets(keep):
    return [set(torch.nonzero(row).flatten().tolist()) for row in keep]


def test_check_budgets():
    assert check_budgets([4, 2, 8], 3) == (4, 2, 8)
    assert check_budgets(16, 3) == (16, 16, 16)
    with pytest.raises(ValueError, match="4 KV budgets for a model with 3 layers"):
        check_budgets([4, 4, 4, 4], 3)
    with pytest.raises(ValueError, match="2 KV budgets for a model with 3 layers"):
        check_budgets([4, 4], 3)
    for bad in (0, -8, 1, 2.5, True):
        with pytest.raises(ValueError, match="integers >= 2"):
            check_budgets([4, bad, 4], 3)


def test_one_eviction_keeps_the_least_masked_and_bos():
    # A layer holding K + 1 tokens after an arrival drops one: the survivors are <BOS> plus the K - 1
    # least-masked others -- checked against sorting, for many random score rows.
    torch.manual_seed(0)
    budget = 6
    scores = torch.rand(200, budget + 1)
    scores[:, 0] = 10.0  # <BOS> is the most masked, and still stays
    evictable = torch.ones_like(scores, dtype=torch.bool)
    evictable[:, 0] = False
    victim = evict_index(scores, evictable)
    for row, v in zip(scores.tolist(), victim.tolist()):
        survivors = {0} | set(sorted(range(1, budget + 1), key=lambda j: row[j])[: budget - 1])
        assert set(range(budget + 1)) - {v} == survivors


def test_ties_evict_the_oldest():
    scores = torch.tensor([[0.0, 1.0, 3.0, 3.0, 2.0]])
    assert evict_index(scores, torch.tensor([[False, True, True, True, True]])).item() == 2


@pytest.mark.parametrize("budget", [2, 3, 5, 9, 20])
def test_selective_keep_mask_matches_brute_force(budget):
    torch.manual_seed(budget)
    n = 14
    # Random masks with distinct values, and real F (many zero ties) from random logits.
    masks = torch.cat([torch.rand(2, n, n), accumulated_mask(torch.randn(2, n, n) * 2)])
    real = torch.ones(4, n, dtype=torch.bool)
    real[1, :3] = False  # left padding
    real[2, -4:] = False  # right padding
    keep = selective_keep_mask(masks, budget, real)
    for b in range(4):
        assert as_sets(keep[b]) == reference_keep(masks[b].tolist(), budget, real[b].tolist())


def test_selective_keep_mask_invariants():
    torch.manual_seed(7)
    n, budget = 12, 4
    keep = selective_keep_mask(accumulated_mask(torch.randn(3, n, n)), budget)
    sizes = keep.sum(-1)  # [b, n]
    assert (sizes == torch.arange(1, n + 1).clamp(max=budget)).all()
    assert keep[:, :, 0].all()  # <BOS> always held
    assert keep.diagonal(dim1=-2, dim2=-1).all()  # a token always sees itself
    assert not keep.triu(1).any()  # nothing from the future
    # Evicted means gone for good: a key j <= i held by query i + 1 was held by query i.
    came_back = keep[:, 1:, :-1] & ~keep[:, :-1, :-1]  # [b, i, j] for i, j < n - 1
    assert not came_back.tril().any()


def test_selective_keep_mask_without_pressure_is_causal():
    keep = selective_keep_mask(torch.rand(1, 6, 6), budget=6)
    assert (keep[0] == torch.ones(6, 6, dtype=torch.bool).tril()).all()


def test_policies_score_what_their_papers_say():
    held = HeldTokens(
        mask=torch.tensor([[0.0, 2.0, 0.5, 1.0]]),
        attention_sum=torch.tensor([[3.0, 0.2, 0.9, 0.1]]),
        last_attention=torch.tensor([[0.5, 0.05, 0.4, 0.05 + 1e-3]]),
    )
    evictable = torch.tensor([[False, True, True, True]])
    assert evict_index(SelectiveEviction().scores(held), evictable).item() == 1  # most masked
    assert evict_index(H2OEviction().scores(held), evictable).item() == 3  # least attention mass
    assert evict_index(TOVAEviction().scores(held), evictable).item() == 1  # least recent attention


@pytest.mark.parametrize("budget", [2, 4, 7])
def test_branched_keep_mask_replays_each_branch_from_the_prefix(budget):
    """Rows ``[prefix | b_1 | b_2 | b_3]`` (left padding in one of them): every branch holds what the greedy
    reference holds over ``prefix + branch`` alone, starting from what the prefix left."""
    from .test_mask import branched_layout

    ids, visible = branched_layout(6, [5, 3, 4])
    n = len(ids)
    torch.manual_seed(budget)
    f = accumulated_mask(torch.randn(2, n, n) * 2, visible, ids.expand(2, n))
    real = torch.ones(2, n, dtype=torch.bool)
    real[1, :2] = False  # left padding inside the prefix
    keep = selective_keep_mask(f, budget, real, ids.expand(2, n))
    for b in range(2):
        for j in (1, 2, 3):
            alone = ((ids == 0) | (ids == j)).nonzero().flatten()
            expected = reference_keep(f[b][alone][:, alone].tolist(), budget, real[b][alone].tolist())
            got = [{int(alone[k]) for k in row} for row in expected]
            assert as_sets(keep[b][alone]) == got, f"row {b} branch {j}"

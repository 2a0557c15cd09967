"""KV eviction under per-layer budgets: one mechanism, small scoring policies.

Selective Attention's context pruning (paper §4): layer ``l`` holds at most ``K_l`` tokens. While it holds
fewer, nothing happens; once it holds ``K_l``, each arriving token first evicts one held token -- the one
with the largest accumulated mask ``F`` (:mod:`rollouts.selective.mask`) in the arriving token's row -- and
then enters. So the arriving token attends to exactly ``K_l`` tokens, itself included, and an evicted
token never comes back. The first token (<BOS>) is never evicted; ties go to the oldest token.

Which token leaves is the only thing a policy decides: a policy is a small dataclass with one method,
``scores(held) -> [b, kept]``, and the largest score is evicted. The baselines the paper compares with are
one class each, over the same mechanism and the same budgets:

- :class:`SelectiveEviction` -- the most-masked token (largest ``F``), the paper's rule.
- :class:`H2OEviction` -- H2O-style (Zhang et al., 2023): the token that received the least attention mass
  so far (summed over queries, averaged over heads). The original also pins a recent window; not here.
- :class:`TOVAEviction` -- TOVA-style (Oren et al., 2024): the token the latest query attended to least
  (averaged over heads). The original scores with the arriving query's attention over ``K + 1`` tokens;
  here the arriving token always enters and the previous query's attention decides, so every policy
  reads at most ``K_l`` tokens per step.

For Selective Attention the decision needs only ``F``, and ``F`` in a layer does not depend on that
layer's own eviction (head 0's logits come from the layer's input). So a whole sequence's evictions can be
worked out from the dense ``F`` at once: :func:`selective_keep_mask` gives, per layer, which keys each
query still holds -- the same tokens a decoding loop with a compacted cache would hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .constants import CONFIG_KEY, MIN_BUDGET
from .mask import branch_starts


@dataclass
class HeldTokens:
    """What a policy may look at about the tokens one layer holds: all ``[b, kept]``, in cache order."""

    mask: torch.Tensor  # F row of the arriving token: how much the held tokens have been masked
    attention_sum: torch.Tensor  # attention each held token has received so far (summed over queries)
    last_attention: torch.Tensor  # attention the latest query paid to each held token


@dataclass
class EvictionPolicy:
    """Scores the held tokens of one layer; the largest score is evicted (never <BOS>)."""

    def scores(self, held: HeldTokens) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class SelectiveEviction(EvictionPolicy):
    """Selective Attention (paper §4): evict the most-masked token."""

    def scores(self, held: HeldTokens) -> torch.Tensor:
        return held.mask


@dataclass
class H2OEviction(EvictionPolicy):
    """H2O-style: keep the heavy hitters, evict the token with the least accumulated attention."""

    def scores(self, held: HeldTokens) -> torch.Tensor:
        return -held.attention_sum


@dataclass
class TOVAEviction(EvictionPolicy):
    """TOVA-style: evict the token the latest query attended to least."""

    def scores(self, held: HeldTokens) -> torch.Tensor:
        return -held.last_attention


POLICIES = {"selective": SelectiveEviction, "h2o": H2OEviction, "tova": TOVAEviction}


def check_budgets(budgets: int | Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Per-layer budgets ``K_l`` as a tuple, one per layer (an int means the same for every layer)."""
    if isinstance(budgets, int) and not isinstance(budgets, bool):
        budgets = [budgets] * num_layers
    budgets = list(budgets)
    if len(budgets) != num_layers:
        raise ValueError(
            f"got {len(budgets)} KV budgets for a model with {num_layers} layers: give exactly one per layer"
        )
    for layer, k in enumerate(budgets):
        if isinstance(k, bool) or not isinstance(k, int) or k < MIN_BUDGET:
            raise ValueError(
                f"KV budget of layer {layer} is {k!r}: budgets are integers >= {MIN_BUDGET} "
                "(a layer always holds <BOS> and the arriving token)"
            )
    return tuple(budgets)


def scale_budgets(budgets: Sequence[int], scale: float) -> tuple[int, ...]:
    """Each budget times ``scale``, rounded down (at most ``scale`` of it), never below ``MIN_BUDGET``.

    >>> scale_budgets([11, 8, 6, 2], 0.7)
    (7, 5, 4, 2)
    """
    return tuple(max(MIN_BUDGET, int(b * scale + 1e-9)) for b in budgets)


def save_budgets(config, budgets: int | Sequence[int]) -> None:
    """Store validated per-layer budgets in a model config; ``save_pretrained`` writes them out."""
    setattr(config, CONFIG_KEY, list(check_budgets(budgets, config.num_hidden_layers)))


def load_budgets(config) -> tuple[int, ...] | None:
    """The per-layer budgets a model config carries (validated), or ``None``."""
    budgets = getattr(config, CONFIG_KEY, None)
    return None if budgets is None else check_budgets(list(budgets), config.num_hidden_layers)


def evict_index(scores: torch.Tensor, evictable: torch.Tensor) -> torch.Tensor:
    """``[b]`` the position to evict: the largest score among ``evictable`` (the oldest on ties).

    ``scores``, ``evictable``: ``[b, m]``. The mechanism every policy goes through.
    """
    return scores.float().masked_fill(~evictable, float("-inf")).argmax(-1)


def selective_keep_mask(
    mask: torch.Tensor,
    budget: int,
    padding_mask: torch.Tensor | None = None,
    branches: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[b, n, n]`` bool: which keys each query of one layer still holds under budget ``K``.

    ``mask``: the layer's ``F`` ``[b, n, n]``; ``padding_mask`` ``[b, n]`` (True = real token; padding
    never enters the cache, and <BOS> is each row's first real token). Row ``i`` is the held set when
    token ``i`` attends (it includes ``i``): the paper's greedy eviction replayed position by position.

    ``branches`` ``[b, n]``: rows packing a shared prefix and its continuations
    (:func:`rollouts.selective.mask.branched_shifted_cumsum`: 0 on the prefix, ``j`` on branch ``j``, -1
    on padding after them; the prefix ends at the same position in every row, as a batch of prompts
    left-padded to one width does). Each branch starts from what the layer held at the end of the prefix,
    as a continuation decoded on its own does; ``mask`` is then the branched ``F``. The branches of every
    row are replayed side by side, so the steps after the prefix are the longest branch's, not their sum.
    Padding after the branches holds nothing.
    """
    b, n, _ = mask.shape
    if budget < MIN_BUDGET:
        raise ValueError(f"budget must be >= {MIN_BUDGET}, got {budget}")
    device = mask.device
    real = torch.ones(b, n, dtype=torch.bool, device=device)
    if padding_mask is not None:
        real = padding_mask.to(device=device, dtype=torch.bool)
    bos = real.int().argmax(-1)  # [b]
    prefix = n
    if branches is not None:
        branches = branches.to(device)
        prefix = int((branches == 0).all(0).int().cumprod(0).sum())  # positions 0 .. prefix - 1
        if (branches[:, prefix:] == 0).any():
            raise ValueError("branches: the shared prefix must end at the same position in every row")
    keep = torch.zeros(b, n, n, dtype=torch.bool, device=device)
    # Until some row holds K tokens nothing is evicted: every real token so far is held (one op, not a step
    # per token)
    calm = min(prefix, int((real.cumsum(-1) <= budget).all(0).int().cumprod(0).sum()))
    causal = torch.ones(calm, calm, dtype=torch.bool, device=device).tril()
    keep[:, :calm, :calm] = real[:, None, :calm] & causal
    held = torch.zeros(b, n, dtype=torch.bool, device=device)
    held[:, :calm] = real[:, :calm]
    for i in range(calm, prefix):
        held = _arrive_one(held, mask[:, i], real[:, i], torch.full_like(bos, i), budget, bos)
        keep[:, i] = held
    if branches is None:
        return keep
    # Every (row, branch) continues from its row's prefix state: one sequence each, stepped together.
    row, first = branch_starts(branches).nonzero(as_tuple=True)  # [S]: each branch's row and first position
    length = (branches[row] == branches[row, first][:, None]).sum(-1)  # [S] tokens of each branch
    held = held[row]  # [S, n]
    for step in range(int(length.max()) if len(row) else 0):
        live = step < length
        at = (first + step).clamp(max=n - 1)  # [S] each branch's position at this step
        held = _arrive_one(held, mask[row, at], real[row, at] & live, at, budget, bos[row])
        keep[row[live], at[live]] = held[live]
    return keep


def _arrive_one(held, f_row, arriving, position, budget: int, bos) -> torch.Tensor:
    """One greedy step for ``s`` sequences: ``held`` ``[s, n]``, the arriving tokens' ``F`` rows ``f_row``
    ``[s, n]``, whether each is real (``arriving`` ``[s]``), at ``position`` ``[s]``. A full sequence
    evicts its most-masked held token (never <BOS>, ``bos`` ``[s]``), then the arriving token enters."""
    rows = torch.arange(held.shape[0], device=held.device)
    full = arriving & (held.sum(-1) >= budget)
    evictable = held.clone()
    evictable[rows, bos] = False
    victim = evict_index(f_row, evictable)
    held = held.clone()
    held[rows[full], victim[full]] = False
    held[rows, position] |= arriving
    return held

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

import numpy as np
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
    as a continuation decoded on its own does; ``mask`` is then the branched ``F``. Padding after the
    branches holds nothing.

    The replay is sequential (each eviction depends on the ones before) but small: :func:`replay_evictions`
    steps every sequence at once with numpy (``F`` is copied to the CPU when it lives elsewhere), and the
    held sets of all queries follow from when each key was evicted.
    """
    b, n, _ = mask.shape
    if budget < MIN_BUDGET:
        raise ValueError(f"budget must be >= {MIN_BUDGET}, got {budget}")
    real = np.ones((b, n), dtype=bool)
    if padding_mask is not None:
        real = padding_mask.detach().to(device="cpu", dtype=torch.bool).numpy()
    prefix = n
    if branches is not None:
        branches = branches.detach().cpu()
        prefix = int((branches == 0).all(0).int().cumprod(0).sum())  # positions 0 .. prefix - 1
        if (branches[:, prefix:] == 0).any():
            raise ValueError("branches: the shared prefix must end at the same position in every row")
    f = mask.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    held = np.zeros((b, n), dtype=bool)
    evicted = replay_evictions(f, real, budget, np.arange(b), np.zeros(b, np.int64), np.full(b, prefix), held)
    queries = np.arange(n)
    keep = np.zeros((b, n, n), dtype=bool)
    # Query i holds key k if k is real, k <= i, and k was not evicted by the time i arrived
    keep[:, :prefix, :prefix] = (
        real[:, None, :prefix]
        & (queries[None, :prefix, None] >= queries[None, None, :prefix])
        & (evicted[:, None, :prefix] > queries[None, :prefix, None])
    )
    if branches is not None:
        # Every (row, branch) continues from its row's prefix state: one sequence each.
        row, first = branch_starts(branches).nonzero(as_tuple=True)  # [S] each branch's row, first position
        length = (branches[row] == branches[row, first][:, None]).sum(-1)  # [S] tokens of each branch
        row, first, stop = row.numpy(), first.numpy(), (first + length).numpy()
        member = held[row]  # [S, n] what each branch starts from
        evicted = replay_evictions(f, real, budget, row, first, stop, held[row])  # [S, n]
        for s, (r, a, z) in enumerate(zip(row, first, stop)):
            member[s, a:z] = real[r, a:z]
            span = queries[a:z, None]  # [len, 1] this branch's queries
            keep[r, a:z] = member[s][None] & (queries[None] <= span) & (evicted[s][None] > span)
    return torch.from_numpy(keep).to(mask.device)


def replay_evictions(f, real, budget: int, rows, starts, stops, held) -> np.ndarray:
    """Greedy eviction for ``S`` sequences at once: ``[S, n]``, the position at whose arrival each key was
    evicted (``n`` when never).

    Sequence ``s`` steps through positions ``starts[s] .. stops[s] - 1`` of row ``rows[s]`` (``f`` ``[b, n,
    n]`` numpy, ``real`` ``[b, n]``), from what it holds, ``held[s]`` (``[S, n]`` bool, updated in place; its
    first held position is <BOS>). An arriving real token evicts, when ``K`` are held, the held token with
    the largest ``F`` in its row (never <BOS>, the oldest on ties, as :func:`evict_index`), then enters.
    """
    n, seqs = real.shape[1], np.arange(len(rows))
    evicted = np.full((len(rows), n), n, dtype=np.int64)
    if len(rows) == 0 or (stops - starts).max() <= 0:
        return evicted
    position = starts[:, None] + np.arange(int((stops - starts).max()))  # [S, T]
    arriving = (position < stops[:, None]) & real[rows[:, None], position.clip(max=n - 1)]
    free = arriving & (held.sum(1)[:, None] + arriving.cumsum(1) <= budget)  # enters while not yet full
    s_free, t_free = free.nonzero()
    held[s_free, position[s_free, t_free]] = True  # a sequence's first eviction comes after these
    bos, holds = held.argmax(1), held.any(1)  # each sequence's first held position, if it holds any
    evictable = held  # every held token but <BOS> (put back at the end): what may be evicted
    evictable[seqs, bos] = False
    evicting = arriving & ~free  # [S, T]
    for t in np.flatnonzero(evicting.any(0)):
        s = seqs if evicting[:, t].all() else np.flatnonzero(evicting[:, t])
        i = position[s, t]
        victim = np.where(evictable[s], f[rows[s], i], -np.inf).argmax(1)  # the oldest of the most masked
        evictable[s, victim] = False
        evictable[s, i] = True
        evicted[s, victim] = i
    held[seqs, bos] |= holds
    return evicted

"""Selective Attention: the accumulated mask F and the memory loss L_mem. The single source of truth.

Selective Attention (Leviathan, Kalman, Matias, arXiv 2410.02703) lets a token lower the attention that
*later* tokens pay to an earlier one, with no new parameters. In each layer, head 0's attention logits
double as a selection matrix ``S`` (query rows, key columns; ``S[i, j]``: how much token ``i`` wants
token ``j`` gone), constrained and accumulated into ``F``, which is subtracted from every head's logits::

    SelectiveAttention(Q, K, V) = softmax(Q K^T / sqrt(d_k) - F) V                       (eq. 1)

The paper's reference code (its Figure 2), step by step::

    S = attn_logits[:, 0]           # head 0, with the causal mask already applied: S = 0 above the diagonal
    S = relu(S)                     # a token may only reduce attention, never boost it
    S[..., 0] = 0                   # <BOS> is never masked
    S = (1 - eye(n)) * S            # a token never masks itself
    S = roll(S, 1, -2); S[..., 0, :] = 0   # shift one row: a token's decision affects later tokens only
    F = cumsum(S, axis=-2)          # F[i, j] = sum_{k <= i-1} S[k, j]
    attn_logits -= F[:, None]       # the same F for every head

``F`` is non-negative, non-decreasing down the query axis (masking only ever grows), and zero on and
above the diagonal and in the <BOS> column.

Beyond the paper (needed by a real pipeline, identical to it on an unpadded causal sequence):

- ``visible`` -- the attention mask (causal, padding, Declarative Attention chunks). A key a query
  cannot see gets no selection from it (``S = 0``), just as the causal mask zeroes ``S`` above the
  diagonal; the <BOS> column is the first key each query can see (column 0 without padding).
- Queries are the *last* ``q`` of ``kv`` keys (bottom-right alignment, as with a KV cache): query row
  ``r`` is key ``kv - q + r``. With ``q == kv`` this is the square paper form.
- ``branches`` -- rows that pack one shared prefix and several continuations, ``[prefix | c_1 | ... |
  c_k]`` (a GRPO group's prompt and its completions, run once: ``rl/logprobs.py``). A query of ``c_j``
  accumulates ``S`` over the prefix's rows and ``c_j``'s earlier rows only, so each continuation's ``F``
  is the one it has in a row of its own (:func:`branched_shifted_cumsum`).
- :class:`MaskAccumulator` -- the streaming form for decoding. Per layer it keeps one running sum per
  key, ``total[j] = sum of S[k, j]`` over the queries seen so far (``O(n)`` state, not ``O(n^2)``); the
  ``F`` row of the next query *is* that running sum. It is compacted together with the KV cache when
  tokens are evicted (:mod:`rollouts.selective.eviction`).

The memory loss (paper eq. 2) rewards masking aggressively. ``M_i`` approximates how many tokens
query ``i`` still needs (each key counts ``1 - min(F[i, k], tau) / tau``); a layer's KV budget is set
by its worst position, so the loss is the peak per layer, averaged over layers and normalised by the
sequence length::

    M_i^l = i - sum_{k <= i} min(F^l[i, k], tau) / tau        (i counted from 1: i keys visible)
    L_mem = eps * sum_l max_i M_i^l / (L * n_nonpad)          (paper: eps = 0.1, tau = 1)

Padding: a padding key is not memory (it is not counted in ``i``) and a padding query has no memory
requirement (it is left out of the max); ``n_nonpad`` is the sequence's number of real tokens. So a
padded row gives exactly the loss of the same row unpadded. The batch loss is the mean over rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F_nn

from .constants import DEFAULT_EPS, DEFAULT_TAU


def causal_visibility(q: int, kv: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[q, kv]`` bool: query row ``r`` (key ``kv - q + r``) may see keys ``0 .. kv - q + r``."""
    rows = torch.arange(kv - q, kv, device=device)[:, None]
    return torch.arange(kv, device=device)[None, :] <= rows


def selection_matrix(head0_logits: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """The constrained selection matrix ``S`` ``[..., q, kv]`` (float32) from head 0's raw logits.

    ``head0_logits`` ``[..., q, kv]``: ``q_0 k_0^T / sqrt(d_k)`` of head 0, queries being the last ``q``
    keys. ``visible`` (bool, broadcastable to ``[..., q, kv]``, True = may attend) adds the attention
    mask to causality. ``S`` is the ReLU of the logits where visible and zero elsewhere, with the
    diagonal (self) and each row's <BOS> column (its first visible key) zeroed.
    """
    q, kv = head0_logits.shape[-2:]
    if q > kv:
        raise ValueError(f"head-0 logits have {q} queries but only {kv} keys; queries must be the last keys")
    logits = head0_logits.float()
    vis = causal_visibility(q, kv, logits.device)  # [q, kv]
    if visible is not None:
        vis = vis & visible.to(device=logits.device, dtype=torch.bool)
    vis = vis.expand(logits.shape)
    bos = vis.to(torch.uint8).argmax(-1, keepdim=True)  # [..., q, 1] first visible key (0 if none)
    not_bos = torch.ones_like(vis).scatter_(-1, bos, False)
    not_self = (
        torch.arange(kv, device=logits.device) != torch.arange(kv - q, kv, device=logits.device)[:, None]
    )
    return torch.where(vis & not_bos & not_self, logits.relu(), 0.0)


def _shifted_cumsum(s: torch.Tensor) -> torch.Tensor:
    """``out[..., i, :] = sum_{k < i} s[..., k, :]`` (the paper's roll + zero row 0 + cumsum)."""
    return F_nn.pad(s[..., :-1, :].cumsum(-2), (0, 0, 1, 0))


def branch_starts(branches: torch.Tensor) -> torch.Tensor:
    """``[b, n]`` bool: the first position of each branch (see :func:`branched_shifted_cumsum`)."""
    changes = F_nn.pad(branches[:, :-1] != branches[:, 1:], (1, 0), value=True)
    return (branches > 0) & changes


def branched_shifted_cumsum(s: torch.Tensor, branches: torch.Tensor) -> torch.Tensor:
    """:func:`_shifted_cumsum` within branches: row ``i`` sums the earlier rows of the shared prefix and of
    its own branch, ``out[b, i] = sum_{k < i, branches[b, k] in (0, branches[b, i])} s[b, k]``.

    ``s`` ``[b, n, m]``; ``branches`` ``[b, n]`` int: 0 on the shared prefix, ``j >= 1`` on branch ``j``'s rows
    (each branch contiguous, after the prefix), -1 on padding after them. Padding rows get the plain sum
    (nobody reads them). One cumulative sum and one gather of rows: the sum up to row ``i`` minus what the
    other branches between the prefix and ``i``'s branch added, ``out[i] = C[i] - (C[start(i)] - C[p])``
    with ``C`` the plain shifted sum, ``start(i)`` the first row of ``i``'s branch and ``p`` the first row
    after the prefix.

    >>> s = torch.tensor([[[1.0], [2.0], [4.0], [8.0], [16.0]]])   # prefix rows 0-1, branches 1 and 2
    >>> branched_shifted_cumsum(s, torch.tensor([[0, 0, 1, 1, 2]]))[0, :, 0].tolist()
    [0.0, 1.0, 3.0, 7.0, 3.0]
    """
    b, n = branches.shape
    total = _shifted_cumsum(s)  # [b, n, m]
    positions = torch.arange(n, device=s.device).expand(b, n)
    in_branch = branches > 0
    # first row of each row's branch: the latest branch start at or before it (a running max of positions)
    start = torch.where(branch_starts(branches), positions, 0).cummax(-1).values  # [b, n]
    prefix_end = torch.where(in_branch, positions, n).amin(-1, keepdim=True).clamp(max=n - 1)  # [b, 1]

    def rows(index: torch.Tensor) -> torch.Tensor:  # [b, n] row numbers -> those rows of total
        return total.gather(1, index[..., None].expand(b, n, s.shape[-1]))

    others = rows(start) - rows(prefix_end.expand(b, n))
    return total - torch.where(in_branch[..., None], others, 0.0)


def accumulated_mask(
    head0_logits: torch.Tensor, visible: torch.Tensor | None = None, branches: torch.Tensor | None = None
) -> torch.Tensor:
    """``F`` ``[..., n, n]`` (float32) from head 0's raw logits ``[..., n, n]`` (query rows, key columns).

    ``F[..., i, j] = sum_{k < i} S[..., k, j]`` with ``S`` from :func:`selection_matrix`, exactly the
    paper's reference code on an unpadded causal sequence. ``visible``: optional attention mask
    (bool, broadcastable, True = may attend), e.g. padding or Declarative Attention chunks. ``branches``
    ``[b, n]``: rows packing a shared prefix and its continuations (:func:`branched_shifted_cumsum`).
    """
    n, m = head0_logits.shape[-2:]
    if n != m:
        raise ValueError(
            f"accumulated_mask needs square logits [..., n, n], got [..., {n}, {m}]; "
            "use MaskAccumulator for queries over a KV cache"
        )
    s = selection_matrix(head0_logits, visible)
    return _shifted_cumsum(s) if branches is None else branched_shifted_cumsum(s, branches)


class MaskAccumulator:
    """Streaming ``F`` for one layer: one running sum per cached key, ``O(kv)`` state.

    ``step(head0_logits, visible)`` takes the logits of the next ``q`` queries over all ``kv`` cached keys
    (the ``kv - q`` earlier keys plus the ``q`` new ones, in cache order) and returns their ``F`` rows
    ``[..., q, kv]``; afterwards ``total`` ``[..., kv]`` holds ``sum_k S[k, j]`` over every query so far,
    which is the ``F`` row of the query that comes next. A prefill is one step with ``q == kv``; decoding
    is one step per token with ``q == 1``. ``keep(index)`` compacts the state to the keys a cache keeps.
    """

    def __init__(self):
        self.total: torch.Tensor | None = None  # [..., kv] float32

    def step(self, head0_logits: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
        q, kv = head0_logits.shape[-2:]
        past = kv - q
        held = 0 if self.total is None else self.total.shape[-1]
        if held != past:
            raise ValueError(
                f"the mask accumulator holds {held} keys but the cache has {past} keys before these {q} "
                "queries: use one accumulator per layer and per sequence, compacted with the cache"
            )
        s = selection_matrix(head0_logits, visible)  # [..., q, kv]
        prior = s.new_zeros(s.shape[:-2] + (kv,))
        if self.total is not None:
            prior[..., :past] = self.total
        self.total = prior + s.sum(-2)
        return prior[..., None, :] + _shifted_cumsum(s)

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the keys at ``index`` ``[..., kept]`` (ascending cache positions)."""
        if self.total is not None:
            self.total = self.total.gather(-1, index)


def effective_memory(
    mask: torch.Tensor, visible: torch.Tensor | None = None, tau: float = DEFAULT_TAU
) -> torch.Tensor:
    """``M`` ``[..., q]``: per query, the visible keys minus the effectively masked ones.

    ``M_i = (number of keys query i sees) - sum_k min(F[i, k], tau) / tau``, the paper's
    ``i - sum_{k=1..i} min(F_ik, tau) / tau`` with ``i`` counted from 1. ``mask`` is ``F``
    ``[..., q, kv]`` (queries the last ``q`` keys); ``visible`` as in :func:`selection_matrix`.
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    q, kv = mask.shape[-2:]
    vis = causal_visibility(q, kv, mask.device)
    if visible is not None:
        vis = vis & visible.to(device=mask.device, dtype=torch.bool)
    masked = (mask.float().clamp(max=tau) / tau).masked_fill(~vis, 0.0)
    return vis.sum(-1) - masked.sum(-1)


def memory_penalty(
    peak_memory: torch.Tensor, num_tokens: torch.Tensor, eps: float = DEFAULT_EPS
) -> torch.Tensor:
    """``eps * sum_l peak_l / (L * n)``, averaged over the batch rows that have tokens.

    ``peak_memory`` ``[L, b]``: ``max_i M_i`` per layer and row; ``num_tokens`` ``[b]``: real tokens per row.
    """
    num_layers = peak_memory.shape[0]
    num_tokens = num_tokens.to(peak_memory.device, peak_memory.dtype)
    has_tokens = num_tokens > 0
    if not has_tokens.any():
        raise ValueError("memory_penalty got a batch without a single real token")
    per_row = peak_memory.sum(0) / (num_layers * num_tokens.clamp_min(1))  # [b]
    return eps * per_row[has_tokens].mean()


def memory_loss(
    masks: Sequence[torch.Tensor] | torch.Tensor,
    padding_mask: torch.Tensor | None = None,
    eps: float = DEFAULT_EPS,
    tau: float = DEFAULT_TAU,
) -> torch.Tensor:
    """The auxiliary loss ``L_mem`` (to be added to the LM loss) from every layer's ``F``.

    ``masks``: one ``F`` ``[b, n, n]`` per layer (or a ``[L, b, n, n]`` tensor). ``padding_mask``
    ``[b, n]`` (1/True = real token; default: none padded). See the module docstring for the formula
    and how padding is handled.
    """
    masks = torch.stack(list(masks)) if not isinstance(masks, torch.Tensor) else masks
    if masks.ndim != 4 or masks.shape[-1] != masks.shape[-2]:
        raise ValueError(f"masks must be [layers, batch, n, n], got {tuple(masks.shape)}")
    _, b, n, _ = masks.shape
    if padding_mask is None:
        padding_mask = torch.ones(b, n, dtype=torch.bool, device=masks.device)
    real = padding_mask.to(device=masks.device, dtype=torch.bool)
    if real.shape != (b, n):
        raise ValueError(f"padding_mask must be [{b}, {n}], got {tuple(real.shape)}")
    visible = real[:, None, :] & real[:, :, None]  # [b, n, n] padding keys and padding queries drop out
    peaks = effective_memory(masks, visible, tau).amax(-1)  # [L, b]; padding rows have M = 0 <= real rows
    return memory_penalty(peaks, real.sum(-1), eps)

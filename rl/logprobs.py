"""Per-token log-probs of completions under the DA mask: the trainer's side of docs/ARCHITECTURE.md,
contract 1: one visibility function.

GRPO's importance ratio ``exp(logp_new - logp_old)`` is only meaningful if the trainer computes
``logp`` under the attention the rollout engine used. This module packs a batch the way TRL does
(prompts left-padded, completions right-padded), builds the mask from each completion's
:class:`~rollouts.masks.CompletionTrace` (the shared visibility function, never a second
definition), and runs one forward:

- ``attn_implementation="sdpa"`` (CPU and GPU): a dense boolean ``[B, 1, T, T]`` mask;
- ``attn_implementation="flex_attention"`` (GPU training): a FlexAttention ``BlockMask``.

``position_ids`` count real tokens only, so RoPE positions equal the engine's whatever the padding.
The log-prob of ``g_j`` comes from the logits of position ``prompt_len + j - 1``: the row whose mask is
the state after ``g_0..g_{j-1}``, exactly the forward that predicted ``g_j`` in the engine.

Group-shared prompts (:func:`shared_completion_logps`, ``grpo.share_prompt``): the rows of a batch that
share a prompt (a GRPO group, or the part of one a micro-batch holds) become one row
``[prompt | c_1 | ... | c_k]``, so the prompt runs once instead of ``k`` times. Completion ``i`` reads the
prompt under its own mode states and its own tokens only (:func:`~rollouts.masks.shared_mask_batch`), its
positions restart at the prompt length, and its first token is predicted by the last prompt row: every
log-prob is the per-completion forward's, and autograd sums the ``k`` completions' gradients into the one
prompt copy, as the ``k`` repeated rows did. Selective Attention models share too: their ``F`` sums over
every earlier row, so the forward is told which completion each position belongs to
(:class:`~rollouts.selective.attention.AttentionState` ``branches``) and each completion sums the prompt's
rows and its own, and replays its KV budgets from the state the prompt left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rollouts.masks import (
    CompletionTrace,
    MaskBatch,
    block_training_mask,
    dense_training_mask,
    mask_batch,
    shared_mask_batch,
)
from rollouts.selective.constants import SELECTIVE


@dataclass(frozen=True)
class PackedBatch:
    """A TRL-style padded batch with its DA mask."""

    input_ids: torch.Tensor  # [B, P + C]: prompts left-padded to P, completions right-padded to C
    attention_mask: object  # [B, 1, T, T] bool tensor, or a BlockMask
    position_ids: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, C] bool: real completion tokens
    prompt_width: int  # P


def da_attention(
    traces: Sequence[CompletionTrace],
    prompt_starts: Sequence[int],
    seq_len: int,
    attn_implementation: str = "sdpa",
    device: str | torch.device = "cpu",
) -> tuple[object, torch.Tensor]:
    """``(attention_mask, position_ids)`` for rows laid out as ``[pad] prompt completion [pad]``.

    ``prompt_starts[b]`` is where row ``b``'s prompt begins. The mask is the form
    ``attn_implementation`` needs (see the module docstring); ``position_ids`` ``[B, T]`` number real
    tokens from 0, as the engine does.
    """
    batch = mask_batch(traces, prompt_starts, seq_len)
    return attention_form(batch, attn_implementation, device), batch.position_ids.to(device)


def attention_form(batch: MaskBatch, attn_implementation: str, device: str | torch.device = "cpu"):
    """The mask ``attn_implementation`` reads: a BlockMask for flex, a dense bool (SDPA, Selective
    Attention) or additive float (eager) ``[B, 1, T, T]`` otherwise."""
    if attn_implementation == "flex_attention":
        return block_training_mask(batch, device=device)
    if attn_implementation in ("sdpa", "eager", SELECTIVE):  # Selective Attention reads the bool mask
        mask = dense_training_mask(batch).to(device)
        if attn_implementation == "eager":  # eager adds the mask to the logits: it needs a float mask
            mask = torch.zeros(mask.shape, device=device).masked_fill_(~mask, torch.finfo(torch.float32).min)
        return mask
    raise ValueError(
        f"attn_implementation must be 'sdpa', 'eager' or 'flex_attention', got {attn_implementation!r}"
    )


def pack(
    traces: Sequence[CompletionTrace],
    completions: Sequence[Sequence[int]],
    pad_token_id: int,
    attn_implementation: str = "sdpa",
    device: str | torch.device = "cpu",
) -> PackedBatch:
    """Pad prompts left and completions right, and build the matching DA mask."""
    if len(traces) != len(completions):
        raise ValueError(f"{len(traces)} traces but {len(completions)} completions")
    for i, (trace, ids) in enumerate(zip(traces, completions)):
        if len(trace.row_state) != len(ids):
            raise ValueError(
                f"row {i}: trace covers {len(trace.row_state)} tokens, completion has {len(ids)}"
            )
    width = max(t.layout.prompt_len for t in traces)
    c_width = max((len(c) for c in completions), default=0)
    input_ids = torch.full((len(traces), width + c_width), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros(len(traces), c_width, dtype=torch.bool)
    starts = []
    for b, (trace, ids) in enumerate(zip(traces, completions)):
        start = width - trace.layout.prompt_len
        starts.append(start)
        input_ids[b, start:width] = torch.tensor(trace.layout.input_ids)
        input_ids[b, width : width + len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        completion_mask[b, : len(ids)] = True
    mask, position_ids = da_attention(traces, starts, width + c_width, attn_implementation, device)
    return PackedBatch(input_ids.to(device), mask, position_ids, completion_mask.to(device), width)


def forward_completion_logps(
    model,
    input_ids: torch.Tensor,  # [B, P + C], completions right-padded to C
    attention_mask,
    position_ids: torch.Tensor,  # [B, P + C]
    completion_width: int,  # C
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    heed_state=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one forward behind every trainer log-prob: ``([B, C] log-probs, [B, C] entropies or None)`` of
    the last ``C`` tokens of each row (padding positions get arbitrary values; callers mask them).

    ``heed_state``: a Selective Attention model's :class:`~rollouts.selective.attention.AttentionState`
    (KV budgets to replay, L_mem's peak memory to record), passed to the forward when given.

    Logits are kept for the last ``C + 1`` positions only: position ``P + j - 1`` predicts completion
    token ``j``, and no prompt row pays for the vocabulary projection.
    """
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=completion_width + 1,
        use_cache=False,
        **({"heed_state": heed_state} if heed_state is not None else {}),
    ).logits
    logits = logits[:, :-1].float() / temperature  # [B, C, V]
    logps = selective_log_softmax(logits, input_ids[:, input_ids.size(1) - completion_width :])
    return logps, entropy_from_logits(logits) if compute_entropy else None


def completion_logprobs(model, packed: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
    """``[B, C]`` log-probs of each completion token under the DA mask (0 at padding)."""
    logps, _ = forward_completion_logps(
        model,
        packed.input_ids,
        packed.attention_mask,
        packed.position_ids,
        packed.completion_mask.shape[1],
        temperature=temperature,
    )
    return logps.masked_fill(~packed.completion_mask, 0.0)


def masked_completion_logps(
    model,
    input_ids: torch.Tensor,  # [B, P + C]: TRL's batch, prompts left-padded, completions right-padded
    traces: Sequence[CompletionTrace],
    completion_width: int,  # C (TRL's logits_to_keep)
    *,
    temperature: float = 1.0,
    attn_implementation: str = "sdpa",
    compute_entropy: bool = False,
    heed_state=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forward_completion_logps` for a batch someone else padded: row ``b`` is laid out by
    ``traces[b]``, whose prompt must be the tokens just before the completion columns."""
    seq_len = input_ids.size(1)
    starts = prompt_starts(input_ids, traces, completion_width)
    mask, position_ids = da_attention(traces, starts, seq_len, attn_implementation, input_ids.device)
    return forward_completion_logps(
        model,
        input_ids,
        mask,
        position_ids,
        completion_width,
        temperature=temperature,
        compute_entropy=compute_entropy,
        heed_state=heed_state,
    )


def prompt_starts(
    input_ids: torch.Tensor,  # [B, P + C]
    traces: Sequence[CompletionTrace],
    completion_width: int,  # C
) -> list[int]:
    """Where each row's prompt begins in a TRL batch, after checking that its tokens are its trace's
    prompt and that its trace fits the ``C`` completion columns."""
    width = input_ids.size(1) - completion_width
    starts = []
    for b, trace in enumerate(traces):
        prompt = trace.layout.input_ids
        start = width - len(prompt)
        if start < 0 or not torch.equal(
            input_ids[b, start:width].cpu(), torch.as_tensor(prompt, dtype=input_ids.dtype)
        ):
            raise RuntimeError(
                f"row {b}: the batch's prompt tokens are not the ones its DA trace was built on"
            )
        if len(trace.row_state) > completion_width:
            raise RuntimeError(
                f"row {b}: trace covers {len(trace.row_state)} tokens > {completion_width} kept"
            )
        starts.append(start)
    return starts


def prompt_groups(traces: Sequence[CompletionTrace]) -> list[list[int]]:
    """Row indices grouped by prompt (equal layouts), in order of first appearance.

    >>> from types import SimpleNamespace as N
    >>> prompt_groups([N(layout="a"), N(layout="b"), N(layout="a")])
    [[0, 2], [1]]
    """
    groups: dict[object, list[int]] = {}
    for b, trace in enumerate(traces):
        groups.setdefault(trace.layout, []).append(b)
    return list(groups.values())


@dataclass(frozen=True)
class SharedBatch:
    """A TRL batch repacked as one row per prompt, ``[pad] prompt c_1 .. c_k [pad]``, with its DA mask."""

    input_ids: torch.Tensor  # [R, T]: R distinct prompts, left-padded to W, completions packed, right-padded
    attention_mask: object  # [R, 1, T, T] bool tensor, or a BlockMask
    position_ids: torch.Tensor  # [R, T]: each completion restarts at its prompt's length
    row: torch.Tensor  # [B] int64: the packed row holding completion b
    logit_index: torch.Tensor  # [B, C] int64: kept-logit column that predicts token j of completion b
    real: torch.Tensor  # [B, C] bool: j < the completion's length (its trace)
    logits_to_keep: int  # T - W + 1: every completion column of every row, and the last prompt row
    valid: torch.Tensor  # [R, T] bool: real (non-padding) positions
    branches: torch.Tensor  # [R, T] int64: 0 on the prompt, j on the row's j-th completion, -1 after
    branch: torch.Tensor  # [B] int64: completion b's j in its row

    def completion_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The packed rows' kept logits ``[R, logits_to_keep, V]`` back in TRL's layout, ``[B, C, V]``.

        Columns repeat (column 0 predicts the first token of every completion of its row; padding
        columns read column 0 too), so the backward adds several gradients into one column. It is an
        ``index_select``, whose backward (``index_add_``) adds them in index order on CPU: advanced
        indexing's backward (``index_put_`` with accumulate) adds them with parallel atomics there,
        in whatever order the threads reach them, and the same step's gradients then differ from run
        to run in the last bits, which sampling turns into different GRPO runs. (On CUDA both add with
        atomics.)
        """
        rows, keep, vocab = logits.shape
        flat = (self.row[:, None] * keep + self.logit_index).reshape(-1)  # [B * C] rows of [R * keep, V]
        return logits.reshape(rows * keep, vocab).index_select(0, flat).view(*self.logit_index.shape, vocab)


def share_prompts(
    input_ids: torch.Tensor,  # [B, P + C]: TRL's batch, prompts left-padded, completions right-padded
    traces: Sequence[CompletionTrace],
    completion_width: int,  # C
    attn_implementation: str = "sdpa",
) -> SharedBatch:
    """Repack TRL's rows into one row per distinct prompt (see the module docstring).

    Kept logits are the columns ``W - 1 .. T - 1`` (``W``: the widest prompt): column 0 is every row's last
    prompt row, which predicts each completion's first token; token ``j > 0`` of a completion starting at
    column ``o`` of the row is predicted by column ``o - W + j``.
    """
    starts = prompt_starts(input_ids, traces, completion_width)
    groups = prompt_groups(traces)
    lengths = [len(t.row_state) for t in traces]
    width = max(traces[g[0]].layout.prompt_len for g in groups)
    seq_len = max(width + sum(lengths[b] for b in g) for g in groups)
    cpu_ids = input_ids.cpu()
    tail = input_ids.size(1) - completion_width  # where TRL's completion columns start
    packed = torch.zeros(len(groups), seq_len, dtype=input_ids.dtype)
    row = torch.empty(len(traces), dtype=torch.long)
    branch = torch.empty(len(traces), dtype=torch.long)
    first = torch.empty(len(traces), dtype=torch.long)  # kept-logit column of each completion's first token
    row_starts = []
    for r, group in enumerate(groups):
        p = traces[group[0]].layout.prompt_len
        row_starts.append(width - p)
        packed[r, width - p : width] = cpu_ids[group[0], starts[group[0]] : tail]
        offset = width
        for j, b in enumerate(group, start=1):
            packed[r, offset : offset + lengths[b]] = cpu_ids[b, tail : tail + lengths[b]]
            row[b], branch[b], first[b] = r, j, offset - width
            offset += lengths[b]
    j = torch.arange(completion_width)
    real = j[None, :] < torch.tensor(lengths)[:, None]  # [B, C]
    logit_index = torch.where((j[None, :] > 0) & real, first[:, None] + j[None, :], 0)  # token 0: column 0
    batch = shared_mask_batch([[traces[b] for b in g] for g in groups], row_starts, seq_len)
    device = input_ids.device
    return SharedBatch(
        packed.to(device),
        attention_form(batch, attn_implementation, device),
        batch.position_ids.to(device),
        row.to(device),
        logit_index.to(device),
        real.to(device),
        seq_len - width + 1,
        batch.valid.to(device),
        batch.branches.to(device),
        branch.to(device),
    )


def shared_completion_logps(
    model,
    input_ids: torch.Tensor,  # [B, P + C]: TRL's batch, prompts left-padded, completions right-padded
    traces: Sequence[CompletionTrace],
    completion_width: int,  # C (TRL's logits_to_keep)
    *,
    temperature: float = 1.0,
    attn_implementation: str = "sdpa",
    compute_entropy: bool = False,
    heed_state=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`masked_completion_logps` with one prompt forward per distinct prompt: the same ``[B, C]``
    log-probs (and entropies), 0 past each completion's end.

    ``heed_state``: a Selective Attention model's :class:`~rollouts.selective.attention.AttentionState`
    (budgets, ``tau``), as for :func:`masked_completion_logps`; see :func:`shared_forward`."""
    shared = share_prompts(input_ids, traces, completion_width, attn_implementation)
    targets = input_ids[:, input_ids.size(1) - completion_width :]  # [B, C]
    return shared_forward(
        model,
        shared,
        targets,
        temperature=temperature,
        compute_entropy=compute_entropy,
        heed_state=heed_state,
    )


def shared_forward(
    model,
    shared: SharedBatch,
    targets: torch.Tensor,  # [B, C]: the completion tokens, TRL's columns
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    heed_state=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward over the packed rows, its kept logits gathered back to TRL's ``[B, C]`` layout.

    With ``heed_state`` (a Selective Attention model) the state is told the packed rows' padding and which
    completion each position belongs to (``padding_mask``, ``branches``), so each completion accumulates
    ``F`` and replays its budgets from the prompt alone; afterwards its ``peak_memory`` is per completion,
    ``[B]`` per layer in TRL's row order, as a forward over one row per completion records it.
    """
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    if heed_state is not None:
        heed_state.padding_mask, heed_state.branches = shared.valid, shared.branches
    logits = model(
        input_ids=shared.input_ids,
        attention_mask=shared.attention_mask,
        position_ids=shared.position_ids,
        logits_to_keep=shared.logits_to_keep,
        use_cache=False,
        **({"heed_state": heed_state} if heed_state is not None else {}),
    ).logits  # [R, T - W + 1, V]
    if heed_state is not None:
        for layer, peaks in heed_state.peak_memory.items():  # [R, k] -> [B]
            heed_state.peak_memory[layer] = peaks[shared.row, shared.branch - 1]
    logits = shared.completion_logits(logits).float() / temperature  # [B, C, V]
    logps = selective_log_softmax(logits, targets).masked_fill(~shared.real, 0.0)
    if not compute_entropy:
        return logps, None
    return logps, entropy_from_logits(logits).masked_fill(~shared.real, 0.0)

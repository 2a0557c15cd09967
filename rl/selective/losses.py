"""Training a Selective Attention model: the LM loss, the memory loss L_mem, and the loss under KV budgets.

The model change itself (the registered attention function, the ``selective_attention: true`` config
flag) is :mod:`rollouts.selective.attention`, shared with the rollout side; the math is
:mod:`rollouts.selective.mask`. This module is what a training loop calls:

- :func:`forward_with_memory_loss` -- one forward that also returns ``L_mem`` (paper eq. 2), the auxiliary
  term added to the LM loss in SFT / pre-training and, with its own weight, to the GRPO loss::

      outputs, l_mem = forward_with_memory_loss(model, input_ids, attention_mask, labels=labels)
      loss = outputs.loss + l_mem          # l_mem already carries eps (paper: 0.1)

  Each layer records only its peak effective memory ``max_i M_i`` per row (``[b]``) during the forward,
  never the ``[b, n, n]`` mask, so the loss costs no memory beyond what the backward keeps anyway.
- :func:`loss_under_budgets` -- the mean next-token loss when every layer holds at most ``K_l`` tokens,
  with the eviction replayed inside one forward (exactly what decoding with a compacted cache gives); the
  objective of the budget search (:mod:`rl.selective.budgets`) on plain text.
- :func:`completion_loss_under_budgets` -- the same for a Declarative Attention policy: the loss of gold
  completions under their DA mask (the SFT objective), the objective of ``heed budgets``.
- :func:`selection_weight` -- the fade-in of head 0's selection over training steps (SFT and pretraining).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from rollouts.selective.attention import AttentionState
from rollouts.selective.eviction import check_budgets
from rollouts.selective.mask import DEFAULT_EPS, DEFAULT_TAU, memory_penalty


def selection_weight(step: int, from_step: int, ramp_steps: int) -> float:
    """How much head 0's selection masks at training step ``step`` (:class:`AttentionState`'s
    ``selection_weight``): nothing before ``from_step``, then rising linearly to all of it over
    ``ramp_steps``.

    Switched on at full weight, head 0 masks what the other heads need: over a base pretrained without
    Selective Attention it masks what its attention reads, and in a model built with it, Qwen3's QK-norm
    makes head 0's logits O(1) from initialisation, so each key collects an ``F`` of about 0.4 per later
    token and the context is masked before the model has learned to read it. Faded in, the model learns
    to read first (``selective.selection_from_step`` in `heed train`'s SFT and in `heed pretrain`).

    >>> [selection_weight(s, from_step=250, ramp_steps=100) for s in (0, 250, 300, 350, 400)]
    [0.0, 0.0, 0.5, 1.0, 1.0]
    >>> selection_weight(0, from_step=0, ramp_steps=0)
    1.0
    """
    if step < from_step:
        return 0.0
    return min(1.0, (step - from_step) / ramp_steps) if ramp_steps else 1.0


def _require_selective(model) -> None:
    if not getattr(model.config, "selective_attention", False):
        raise ValueError(
            "this is not a Selective Attention model (config.selective_attention is not set); "
            "build it with rollouts.selective.attention.enable_selective_attention(config)"
        )


def forward_with_memory_loss(
    model,
    input_ids: torch.Tensor,  # [b, n]
    attention_mask: torch.Tensor | None = None,  # [b, n] 1 = real token, or None
    *,
    padding_mask: torch.Tensor | None = None,  # [b, n], only needed with a 4D attention_mask
    eps: float = DEFAULT_EPS,
    tau: float = DEFAULT_TAU,
    selection_weight: float = 1.0,
    **forward_kwargs,
):
    """``(outputs, l_mem)``: the model's forward and ``eps * sum_l max_i M_i^l / (L * n_nonpad)``.

    ``forward_kwargs`` go to the model (``labels``, ``position_ids``, ...). Padding follows
    :func:`rollouts.selective.mask.memory_loss`: padding keys are not memory, padding queries are left out of
    the max (transformers' padding masks hide padding keys from every real query, and a padding query's
    ``M`` never exceeds that of the real token before it), and ``n_nonpad`` counts real tokens. A 4D
    ``attention_mask`` (e.g. Declarative Attention's) goes to the model as is; pass the 2D padding mask
    as ``padding_mask`` then. ``selection_weight``: :class:`AttentionState`'s (below 1 while Selective
    Attention fades in over a model pretrained without it).
    """
    _require_selective(model)
    state = AttentionState(tau=tau, selection_weight=selection_weight)
    outputs = model(input_ids, attention_mask=attention_mask, heed_state=state, **forward_kwargs)
    if padding_mask is None:
        padding_mask = attention_mask if attention_mask is not None and attention_mask.ndim == 2 else None
    num_tokens = (
        padding_mask.bool().sum(-1)
        if padding_mask is not None
        else torch.full((input_ids.shape[0],), input_ids.shape[1], device=input_ids.device)
    )
    return outputs, recorded_memory_loss(state, num_tokens, eps)


def recorded_memory_loss(state: AttentionState, num_tokens: torch.Tensor, eps: float = DEFAULT_EPS):
    """``L_mem`` from the peak memory a forward recorded in ``state`` (``tau`` set), ``num_tokens`` ``[b]``
    real tokens per row: for trainers that run the forward themselves (GRPO's log-prob forward)."""
    if not state.peak_memory:
        raise ValueError("the forward recorded no peak memory: run it with AttentionState(tau=...)")
    peaks = torch.stack([state.peak_memory[layer] for layer in sorted(state.peak_memory)])  # [L, b]
    return memory_penalty(peaks, num_tokens, eps)


@torch.no_grad()
def loss_under_budgets(
    model,
    batches: Iterable[torch.Tensor | tuple[torch.Tensor, torch.Tensor]],
    budgets: int | Sequence[int] | None,
) -> float:
    """Mean next-token cross-entropy (nats per predicted token) over ``batches`` with every layer ``l``
    holding at most ``budgets[l]`` tokens (``None``: no eviction).

    A batch is ``input_ids`` ``[b, n]`` or ``(input_ids, padding_mask)``. Budgets apply to Selective
    Attention models (the eviction is replayed from ``F`` inside one forward).
    """
    _require_selective(model)
    if budgets is not None:
        budgets = check_budgets(budgets, model.config.num_hidden_layers)
    total, count = 0.0, 0
    for batch in batches:
        input_ids, padding_mask = batch if isinstance(batch, (tuple, list)) else (batch, None)
        state = AttentionState(budgets=budgets, padding_mask=padding_mask)
        kwargs = {}
        if padding_mask is not None:
            kwargs = {
                "attention_mask": padding_mask,
                "position_ids": (padding_mask.long().cumsum(-1) - 1).clamp_min(0),
            }
        logits = model(input_ids, heed_state=state, **kwargs).logits[:, :-1].float()  # [b, n-1, V]
        targets = input_ids[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [b, n-1]
        if padding_mask is not None:
            real = padding_mask[:, 1:].bool() & padding_mask[:, :-1].bool()
            nll = nll[real]
        total += float(nll.sum())
        count += nll.numel()
    if count == 0:
        raise ValueError("loss_under_budgets got no tokens to predict")
    return total / count


@torch.no_grad()
def completion_loss_under_budgets(
    model, batches: Iterable[dict], budgets: int | Sequence[int] | None
) -> float:
    """Mean cross-entropy of the completion tokens (nats per token) -- the SFT objective, under each row's
    Declarative Attention mask -- with every layer holding at most ``budgets[l]`` tokens (``None``: no
    eviction). ``batches``: :class:`rl.sft.DACollator` batches built with ``padding_mask=True``."""
    _require_selective(model)
    if budgets is not None:
        budgets = check_budgets(budgets, model.config.num_hidden_layers)
    total, count = 0.0, 0
    for batch in batches:
        inputs = dict(batch)
        state = AttentionState(budgets=budgets, padding_mask=inputs.pop("padding_mask"))
        tokens = int((inputs["labels"][:, 1:] != -100).sum())  # the model shifts the labels by one
        total += float(model(**inputs, heed_state=state).loss) * tokens
        count += tokens
    if count == 0:
        raise ValueError("completion_loss_under_budgets got no completion tokens")
    return total / count

"""Selective Attention inside Hugging Face decoder models (Llama, Qwen2, Qwen3; GQA included).

The model change is one attention function, registered with transformers' attention registry under
:data:`SELECTIVE` (``"heed_selective"``). Per layer it computes head 0's raw logits ``q_0 k_0^T / sqrt(d_k)``
(query head 0 and the KV head it shares under GQA), turns them into the accumulated mask ``F``
(:mod:`rollouts.selective.mask`, the single source of truth) under the incoming attention mask, and runs SDPA
with ``-F`` as an additive bias, so every head's logits become ``logits - F`` before the softmax (paper
eq. 1). The mask transformers hands in (causal and padding, or a Declarative Attention 4D bool or float mask)
is respected twice: a key a query cannot see is neither attended nor selected. :data:`STANDARD`
(``"heed_standard"``) is the same function without ``F``: the baseline model of eviction comparisons, which
can report its attention probabilities to H2O / TOVA scoring.

It lives in ``rollouts`` because both sides need the same function: the reference rollout engine and the
trainer's log-prob forward (``rl/selective/losses.py`` adds the training side: L_mem, budget search).

Using it (one call registers the functions and teaches ``from_pretrained`` the config flag)::

    import rollouts.selective.attention as sa
    sa.register_selective_attention()                            # once per process; kernel="triton" on CUDA
    config = sa.enable_selective_attention(Qwen3Config(...))    # selective_attention: true
    model = Qwen3ForCausalLM(config)                             # config._attn_implementation == "heed_selective"
    model.save_pretrained(path)                                  # config.json keeps "selective_attention": true
    model = AutoModelForCausalLM.from_pretrained(path)           # Selective Attention again

``from_pretrained`` of a checkpoint whose config says ``selective_attention: true`` picks this function once
:func:`register_selective_attention` has run (it wraps ``PreTrainedModel.get_correct_attn_implementation``,
the place every model asks which attention to use). Before that the flag is ignored and the model runs
standard attention, so whatever builds or loads a Selective Attention model registers first: the training
recipe, the reference engine, the budget search. Importing this module changes nothing in transformers, so a
run without Selective Attention runs on transformers as it is. Asking for any other implementation on such a
checkpoint is an error, as is the flag on an unsupported architecture or with sliding-window layers.

Decoding with a KV cache needs ``F``'s per-key running sums from earlier steps, kept in one
:class:`AttentionState` per generation: pass it to the forward,
``model(ids, past_key_values=cache, heed_state=state)``, or bind it around ``generate`` (which rejects
unknown keyword arguments)::

    with sa.bind_state(model):
        model.generate(ids, max_new_tokens=32)          # greedy or sampling; beam search is unsupported

A forward with an empty cache (a prefill or a training forward) needs no state; the state is also how a
forward records L_mem's peak memory, replays KV eviction under budgets, and reports attention.

Memory, per layer: ``S``, ``F`` and the bias are ``[b, q, kv]`` each (float32 for ``S``/``F``; ``S`` is
kept for the backward); SDPA's CPU math path materialises the logits and probabilities ``[b, h, q, kv]``
as eager attention does, while on GPUs the memory-efficient SDPA kernel takes the bias without the
``[b, h, q, kv]`` logits. Replayed eviction adds a ``[b, n, n]`` bool keep mask per layer. Registered
with ``kernel="triton"``, a prefill on CUDA runs :mod:`rollouts.selective.kernel` instead, which never
materialises ``F`` (per-key column sums per query block), forward and backward
(:class:`FusedSelectiveAttention`); L_mem's effective memory comes out of the kernel too. Forwards that
need ``F`` itself (replayed budgets, attention reports) and decoding steps stay on the dense path.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F_nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .constants import EVICTION_GRADIENTS, KERNEL_ENV, KERNELS, SELECTIVE, STANDARD, SUPPORTED_MODEL_TYPES
from .eviction import evict_index, selective_keep_mask
from .mask import MaskAccumulator, accumulated_mask, causal_visibility, effective_memory


@dataclass
class AttentionState:
    """What the attention functions carry across forward calls of one batch, and what they record.

    Pass it as ``heed_state=`` to the model's forward (or bind it with :func:`bind_state`). Every field is
    optional; a training forward needs none of them.

    - ``accumulators``: per layer, the running per-key sums of ``S`` (the next query's ``F`` row); needed
      to decode Selective Attention with a KV cache. A forward with an empty cache starts them afresh.
    - ``tau``: when set, record ``peak_memory[layer]`` ``[b]``, the peak effective memory ``max_i M_i``
      (:func:`rollouts.selective.mask.effective_memory`), for L_mem.
    - ``budgets``: per-layer KV budgets. In a full forward (no cache) they are replayed: each query sees only
      the keys :func:`rollouts.selective.eviction.selective_keep_mask` says its layer still holds, as a
      decoding loop with eviction would. ``padding_mask`` ``[b, n]`` (True = real token) tells it which tokens
      enter the cache; without it a token is real when it may attend to itself (true of transformers' padding
      masks). Decoding over a KV cache (one token per forward) continues from there: ``held[layer]``
      ``[b, kv]`` is what the layer holds, and each arriving token first evicts the held token with the
      largest ``F`` once the layer holds ``K_l`` -- eviction as masking over a cache that keeps every key (the
      paged-engine form; :mod:`rollouts.selective.decode` is the compacting form). Both forms take the same
      decisions, by the same :func:`rollouts.selective.eviction.evict_index`; the replay over a whole
      sequence applies the same rule in numpy (``replay_evictions``, tested against a brute-force list
      reference and, end to end, against the decoding loop).
    - ``record_attention``: record ``attention[layer]`` ``[b, q, kv]``, the softmax probabilities averaged
      over heads (the H2O / TOVA eviction scores).
    - ``kv_reads[layer]`` ``[b, q]``: the keys each query read, always recorded.
    - ``selection_weight``: head 0's selection logits are scaled by it before the ReLU, so ``S`` and ``F``
      scale with it (``relu(w x) = w relu(x)`` for ``w >= 0``): 0 is standard attention, 1 the paper's. A
      training forward over a model pretrained without Selective Attention fades it in with it
      (``selective.selection_from_step``); decoding and eviction always run at 1.
    - ``branches`` ``[b, n]``: a full forward over rows that pack a shared prefix and its continuations
      (0 on the prefix, ``j`` on continuation ``j``, -1 on padding after them: a GRPO group's prompt run once,
      ``rl/logprobs.py``). Each continuation accumulates ``F`` and replays eviction from the prefix alone
      (:func:`rollouts.selective.mask.branched_shifted_cumsum`), as in a row of its own; ``peak_memory[layer]``
      is then ``[b, k]``, continuation ``j``'s peak over the prefix and its own rows in column ``j - 1``.
    - ``eviction_gradient``: with replayed ``budgets``, ``"none"`` masks evicted keys out of the forward and
      the backward alike, so no gradient reaches a key once evicted; ``"straight_through"`` keeps the forward
      evicted (the same log-probs) and takes the backward through the same attention without eviction
      (``soft + (evicted - soft).detach()``): an evicted key that would have raised the objective gets a
      gradient lowering its ``F`` (the eviction rule's score), so the layer learns to hold it. Biased, as
      straight-through estimators are, and one more attention per layer in the update.
    """

    accumulators: dict[int, MaskAccumulator] = field(default_factory=dict)
    tau: float | None = None
    peak_memory: dict[int, torch.Tensor] = field(default_factory=dict)
    budgets: tuple[int, ...] | None = None
    padding_mask: torch.Tensor | None = None
    held: dict[int, torch.Tensor] = field(default_factory=dict)
    record_attention: bool = False
    attention: dict[int, torch.Tensor] = field(default_factory=dict)
    kv_reads: dict[int, torch.Tensor] = field(default_factory=dict)
    branches: torch.Tensor | None = None
    selection_weight: float = 1.0
    eviction_gradient: str = "none"

    def __post_init__(self):
        if self.selection_weight < 0:
            raise ValueError(f"AttentionState.selection_weight must be >= 0, got {self.selection_weight}")
        if self.eviction_gradient not in EVICTION_GRADIENTS:
            raise ValueError(
                f"AttentionState.eviction_gradient must be one of {', '.join(EVICTION_GRADIENTS)}, "
                f"got {self.eviction_gradient!r}"
            )


def _mask_view(attention_mask: torch.Tensor, kv: int) -> torch.Tensor:
    """``[b|1, q, kv]``: an HF attention mask (``[b, 1, q, kv]`` or ``[b, q, kv]``) without its head axis."""
    return attention_mask[:, 0, :, :kv] if attention_mask.ndim == 4 else attention_mask[..., :kv]


def _visible_and_bias(attention_mask: torch.Tensor | None, q: int, kv: int, device) -> tuple:
    """``visible`` ``[b|1, q, kv]`` bool and the additive part of a float mask (or 0), from an HF mask."""
    causal = causal_visibility(q, kv, device)[None]
    if attention_mask is None:
        return causal, 0.0
    mask = _mask_view(attention_mask, kv)
    if mask.dtype == torch.bool:
        return causal & mask, 0.0
    # An additive float mask: 0 (or a bias) where allowed, a large negative number where not.
    allowed = mask > torch.finfo(mask.dtype).min / 2
    return causal & allowed, torch.where(allowed, mask.float(), 0.0)


def _selective_mask(module, query, key, visible, scaling, state: AttentionState | None) -> tuple:
    """``F`` ``[b, q, kv]`` of this layer from head 0, and ``visible`` narrowed by replayed eviction."""
    q_len, kv_len = query.shape[2], key.shape[2]
    layer = module.layer_idx
    head0 = head0_logits(query, key, scaling)  # [b, q, kv]
    if state is not None and state.selection_weight != 1.0:
        head0 = head0 * state.selection_weight
    if state is not None and state.branches is not None:
        return _branched_mask(state, layer, head0, visible)
    if q_len == kv_len:  # nothing cached before these queries: the sequence starts here
        accumulator = MaskAccumulator()
        if state is not None:
            state.accumulators[layer] = accumulator
    elif state is None or layer not in state.accumulators:
        raise ValueError(
            "Selective Attention over a KV cache needs the running mask of the earlier tokens: pass "
            "heed_state=AttentionState() (one per generation) to the forward, or wrap generate() in "
            "`with rollouts.selective.attention.bind_state(model):`"
        )
    else:
        accumulator = state.accumulators[layer]
    mask = accumulator.step(head0, visible)
    if state is None:
        return mask, visible
    if state.tau is not None:
        state.peak_memory[layer] = effective_memory(mask, visible, state.tau).amax(-1)
    if state.budgets is not None:
        budget = _budget(state, layer)
        if q_len == kv_len:
            keep = selective_keep_mask(mask, budget, _real_tokens(state, visible, len(mask)))  # [b, n, n]
            state.held[layer] = keep[:, -1]
        else:
            keep = _arrive(state, layer, mask)[:, None]  # [b, 1, kv]
        visible = visible & keep
    return mask, visible


def _branched_mask(state: AttentionState, layer: int, head0: torch.Tensor, visible: torch.Tensor) -> tuple:
    """:func:`_selective_mask` over rows packing a prefix and its continuations (``state.branches``)."""
    branches = state.branches
    if head0.shape[-2] != head0.shape[-1] or branches.shape != head0.shape[:2]:
        raise ValueError(
            f"AttentionState.branches {tuple(branches.shape)} needs a full forward over the same rows "
            f"(queries = keys = {head0.shape[-1]}), not decoding over a cache"
        )
    mask = accumulated_mask(head0, visible, branches)
    if state.tau is not None:
        memory = effective_memory(mask, visible, state.tau)  # [b, n]
        prefix = branches == 0
        state.peak_memory[layer] = torch.stack(
            [memory.masked_fill(~(prefix | (branches == j)), -torch.inf).amax(-1)
             for j in range(1, max(int(branches.max()), 1) + 1)],
            -1,
        )  # fmt: skip
    if state.budgets is not None:
        keep = selective_keep_mask(
            mask, _budget(state, layer), _real_tokens(state, visible, len(mask)), branches
        )
        visible = visible & keep
    return mask, visible


def _budget(state: AttentionState, layer: int) -> int:
    """``layer``'s budget, refused clearly when the state holds fewer budgets than the model has layers."""
    if layer >= len(state.budgets):
        raise ValueError(f"AttentionState has {len(state.budgets)} budgets but the model has layer {layer}")
    return state.budgets[layer]


def _real_tokens(state: AttentionState, visible: torch.Tensor, batch: int) -> torch.Tensor:
    """``[b, n]``: which keys of a full forward are real tokens: the state's padding mask, else the keys that
    see themselves (``visible`` ``[b or 1, n, n]``)."""
    if state.padding_mask is not None:
        return state.padding_mask
    return visible.diagonal(dim1=-2, dim2=-1).expand(batch, visible.shape[-1])


def _arrive(state: AttentionState, layer: int, mask: torch.Tensor) -> torch.Tensor:
    """``[b, kv]``: what ``layer`` holds once the one arriving token (``mask`` ``[b, 1, kv]``, its ``F``
    row) has evicted the most-masked held token if the layer was full, and entered."""
    if mask.shape[1] != 1:
        raise ValueError("decoding under KV budgets takes one token per forward")
    held = state.held.get(layer)
    if held is None or held.shape[-1] != mask.shape[-1] - 1:
        raise ValueError(
            "decoding under KV budgets continues a prefill run with the same AttentionState (budgets set)"
        )
    held = held.clone()
    rows = torch.arange(held.shape[0], device=held.device)
    full = held.sum(-1) >= state.budgets[layer]  # [b]
    evictable = held.clone()
    evictable[rows, held.int().argmax(-1)] = False  # <BOS>: the first token held, never evicted
    victim = evict_index(mask[:, 0, :-1], evictable)
    held[rows[full], victim[full]] = False
    state.held[layer] = torch.cat([held, held.new_ones(held.shape[0], 1)], -1)
    return state.held[layer]


def head0_logits(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """``[b, q, kv]`` float32: head 0's raw logits, the selection logits of every layer."""
    return torch.matmul(query[:, 0].float(), key[:, 0].float().transpose(-1, -2)) * scaling


def _additive_mask(visible, bias, dtype) -> torch.Tensor:
    """``[b, 1, q, kv]``: ``bias`` where visible, the dtype's minimum elsewhere."""
    return torch.where(visible, bias, torch.finfo(dtype).min).to(dtype)[:, None]


def _repeat_kv(query, key, value) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value ``[b, h, kv, d]``: query head i reads KV head i // groups (GQA)."""
    groups = query.shape[1] // key.shape[1]
    return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)


def softmax_attention(query, key, value, visible, bias, scaling, dropout) -> torch.Tensor:
    """SDPA of ``logits + bias`` over the ``visible`` keys; ``[b, h, q, d]``."""
    key, value = _repeat_kv(query, key, value)
    mask = _additive_mask(visible, bias, query.dtype)
    return F_nn.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )


class FusedSelectiveAttention(torch.autograd.Function):
    """The fused Triton forward and backward of :mod:`rollouts.selective.kernel` as one autograd op.

    ``apply(query, key, value, mask, scaling, tau) -> (out [b, n, h, d], total [b, n], memory)``;
    ``mask`` ``[b, n, n]`` bool (the model's attention mask; causality is added) or None (causal);
    ``memory`` ``[b, n]`` is L_mem's effective memory when ``tau`` is set (differentiable), else None.
    Kept for the backward: the inputs, the output and a ``[b, h, n]`` log-sum-exp -- no ``[b, n, n]``
    (``mask`` is the one tensor every layer shares).
    """

    @staticmethod
    def forward(ctx, query, key, value, mask, scaling, tau):
        from .kernel import selective_forward

        out, total, memory, lse = selective_forward(query, key, value, mask, scaling, tau)
        ctx.save_for_backward(query, key, value, mask, out, lse)
        ctx.scaling, ctx.tau = scaling, tau
        ctx.mark_non_differentiable(total)
        return out, total, memory

    @staticmethod
    def backward(ctx, grad_out, grad_total, grad_memory):
        from .kernel import selective_backward

        query, key, value, mask, out, lse = ctx.saved_tensors
        grads = selective_backward(
            query, key, value, mask, out, lse, grad_out, grad_memory, ctx.scaling, ctx.tau
        )
        return *grads, None, None, None


def _use_kernel(kernel: str, query, attention_mask, dropout, state: AttentionState | None) -> bool:
    """Whether this prefill runs on the fused kernel (``kernel="triton"``).

    Only a forward over a fresh sequence on CUDA (or Triton's interpreter) with a bool mask (or none) and
    without dropout, replayed budgets, attention reporting, branches or a selection weight: those need ``F``
    or a float bias, or accumulate ``F`` in a way the kernel does not.
    """
    if kernel != "triton" or dropout or (attention_mask is not None and attention_mask.dtype != torch.bool):
        return False
    from . import kernel

    if not kernel.runs_on(query):
        return False
    return state is None or (
        state.budgets is None
        and not state.record_attention
        and state.branches is None
        and state.selection_weight == 1.0
    )


def _attention(
    module, query, key, value, attention_mask, scaling, dropout, heed_state, selective, kernel="dense"
):
    q_len, kv_len = query.shape[2], key.shape[2]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    state = heed_state if heed_state is not None else getattr(module, "heed_state", None)
    if selective and q_len == kv_len and _use_kernel(kernel, query, attention_mask, dropout, state):
        tau = state.tau if state is not None else None
        mask = None if attention_mask is None else _mask_view(attention_mask, kv_len)  # no copy per layer
        out, total, memory = FusedSelectiveAttention.apply(query, key, value, mask, scaling, tau)
        if state is not None:  # decoding continues from the prefill's running sums
            state.accumulators[module.layer_idx] = MaskAccumulator()
            state.accumulators[module.layer_idx].total = total
            visible, _ = _visible_and_bias(attention_mask, q_len, kv_len, query.device)
            state.kv_reads[module.layer_idx] = visible.sum(-1).expand(query.shape[0], q_len)
            if tau is not None:
                state.peak_memory[module.layer_idx] = memory.amax(-1)
        return out, None  # no [b, q, kv] visibility built per layer when nothing records it
    visible, bias = _visible_and_bias(attention_mask, q_len, kv_len, query.device)  # [b|1, q, kv]
    unevicted = visible
    if selective:
        mask, visible = _selective_mask(module, query, key, visible, scaling, state)
        bias = bias - mask
    if state is not None:
        state.kv_reads[module.layer_idx] = visible.sum(-1).expand(query.shape[0], q_len)
    if state is not None and state.record_attention:
        key, value = _repeat_kv(query, key, value)
        logits = torch.matmul(query, key.transpose(-1, -2)) * scaling
        probs = (logits + _additive_mask(visible, bias, query.dtype)).softmax(-1)  # [b, h, q, kv]
        state.attention[module.layer_idx] = probs.float().mean(1)
        out = torch.matmul(F_nn.dropout(probs, dropout), value)
    else:
        out = softmax_attention(query, key, value, visible, bias, scaling, dropout)
        if _straight_through(state, selective):
            soft = softmax_attention(query, key, value, unevicted, bias, scaling, dropout)
            out = soft + (out - soft).detach()  # the evicted forward, the unevicted backward
    return out.transpose(1, 2).contiguous(), None


def _straight_through(state: AttentionState | None, selective: bool) -> bool:
    """Whether this forward's backward runs through the attention without the replayed eviction."""
    return (
        selective
        and state is not None
        and state.budgets is not None
        and state.eviction_gradient == "straight_through"
        and torch.is_grad_enabled()
    )


def selective_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [b, h, q, d]
    key: torch.Tensor,  # [b, kv_heads, kv, d]
    value: torch.Tensor,  # [b, kv_heads, kv, d]
    attention_mask: torch.Tensor | None,  # [b, 1, q, kv] bool or additive float, or None (causal)
    scaling: float | None = None,
    dropout: float = 0.0,
    heed_state: AttentionState | None = None,
    kernel: str = "dense",
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``softmax(Q K^T * scaling - F + mask) V`` with ``F`` from head 0; returns ``([b, q, h, d], None)``.

    ``kernel`` (one of :data:`~rollouts.selective.constants.KERNELS`): how a prefill runs, see
    :func:`register_selective_attention`."""
    return _attention(
        module, query, key, value, attention_mask, scaling, dropout, heed_state, selective=True, kernel=kernel
    )


def standard_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    heed_state: AttentionState | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``softmax(Q K^T * scaling + mask) V``, reporting to ``heed_state``: the baseline of eviction runs."""
    return _attention(
        module, query, key, value, attention_mask, scaling, dropout, heed_state, selective=False
    )


@contextmanager
def bind_state(model: torch.nn.Module, state: AttentionState | None = None) -> Iterator[AttentionState]:
    """Bind one :class:`AttentionState` to every attention layer of ``model`` for the ``with`` block.

    For ``generate()``, which cannot pass it as a keyword. Not for beam search: it reorders the KV cache
    rows without telling the state.
    """
    state = AttentionState() if state is None else state
    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")]
    for layer in layers:
        layer.heed_state = state
    try:
        yield state
    finally:
        for layer in layers:
            del layer.heed_state


def check_selective_config(config) -> None:
    """Raise ``ValueError`` unless Selective Attention supports this model config."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"selective_attention is not supported for model_type {model_type!r}: "
            f"supported decoder families are {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        raise ValueError(
            "selective_attention needs full attention in every layer; this config has sliding-window "
            "layers (set use_sliding_window=False)"
        )


def enable_selective_attention(config):
    """Mark a decoder config as Selective Attention (``selective_attention: true``) and select
    :data:`SELECTIVE` as its attention implementation. Returns the same config."""
    check_selective_config(config)
    config.selective_attention = True
    config._attn_implementation = SELECTIVE
    return config


def _selective_aware(get_correct_attn_implementation):
    """Make every model whose config carries ``selective_attention: true`` resolve to :data:`SELECTIVE`."""

    @functools.wraps(get_correct_attn_implementation)
    def resolve(self, requested_attention, is_init_check=False):
        if not (getattr(self.config, "selective_attention", False) or requested_attention == SELECTIVE):
            return get_correct_attn_implementation(self, requested_attention, is_init_check)
        check_selective_config(self.config)
        if requested_attention not in (None, SELECTIVE):
            raise ValueError(
                f"this is a Selective Attention model (selective_attention: true); it runs only with "
                f"attn_implementation={SELECTIVE!r}, not {requested_attention!r}"
            )
        self.config.selective_attention = True  # so save_pretrained records the flag
        return SELECTIVE

    resolve.heed_selective = True
    return resolve


def check_kernel(kernel: str, name: str = "kernel") -> str:
    """``kernel`` if it is one of :data:`~rollouts.selective.constants.KERNELS`, else ``ValueError``."""
    if kernel not in KERNELS:
        raise ValueError(f"{name} must be one of {', '.join(KERNELS)}, got {kernel!r}")
    return kernel


def kernel_from_env() -> str:
    """The kernel a process the trainer started was told to run (``HEED_SELECTIVE_KERNEL``; dense when
    unset): how the rollout engines in their own processes learn the run's ``selective.kernel``."""
    return check_kernel(os.environ.get(KERNEL_ENV, "dense"), KERNEL_ENV)


# One function per kernel, so registering the same kernel again registers the very same object.
_SELECTIVE_FORWARDS: dict[str, Callable] = {
    kernel: functools.partial(selective_attention_forward, kernel=kernel) for kernel in KERNELS
}


def register_selective_attention(kernel: str = "dense") -> None:
    """Teach transformers Selective Attention; call it before building or loading a Selective Attention model.

    Registers :data:`SELECTIVE` (its prefills on ``kernel``: ``"dense"``, or ``"triton"``, the fused
    kernels, CUDA only) and :data:`STANDARD` with transformers' attention and mask registries, and makes a
    config with ``selective_attention: true`` resolve to :data:`SELECTIVE`. Idempotent; the registry is
    process-wide, so a second call with another kernel switches every Selective Attention model of the
    process to it.
    """
    forward = _SELECTIVE_FORWARDS[check_kernel(kernel)]
    for name, function in ((SELECTIVE, forward), (STANDARD, standard_attention_forward)):
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, sdpa_mask)  # 4D bool masks, or None for plain causal
    if not getattr(PreTrainedModel.get_correct_attn_implementation, "heed_selective", False):
        PreTrainedModel.get_correct_attn_implementation = _selective_aware(
            PreTrainedModel.get_correct_attn_implementation
        )


def registered_kernel() -> str | None:
    """The kernel :data:`SELECTIVE` runs in this process (``None`` before registration)."""
    forward = AttentionInterface().get(SELECTIVE)
    return next((kernel for kernel, f in _SELECTIVE_FORWARDS.items() if f is forward), None)

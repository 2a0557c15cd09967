"""A reference decoding loop with per-layer KV eviction: one compact cache per layer, really freed.

The loop feeds one token per forward, the prompt included, so eviction starts with the first token exactly as
the paper's causal pruning does (§4) and as :func:`rollouts.selective.eviction.selective_keep_mask` replays it
in a single forward. Before token ``t`` enters, every layer that holds ``K_l`` tokens asks its policy for
scores and drops the highest-scoring token (never <BOS>): its keys and values, ``F``'s running sum and its
attention statistics are gathered down to the survivors, so layer ``l`` never stores more than ``K_l`` tokens.
Each layer's cache is a plain tensor of the kept tokens in arrival order; RoPE stays right because keys were
rotated at their absolute positions when written, and each forward gets its absolute position explicitly.

What it returns feeds the accounting (docs/ARCHITECTURE.md, contract 7: accounting is exact): ``kv_reads[b, p, l]``, the keys layer ``l``
read in the forward at position ``p`` (``min(p + 1, K_l)``; per layer, since budgets differ), and
``completion_kv_tokens`` ``[b, n_new, L]``, the rows of the forwards that predicted each generated token
(the :class:`~rollouts.trajectory.Trajectory`'s ``kv_tokens_per_layer``).

Selective Attention models score with ``F`` (:class:`~rollouts.selective.eviction.SelectiveEviction`); a
standard model is run under :data:`~rollouts.selective.attention.STANDARD` so H2O / TOVA can read its
attention probabilities. Greedy decoding, a batch of equal-length prompts (no padding), no speculative tricks:
this is the reference the vLLM plugin's block-granular eviction is tested against, not a serving engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from .attention import AttentionState
from .constants import STANDARD
from .eviction import EvictionPolicy, HeldTokens, SelectiveEviction, check_budgets, evict_index


@dataclass
class EvictionDecode:
    """The outcome of :func:`decode_with_eviction`."""

    token_ids: torch.Tensor  # [b, P + n_new] the prompt then the generated tokens
    logits: torch.Tensor  # [b, F, V] the output of every forward (F = P + max(n_new - 1, 0))
    kv_reads: np.ndarray  # [b, F, L] keys each layer read in the forward at each position
    completion_kv_tokens: np.ndarray  # [b, n_new, L] reads of the forward that predicted each new token
    held: list[torch.Tensor]  # L x [b, F, P + n_new] bool: positions each layer held at each forward


def _gather_tokens(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``x`` ``[b, heads, held, d]`` down to the ``keep`` ``[b, kept]`` token positions."""
    index = keep[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3])
    return x.gather(2, index)


@torch.no_grad()
def decode_with_eviction(
    model,
    input_ids: torch.Tensor,  # [b, P]
    budgets: int | Sequence[int],
    policy: EvictionPolicy,
    max_new_tokens: int = 0,
) -> EvictionDecode:
    """Run ``input_ids`` token by token, then generate ``max_new_tokens`` greedily, under per-layer budgets."""
    num_layers = model.config.num_hidden_layers
    budgets = check_budgets(budgets, num_layers)
    selective = bool(getattr(model.config, "selective_attention", False))
    if isinstance(policy, SelectiveEviction) and not selective:
        raise ValueError(
            "SelectiveEviction scores with the accumulated mask F: it needs a Selective Attention model"
        )
    b, prompt_len = input_ids.shape
    if prompt_len < 1 or max_new_tokens < 0:
        raise ValueError("decode_with_eviction needs a non-empty prompt and max_new_tokens >= 0")
    total = prompt_len + max_new_tokens
    num_forwards = prompt_len + max(max_new_tokens - 1, 0)

    restore = None
    if not selective and model.config._attn_implementation != STANDARD:
        restore = model.config._attn_implementation
        model.set_attn_implementation(STANDARD)
    try:
        state = AttentionState(record_attention=True)
        cache = DynamicCache(config=model.config)
        device = input_ids.device
        positions = [torch.zeros(b, 0, dtype=torch.long, device=device) for _ in range(num_layers)]  # held
        attention_sum = [torch.zeros(b, 0, device=device) for _ in range(num_layers)]
        last_attention = [torch.zeros(b, 0, device=device) for _ in range(num_layers)]
        token_ids = torch.cat([input_ids, input_ids.new_zeros(b, max_new_tokens)], 1)
        logits, reads = [], np.zeros((b, num_forwards, num_layers), dtype=np.int64)
        held = [
            torch.zeros(b, num_forwards, total, dtype=torch.bool, device=device) for _ in range(num_layers)
        ]
        rows = torch.arange(b, device=device)[:, None]

        for t in range(num_forwards):
            for layer in range(num_layers) if t > 0 else ():
                count = positions[layer].shape[1]
                if count < budgets[layer]:
                    continue
                stats = HeldTokens(
                    mask=state.accumulators[layer].total
                    if selective
                    else torch.zeros(b, count, device=device),
                    attention_sum=attention_sum[layer],
                    last_attention=last_attention[layer],
                )
                evictable = torch.ones(b, count, dtype=torch.bool, device=device)
                evictable[:, 0] = False  # <BOS>
                victim = evict_index(policy.scores(stats), evictable)  # [b]
                slots = torch.arange(count, device=device).expand(b, count)
                keep = slots[slots != victim[:, None]].view(b, count - 1)  # [b, K - 1] survivors in order
                cache_layer = cache.layers[layer]
                cache_layer.keys = _gather_tokens(cache_layer.keys, keep)
                cache_layer.values = _gather_tokens(cache_layer.values, keep)
                if selective:
                    state.accumulators[layer].keep(keep)
                positions[layer] = positions[layer].gather(1, keep)
                attention_sum[layer] = attention_sum[layer].gather(1, keep)
                last_attention[layer] = last_attention[layer].gather(1, keep)

            step = model(
                token_ids[:, t : t + 1],
                position_ids=torch.full((b, 1), t, device=device),
                past_key_values=cache,
                use_cache=True,
                heed_state=state,
            )
            for layer in range(num_layers):
                probs = state.attention[layer][:, 0]  # [b, held + 1] this token's attention
                positions[layer] = torch.cat([positions[layer], torch.full((b, 1), t, device=device)], 1)
                attention_sum[layer] = torch.nn.functional.pad(attention_sum[layer], (0, 1)) + probs
                last_attention[layer] = probs
                reads[:, t, layer] = positions[layer].shape[1]
                held[layer][rows, t, positions[layer]] = True
            logits.append(step.logits[:, -1].float())
            if prompt_len <= t + 1 < total:  # this forward predicts the next generated token
                token_ids[:, t + 1] = step.logits[:, -1].argmax(-1)
    finally:
        if restore is not None:
            model.set_attn_implementation(restore)

    return EvictionDecode(
        token_ids=token_ids,
        logits=torch.stack(logits, 1),
        kv_reads=reads,
        completion_kv_tokens=reads[:, prompt_len - 1 : prompt_len - 1 + max_new_tokens],
        held=held,
    )

"""The reference engine: plain transformers decoding, one token at a time, under the same DA visibility.

It exists to be obviously right. One request at a time, its own KV cache (``DynamicCache``), and for
each decode forward an explicit attention mask over the cached keys built from the blocks
:class:`~rollouts.masks.visibility.VisibilityTracker` says are visible — the same tracker, fed the
same tokens, that the vLLM plugin runs in its worker. So it is the oracle the plugin is tested
against (same tokens and log-probs within fp32 noise), and the fallback where vLLM is not installed
(slow: no batching, no paging; :func:`rollouts.engines.make_engine` warns when it falls back).

Per request::

    prefill the prompt (causal, unmasked: prompt rows are never masked)
    for each step j:  pick g_j from the last logits (forced / greedy / sampled); record log p(g_j)
                      visible = tracker.advance(g_j)            # state after parsing g_0..g_j
                      forward g_j at position prompt_len + j, keys restricted to `visible` blocks

Log-probs are the model's raw ones (log-softmax of the logits, before temperature), as vLLM reports,
or after the request's temperature with ``logprobs_mode="processed_logprobs"`` (top-p is not applied).
Transformers passes a 4D mask through untouched, so the mask carries causality itself: a key is
visible when its block is visible and it is already cached (docs/ARCHITECTURE.md, "Training-side masks").

Selective Attention models (``selective_attention: true``) decode with their running mask ``F``
(:class:`~rollouts.selective.attention.AttentionState`, one per request) and, when the checkpoint carries
per-layer KV budgets (``selective_budgets`` in its config, or ``budgets=``), with eviction: the prefill
replays it over the prompt, then each layer masks what it evicted as tokens arrive (the cache keeps every
key; the trainer replays the same decisions in one forward). What each layer read for each generated
token goes into ``Trajectory.kv_tokens_per_layer``, which the efficiency reward counts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

import torch

from rollouts.masks.visibility import VisibilityTracker, visible_keys
from rollouts.protocol.tokens import token_bytes_table
from rollouts.selective.attention import AttentionState, kernel_from_env, register_selective_attention
from rollouts.selective.constants import SELECTIVE
from rollouts.selective.eviction import check_budgets, load_budgets
from rollouts.trajectory import Trajectory

from .base import RolloutRequest, build_trajectory


class ReferenceEngine:
    """Decodes :class:`RolloutRequest` s with transformers under the request's DA mode.

    Args:
        model: a causal LM, or a path to load one from (fp32 by default, SDPA attention; a Selective
            Attention checkpoint registers Selective Attention first, its kernel from
            ``HEED_SELECTIVE_KERNEL``).
        tokenizer: its tokenizer (loaded from ``model`` when that is a path).
        dtype: dtype to load a model path in.
        device: where to run.
        num_threads: torch CPU threads while generating (restored after). Each step is a tiny
            one-token forward, dominated by overhead: on a shared CPU one thread avoids OpenMP
            threads spinning against other processes (8x faster on a loaded 2-core machine).
        logprobs_mode: as vLLM's: ``raw_logprobs`` (the model's), or ``processed_logprobs`` (after the
            request's temperature; what GRPO's importance-sampling correction compares with).
        budgets: per-layer KV budgets for a Selective Attention model (an int for every layer); ``None``
            takes the model config's ``selective_budgets`` (no eviction when it has none).
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        num_threads: int | None = None,
        budgets: int | Sequence[int] | None = None,
        logprobs_mode: str = "raw_logprobs",
    ):
        if isinstance(model, str | os.PathLike):
            from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            selective = getattr(AutoConfig.from_pretrained(model), "selective_attention", False)
            if selective:  # the kernel as the trainer chose it, when it started this process
                register_selective_attention(kernel_from_env())
            model = AutoModelForCausalLM.from_pretrained(
                model, dtype=dtype, attn_implementation=SELECTIVE if selective else "sdpa"
            )
        if tokenizer is None:
            raise ValueError("pass the model's tokenizer (the DA parser reads the generated text)")
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in ("sdpa", "eager", SELECTIVE):
            raise ValueError(
                f"the reference engine builds dense 4D masks: load the model with attn_implementation "
                f"'sdpa' or 'eager' (or a Selective Attention model), not {impl!r}"
            )
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(
                f"logprobs_mode must be raw_logprobs or processed_logprobs, got {logprobs_mode!r}"
            )
        self.processed_logprobs = logprobs_mode == "processed_logprobs"
        self.selective = impl == SELECTIVE
        if budgets is not None and not self.selective:
            raise ValueError(
                "KV budgets evict by Selective Attention's mask F: they need a Selective Attention model"
            )
        num_layers = model.config.num_hidden_layers
        self.budgets = (
            check_budgets(budgets, num_layers) if budgets is not None else load_budgets(model.config)
        )
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.num_threads = num_threads
        self.token_table = token_bytes_table(tokenizer)
        self._bool_mask = impl != "eager"  # eager adds the mask to the scores: it needs 0 / -inf
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.stop_ids = set(eos) if isinstance(eos, list | tuple) else ({eos} if eos is not None else set())

    @torch.inference_mode()
    def generate(self, requests: Sequence[RolloutRequest]) -> list[Trajectory]:
        """One Trajectory per request, in order. ``extra["kv_tokens_engine"]``: KV tokens each
        forward actually attended to, counted from the mask (``[n]``, the forward that predicted
        each token)."""
        saved_threads = torch.get_num_threads()
        if self.num_threads is None or self.num_threads == saved_threads:
            return [self._generate_one(request) for request in requests]
        torch.set_num_threads(self.num_threads)  # (a no-op once an in-process vLLM CPU engine pinned threads)
        try:
            return [self._generate_one(request) for request in requests]
        finally:
            torch.set_num_threads(saved_threads)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new weights in place (HF checkpoint names, as the trainer's ``named_parameters``)."""
        params = self.model.state_dict()  # every name, tied ones included (lm_head.weight); shares storage
        unknown = []
        for name, tensor in weights:
            if name in params:
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
            else:
                unknown.append(name)
        if unknown:
            raise KeyError(f"weights the model does not have: {', '.join(unknown[:5])}")

    def _generate_one(self, request: RolloutRequest) -> Trajectory:
        start = time.perf_counter()
        ids, logprobs, kv_read, per_layer, finish = self._decode(request)
        return build_trajectory(
            request,
            ids,
            logprobs,
            self.token_table,
            finish_reason=finish,
            wall_time_s=time.perf_counter() - start,
            extra={"engine": "reference", "kv_tokens_engine": kv_read},
            kv_tokens_per_layer=per_layer if self.budgets is not None else None,
        )

    def _decode(self, request: RolloutRequest) -> tuple[list[int], list[float], list[int], list, str]:
        from transformers import DynamicCache

        layout = request.layout
        masked = request.mode == "da"
        tracker = VisibilityTracker(layout, self.token_table) if masked else None
        generator = None
        if request.temperature > 0 and request.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(request.seed)

        cache = DynamicCache(config=self.model.config)
        state = AttentionState(budgets=self.budgets) if self.selective else None
        extra = {"heed_state": state} if state is not None else {}
        prompt = torch.tensor([layout.input_ids], device=self.device)
        logits = self.model(input_ids=prompt, past_key_values=cache, use_cache=True, **extra).logits[0, -1]
        ids: list[int] = []
        logprobs: list[float] = []
        kv_read = [layout.prompt_len]  # g_0 is predicted by the prefill's last row, which reads the prompt
        per_layer = [self._layer_reads(state)]  # [n][L] under eviction: what each layer read
        temperature = request.temperature if self.processed_logprobs and request.temperature > 0 else 1.0
        for j in range(request.num_tokens):
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            token = self._pick(request, j, logits, generator)
            ids.append(token)
            logprobs.append(float(logp[token]))
            if token in self.stop_ids and (j >= request.num_forced or j + 1 == request.num_tokens):
                return ids, logprobs, kv_read, per_layer, "stop"  # sampled EOS, or a forced ending in EOS
            if j + 1 == request.num_tokens:
                break
            position = layout.prompt_len + j
            mask = None
            if tracker is not None:
                visible = tracker.advance(token)
                mask = self._mask(visible, position, layout.block_size)
                kv_read.append(int(mask.sum()) if self._bool_mask else int((mask == 0).sum()))
            else:
                kv_read.append(position + 1)
            logits = self.model(
                input_ids=torch.tensor([[token]], device=self.device),
                position_ids=torch.tensor([[position]], device=self.device),
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
                **extra,
            ).logits[0, -1]
            per_layer.append(self._layer_reads(state))
        return ids, logprobs, kv_read, per_layer, "length"

    def _layer_reads(self, state: AttentionState | None) -> list[int]:
        """Keys each layer read in the last forward's last row (under eviction), else ``[]``."""
        if state is None or self.budgets is None:
            return []
        return [int(state.kv_reads[layer][0, -1]) for layer in range(len(self.budgets))]

    def _pick(self, request: RolloutRequest, step: int, logits: torch.Tensor, generator) -> int:
        if step < request.num_forced:
            return request.forced_ids[step]
        if request.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / request.temperature, dim=-1)
        if request.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(-1) - sorted_probs < request.top_p  # always keeps the top token
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=generator))

    def _mask(self, visible, position: int, block_size: int) -> torch.Tensor:
        """``[1, 1, 1, position + 1]`` mask for the forward at ``position``: keys in visible blocks."""
        keys = torch.from_numpy(visible_keys(visible, position, block_size)).to(self.device)
        if self._bool_mask:
            return keys.view(1, 1, 1, -1)
        additive = torch.zeros(keys.shape, dtype=self.model.dtype, device=self.device)
        return additive.masked_fill_(~keys, torch.finfo(self.model.dtype).min).view(1, 1, 1, -1)

"""Selective Attention inside vLLM: Heed's attention function in place of the backend's kernel.

A Selective Attention checkpoint cannot run on vLLM's attention kernels. Every head's logits need ``-F``
before the softmax -- head 0's accumulated selections, different for every query, carried per request
from step to step -- and under per-layer KV budgets each layer masks the tokens it evicted, which
differ from layer to layer. No block table says either. So, for such a model, the plugin replaces each
attention layer's ``impl.forward`` with :func:`selective_forward`, which runs the very function the
trainer and the reference engine run (:mod:`rollouts.selective.attention`) on each request of the batch::

    per step (planned in _prepare_inputs, after the DA plan):
        rows = for each request of the batch: its tokens in the flat batch, its first position,
               and, on a masked DA decode row, the keys its mode lets it read (rollouts.masks.visibility)
    per attention layer, for each row:
        append the step's keys and values (RoPE applied, as vLLM hands them) to the request's own KV
        out[row tokens] = selective attention(query rows, every key so far, DA mask or causal,
                                              state = the request's AttentionState)

The request's :class:`~rollouts.selective.attention.AttentionState` holds ``F``'s running sums per
layer and, under budgets, what each layer holds: the prefill replays eviction over the prompt, then each
arriving token evicts the held token with the largest ``F`` once the layer is full -- the decisions
:class:`~rollouts.engines.reference.ReferenceEngine` and the trainer's replay take, by the same code.
Budgets come from the checkpoint (``selective_budgets`` in config.json) or ``hf_overrides``. What
each layer read for every generated token is reported (``heed_sa_reports``) and becomes
``Trajectory.kv_tokens_per_layer``, which the efficiency reward counts.

Decisions and limits (enforced where they can be; :func:`selective_problems`):

- Keys and values are kept per request, per layer, in growing contiguous buffers beside vLLM's paged
  cache, which vLLM still fills and schedules by. The paged cache's layout is the backend's own (on CPU it
  depends on the ISA: AMX packs it), and no backend kernel takes a per-query bias. So an SA model holds
  its KV twice, and evicted tokens are masked, not freed: the reads are the budget's, the memory is
  not. Freeing needs a kernel that reads a per-layer kept-token table; that is the next step.
- One Python loop per request per layer: a correctness path for rollouts of small models, not a
  serving kernel.
- A request's first step must prefill it from position 0: a prefix-cache hit has no query rows to
  select with, so prefix caching is refused, and a prompt cut by chunked prefill fails naming the
  request. A preempted request is prefilled again from scratch, which replays ``F`` and eviction
  exactly (DA requests still refuse preemption, see the plugin).
- Tensor parallelism is refused: head 0's ``F`` is needed by every head, on every rank.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rollouts.masks.visibility import visible_keys
from rollouts.selective.attention import AttentionState, kernel_from_env, selective_attention_forward
from rollouts.selective.eviction import load_budgets

SA_KEY = "heed_sa_key"  # extra_args key: the accounting key of a request to a Selective Attention model
MAX_FINISHED_REPORTS = 65536  # reports kept for the driver to collect


def is_selective(hf_config) -> bool:
    """Whether a checkpoint's config asks for Selective Attention (``selective_attention: true``)."""
    return bool(getattr(hf_config, "selective_attention", False))


def selective_problems(vllm_config) -> list[str]:
    """Engine settings a Selective Attention checkpoint cannot be served under (empty if none, or if the
    checkpoint is a standard one)."""
    if not is_selective(getattr(vllm_config.model_config, "hf_config", None)):
        return []
    problems = []
    if vllm_config.cache_config.enable_prefix_caching:
        problems.append(
            "prefix caching is on (a cached prompt has no query rows to compute Selective Attention's "
            "mask with); pass enable_prefix_caching=False"
        )
    if vllm_config.parallel_config.tensor_parallel_size > 1:
        problems.append(
            "tensor parallelism splits the heads, but head 0's mask is needed by every head; run a "
            "Selective Attention model with tensor_parallel_size=1"
        )
    if vllm_config.speculative_config is not None:
        problems.append("speculative decoding is on; drop speculative_config")
    try:
        load_budgets(vllm_config.model_config.hf_config)
    except ValueError as err:
        problems.append(f"the checkpoint's selective_budgets are invalid: {err}")
    return problems


@dataclass
class _Row:
    """One request's part of the step."""

    req_id: str
    start: int  # first token of the request in the flat batch
    query_len: int
    position: int  # absolute position of its first query token
    da_keys: np.ndarray | None  # [position + 1] keys a masked DA decode row reads, else None (causal)


class _LayerKV:
    """One request's keys and values in one layer, in arrival order: ``[1, kv_heads, n, d]`` views of buffers
    that double when full (amortised O(1) per token; a copy, never a view of vLLM's activations)."""

    def __init__(self):
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def append(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``[1, kv_heads, q, d]`` keys and values; return every key and value so far."""
        new = self.length + key.shape[2]
        if self._keys is None or new > self._keys.shape[2]:
            capacity = max(2 * (0 if self._keys is None else self._keys.shape[2]), new, 64)
            keys = key.new_empty(*key.shape[:2], capacity, key.shape[3])
            values = value.new_empty(*value.shape[:2], capacity, value.shape[3])
            if self._keys is not None:
                keys[:, :, : self.length] = self._keys[:, :, : self.length]
                values[:, :, : self.length] = self._values[:, :, : self.length]
            self._keys, self._values = keys, values
        self._keys[:, :, self.length : new] = key
        self._values[:, :, self.length : new] = value
        self.length = new
        return self._keys[:, :, :new], self._values[:, :, :new]


@dataclass
class _SelectiveRequest:
    """One request's Selective Attention state in the worker."""

    key: str | None  # the driver's accounting key (extra_args[SA_KEY])
    prompt_len: int
    state: AttentionState
    kv: dict[int, _LayerKV] = field(default_factory=dict)  # by layer
    reads: dict[int, list[int]] = field(default_factory=dict)  # position -> keys each layer read

    def report(self) -> dict[str, Any]:
        """``kv_tokens_per_layer``: per generated token, what each layer read in the forward predicting it."""
        return {"kv_tokens_per_layer": [self.reads[p] for p in sorted(self.reads)]}


class SelectiveWorkerState:
    """Per-worker state of a Selective Attention model: requests by vLLM id and the step being run."""

    def __init__(self, runner):
        hf_config = runner.model_config.hf_config
        self.budgets = load_budgets(hf_config)
        self.kernel = kernel_from_env()  # the run's selective.kernel, for prefills
        self.num_layers = hf_config.num_hidden_layers
        self.requests: dict[str, _SelectiveRequest] = {}
        self.finished: dict[str, dict[str, Any]] = {}
        self.step: list[_Row] | None = None
        self.num_tokens = 0
        self._install(runner)

    def _install(self, runner) -> None:
        """Route every attention layer of the model through :func:`selective_forward`."""
        from vllm.model_executor.models.utils import extract_layer_index

        layers = runner.vllm_config.compilation_config.static_forward_context
        installed = 0
        for name, layer in layers.items():
            impl = getattr(layer, "impl", None)
            if impl is None or not hasattr(impl, "forward"):
                continue
            impl.forward = functools.partial(
                selective_forward, self, extract_layer_index(name), impl.forward, impl
            )
            installed += 1
        if not installed:  # (a pipeline stage holds only its own layers)
            raise RuntimeError("found no attention layer to run Selective Attention in")

    def plan_step(self, runner, da_state) -> None:
        """Record this step's rows (and each masked DA decode row's visible keys) for the forwards."""
        batch = runner.input_batch
        query_start = runner.query_start_loc.np
        computed = batch.num_computed_tokens_cpu
        rows = []
        for i, req_id in enumerate(batch.req_ids):
            start, position = int(query_start[i]), int(computed[i])
            query_len = int(query_start[i + 1]) - start
            request = self.requests.get(req_id)
            if position == 0:  # a new request, or one preempted and prefilled again: start afresh
                params = runner.requests[req_id].sampling_params
                extra = (params.extra_args if params is not None else None) or {}
                request = self.requests[req_id] = _SelectiveRequest(
                    key=extra.get(SA_KEY),
                    prompt_len=len(runner.requests[req_id].prompt_token_ids or ()),
                    state=AttentionState(budgets=self.budgets),
                )
            elif request is None:
                raise RuntimeError(
                    f"request {req_id} starts at position {position}, not 0: a Selective Attention model "
                    "needs every request prefilled in one step (prefix caching off, prompts shorter "
                    "than max_num_batched_tokens or chunked prefill off)"
                )
            tracked = da_state.requests.get(req_id) if da_state is not None else None
            da_keys = None
            if tracked is not None and tracked.spec.masked and position >= tracked.prompt_len:
                da_keys = visible_keys(
                    tracked.tracker.visible_blocks, position, tracked.spec.layout.block_size
                )
            rows.append(_Row(req_id, start, query_len, position, da_keys))
        self.step = rows
        self.num_tokens = int(query_start[len(batch.req_ids)])

    def release(self, req_ids) -> None:
        for req_id in req_ids:
            request = self.requests.pop(req_id, None)
            if request is not None and request.key is not None:
                self.finished[request.key] = request.report()
                while len(self.finished) > MAX_FINISHED_REPORTS:  # never collected: drop the oldest
                    self.finished.pop(next(iter(self.finished)))

    def pop_reports(self, keys) -> dict[str, dict[str, Any]]:
        """Reports by key; a request still live here (the scheduler finished it last step) reports too."""
        live = {r.key: r for r in self.requests.values() if r.key is not None}
        out = {}
        for key in keys:
            if key in self.finished:
                out[key] = self.finished.pop(key)
            elif key in live:
                out[key] = live[key].report()
        return out


def selective_forward(
    worker: SelectiveWorkerState,
    layer_idx: int,
    original,
    impl,
    layer,
    query: torch.Tensor,  # [tokens, heads, d]
    key: torch.Tensor,  # [tokens, kv_heads, d]
    value: torch.Tensor,  # [tokens, kv_heads, d]
    kv_cache: torch.Tensor,
    attn_metadata,
    output: torch.Tensor,  # [tokens, heads, d]
    *args,
    **kwargs,
) -> torch.Tensor:
    """One attention layer's forward for a Selective Attention model: every request of the step in turn."""
    rows = worker.step
    if attn_metadata is None or rows is None:  # dummy runs (warm-up, profiling): no requests
        return original(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
    if attn_metadata.num_actual_tokens != worker.num_tokens:
        raise RuntimeError(
            f"Selective Attention planned {worker.num_tokens} tokens for this step, attention got "
            f"{attn_metadata.num_actual_tokens}"
        )
    module = types.SimpleNamespace(layer_idx=layer_idx)
    for row in rows:
        request = worker.requests[row.req_id]
        tokens = slice(row.start, row.start + row.query_len)
        layer_kv = request.kv.setdefault(layer_idx, _LayerKV())
        if layer_kv.length != row.position:
            raise RuntimeError(
                f"request {row.req_id}: layer {layer_idx} holds {layer_kv.length} keys but the step starts at "
                f"position {row.position}"
            )
        keys, values = layer_kv.append(
            key[tokens].transpose(0, 1)[None],  # [1, kv_heads, q, d]
            value[tokens].transpose(0, 1)[None],
        )
        mask = None
        if row.da_keys is not None:
            mask = torch.from_numpy(row.da_keys).to(query.device).view(1, 1, 1, -1)
        out, _ = selective_attention_forward(
            module,
            query[tokens].transpose(0, 1)[None],  # [1, heads, q, d]
            keys,
            values,
            mask,
            scaling=impl.scale,
            heed_state=request.state,
            kernel=worker.kernel,
        )
        output[tokens] = out[0].to(output.dtype)  # [q, heads, d]
        if worker.budgets is not None:  # what each forward that predicts a generated token read
            reads = request.state.kv_reads[layer_idx][0]  # [q]
            first = max(request.prompt_len - 1 - row.position, 0)
            for offset, n in enumerate(reads[first:].tolist(), start=first):
                request.reads.setdefault(row.position + offset, [0] * worker.num_layers)[layer_idx] = n
    return output

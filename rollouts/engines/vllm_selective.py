"""Selective Attention inside vLLM: Heed's attention function in place of the backend's kernel.

A Selective Attention checkpoint cannot run on vLLM's attention kernels. Every head's logits need ``-F``
before the softmax -- head 0's accumulated selections, different for every query, carried per request
from step to step -- and under per-layer KV budgets each layer masks the tokens it evicted, which
differ from layer to layer. No block table says either. So, for such a model, the plugin replaces each
attention layer's ``impl.forward`` with :func:`selective_forward`, which runs the very function the
trainer and the reference engine run (:mod:`rollouts.selective.attention`) over the requests of the batch::

    per step (planned in _prepare_inputs, after the DA plan):
        rows = for each request of the batch: its tokens in the flat batch, its first position,
               and, on a masked DA decode row, the keys its mode lets it read (rollouts.masks.visibility)
    per attention layer:
        for each row: append the step's keys and values (RoPE applied, as vLLM hands them) to the
                      request's own KV
        the step's fresh prefills, left-padded into one batch:  one selective attention call
        the step's decode rows, right-aligned into one batch:   one selective attention call
        (any other row, e.g. a prompt cut by chunked prefill: one call of its own)
        each with the request's AttentionState read before and written back after
    under budgets, a prefilled request's layer hands what it holds (keys, values, F sums) to the layer's
    HeldCache (rollouts.selective.held_cache: a row per request) and drops its copy of the prompt; its
    decode rows then run there: one batched step per layer, evicted keys dropped EVICTED_SLACK at a time

The request's :class:`~rollouts.selective.attention.AttentionState` holds ``F``'s running sums per
layer and, under budgets, what each layer holds: the prefill replays eviction over the prompt, then each
arriving token evicts the held token with the largest ``F`` once the layer is full -- the decisions
:class:`~rollouts.engines.reference.ReferenceEngine` and the trainer's replay take, by the same code.
Budgets come from the checkpoint (``selective_budgets`` in config.json) or ``hf_overrides``. What
each layer read for every generated token is reported (``heed_sa_reports``) and becomes
``Trajectory.kv_tokens_per_layer``, which the efficiency reward counts.

Decisions and limits (enforced where they can be; :func:`selective_problems`):

- Keys and values are kept by Heed, never read back from vLLM's paged cache: per request and layer in
  contiguous buffers, or under budgets, once the prompt is done, in the layer's HeldCache, which holds the
  budget plus at most ``EVICTED_SLACK`` evicted keys not yet dropped. Under budgets vLLM's cache is only
  written to, so its KV spec becomes a sliding window of ``VLLM_KV_WINDOW`` token (:func:`freed_kv_specs`):
  vLLM's block manager frees each block once the request's next token lies past it, and a decoding
  request keeps one block per KV cache group, where stock vLLM keeps its whole context. The held keys
  themselves are outside vLLM's block pool (HeldCache rows, at most ``max_num_seqs`` of them), not in
  compacted vLLM blocks: vLLM's CPU cache layout is the backend's own (AMX packs it) and no backend kernel
  takes a per-query bias. Without budgets the spec stays full attention, so that vLLM's admission still
  counts the memory of the request's full copies.
- Per layer, one attention call for the step's prefills and one for its decode rows
  (:func:`prefill_together`, :func:`decode_together` or :meth:`HeldCache.step`), but the attention is
  transformers-level torch over padded batches, not a paged kernel: a path for rollouts of small models,
  not a serving kernel.
- A request's first step must prefill it from position 0: a prefix-cache hit has no query rows to
  select with, so prefix caching is refused, and a prompt cut by chunked prefill fails naming the
  request. A preempted request is prefilled again from scratch, which replays ``F`` and eviction
  exactly (DA requests still refuse preemption, see the plugin).
- Tensor parallelism is refused: head 0's ``F`` is needed by every head, on every rank.
"""

from __future__ import annotations

import functools
import logging
import types
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from rollouts.masks.visibility import visible_keys
from rollouts.selective.attention import AttentionState, kernel_from_env, selective_attention_forward
from rollouts.selective.eviction import load_budgets
from rollouts.selective.held_cache import HeldCache
from rollouts.selective.mask import MaskAccumulator
from rollouts.selective.prefill import budgeted_prefill

# a child of vLLM's logger, the one vLLM configures in its processes: the engine's log says which path ran
logger = logging.getLogger("vllm.heed.selective")

SA_KEY = "heed_sa_key"  # extra_args key: the accounting key of a request to a Selective Attention model
MAX_FINISHED_REPORTS = 65536  # reports kept for the driver to collect
# Evicted keys a decoding layer keeps masked before it drops them: compacting a request's KV costs a copy,
# so it is done once per this many evictions, not at every step (the prompt's are dropped at once)
EVICTED_SLACK = 16
# vLLM's own KV window, in tokens, for a model under budgets: its paged cache is written to but never read
# (the held keys live in the HeldCache), so it need keep only the block the step writes into
VLLM_KV_WINDOW = 1


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


def freed_kv_specs(specs: dict) -> dict:
    """Each layer's vLLM KV cache spec for a model under budgets: a sliding window of ``VLLM_KV_WINDOW``
    token in place of full attention, the rest of the spec (block size, heads, dtype) unchanged.

    vLLM's block manager then frees a request's blocks as the window passes them (the null block takes
    their place in its block list), so after its prompt a request keeps one block per KV cache group."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    window_fields = {f.name for f in fields(SlidingWindowSpec) if f.init} - {"sliding_window"}
    out = {}
    for name, spec in specs.items():
        if type(spec) is not FullAttentionSpec or spec.sliding_window is not None:
            raise RuntimeError(
                f"layer {name} has a {type(spec).__name__} KV cache; Selective Attention under budgets "
                "expects plain full attention in every layer"
            )
        kept = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name in window_fields}
        out[name] = SlidingWindowSpec(**kept, sliding_window=VLLM_KV_WINDOW)
    return out


def selective_path(budgets, kv_cache_config) -> str:
    """Which path a Selective Attention engine runs, read from the KV cache vLLM actually built."""
    specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
    kv = "vLLM KV " + ", ".join(
        f"{type(s).__name__}(window={getattr(s, 'sliding_window', None)})" for s in specs
    )
    if budgets is None:
        return f"no budgets: dense prefill, decoding over each request's full copy; {kv}: not freed"
    freed = all(type(s).__name__ == "SlidingWindowSpec" and s.sliding_window == VLLM_KV_WINDOW for s in specs)
    return (
        f"budgets {list(budgets)}: prompts streamed over each layer's held keys, decoding from each layer's "
        f"HeldCache; {kv}: " + ("blocks freed behind the token being written" if freed else "NOT freed")
    )


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
        return self.keys_values()

    def keys_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every key and value so far, ``[1, kv_heads, n, d]`` each."""
        return self._keys[:, :, : self.length], self._values[:, :, : self.length]


@dataclass
class _SelectiveRequest:
    """One request's Selective Attention state in the worker."""

    key: str | None  # the driver's accounting key (extra_args[SA_KEY])
    prompt_len: int
    state: AttentionState
    slot: int  # its row in each layer's HeldCache (under budgets)
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
        self.prefilled_again = 0  # requests vLLM preempted and prefilled again (their state restarted)
        self.decode_held_peak = [0] * self.num_layers  # per layer: the most keys a decoding request held
        # Under budgets each layer's decoding requests live in one HeldCache, a row (slot) per request
        self.held_caches: dict[int, HeldCache] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self.step: list[_Row] | None = None
        self.num_tokens = 0
        self._install(runner)
        self.path = selective_path(self.budgets, runner.kv_cache_config)
        logger.info("Selective Attention in %d layers: %s", self.num_layers, self.path)

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
                self.prefilled_again += request is not None
                params = runner.requests[req_id].sampling_params
                extra = (params.extra_args if params is not None else None) or {}
                request = self.requests[req_id] = _SelectiveRequest(
                    key=extra.get(SA_KEY),
                    prompt_len=len(runner.requests[req_id].prompt_token_ids or ()),
                    state=AttentionState(budgets=self.budgets),
                    slot=request.slot if request is not None else self._take_slot(),
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

    def _take_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        self._next_slot += 1
        return self._next_slot - 1

    def release(self, req_ids) -> None:
        for req_id in req_ids:
            request = self.requests.pop(req_id, None)
            if request is not None:
                self._free_slots.append(request.slot)
            if request is not None and request.key is not None:
                self.finished[request.key] = request.report()
                while len(self.finished) > MAX_FINISHED_REPORTS:  # never collected: drop the oldest
                    self.finished.pop(next(iter(self.finished)))

    def pop_reports(self, keys) -> dict[str, dict[str, Any]]:
        """Reports by key; a request still live here (the scheduler finished it last step) reports too,
        and is then forgotten by key, so that its release does not keep a report nobody collects."""
        live = {r.key: r for r in self.requests.values() if r.key is not None}
        out = {}
        for key in keys:
            if key in self.finished:
                out[key] = self.finished.pop(key)
            elif key in live:
                out[key] = live[key].report()
                live[key].key = None
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
    decoding, prefilling, held_decoding = [], [], []  # run together below
    for row in rows:
        request = worker.requests[row.req_id]
        if worker.budgets is not None and row.position > 0:  # its keys live in the layer's HeldCache
            if row.query_len != 1:
                raise RuntimeError(
                    f"request {row.req_id}: a Selective Attention model under KV budgets decodes one token "
                    f"per step, got {row.query_len} (speculative decoding and chunked prefill are not supported)"
                )
            held_decoding.append((row, request))
            continue
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
        if row.query_len == 1 and row.position > 0:
            decoding.append((row, request, keys, values))
            continue
        if row.position == 0 and row.da_keys is None:
            prefilling.append((row, request, keys, values))
            continue
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
        _record_reads(worker, request, row, layer_idx, request.state.kv_reads[layer_idx][0])
    if prefilling:
        outs, reads = prefill_together(
            layer_idx,
            [query[row.start : row.start + row.query_len].transpose(0, 1)[None] for row, *_ in prefilling],
            [(keys, values, request.state) for _, request, keys, values in prefilling],
            impl.scale,
            worker.budgets,
            worker.kernel,
        )
        for (row, request, *_), out, row_reads in zip(prefilling, outs, reads):
            output[row.start : row.start + row.query_len] = out.to(output.dtype)
            _record_reads(worker, request, row, layer_idx, row_reads)
            if worker.budgets is not None:
                _hand_over(worker, request, layer_idx)
    if decoding:
        starts = [row.start for row, *_ in decoding]
        out, reads = decode_together(
            layer_idx,
            query[starts].unsqueeze(2),  # [R, heads, 1, d]
            [(keys, values, row.da_keys, request.state) for row, request, keys, values in decoding],
            impl.scale,
        )
        output[starts] = out.to(output.dtype)
        for (row, request, *_), n in zip(decoding, reads.tolist()):
            _record_reads(worker, request, row, layer_idx, [n])
    if held_decoding:
        cache = worker.held_caches[layer_idx]
        starts = [row.start for row, _ in held_decoding]
        slots = [request.slot for _, request in held_decoding]
        out, reads = cache.step(
            slots,
            query[starts].unsqueeze(2),  # [R, heads, 1, d]
            key[starts],  # [R, kv_heads, d]
            value[starts],
            [row.position for row, _ in held_decoding],
            [row.da_keys for row, _ in held_decoding],
            impl.scale,
        )
        output[starts] = out.to(output.dtype)
        for (row, request), n in zip(held_decoding, reads.tolist()):
            _record_reads(worker, request, row, layer_idx, [n])
        held = int(cache.length[slots].max())
        worker.decode_held_peak[layer_idx] = max(worker.decode_held_peak[layer_idx], held)
    return output


def _hand_over(worker: SelectiveWorkerState, request: _SelectiveRequest, layer_idx: int) -> None:
    """After a prefill under budgets: move what the layer holds (keys, values, ``F`` sums, positions) into the
    layer's :class:`~rollouts.selective.held_cache.HeldCache` and drop the request's full copy of the prompt."""
    layer_kv = request.kv.pop(layer_idx)
    keys, values = layer_kv.keys_values()
    held = request.state.held.pop(layer_idx)[0].nonzero()[:, 0]  # [m] ascending positions
    total = request.state.accumulators.pop(layer_idx).total
    cache = worker.held_caches.get(layer_idx)
    if cache is None:
        cache = worker.held_caches[layer_idx] = HeldCache(layer_idx, worker.budgets, EVICTED_SLACK)
    cache.load(request.slot, keys[:, :, held], values[:, :, held], total[:, held], held)


def _record_reads(worker, request, row, layer_idx: int, reads) -> None:
    """What each forward of ``row`` that predicts a generated token read in this layer (``reads`` ``[q]``)."""
    if worker.budgets is None:
        return
    first = max(request.prompt_len - 1 - row.position, 0)
    reads = reads.tolist() if isinstance(reads, torch.Tensor) else list(reads)
    for offset, n in enumerate(reads[first:], start=first):
        request.reads.setdefault(row.position + offset, [0] * worker.num_layers)[layer_idx] = n


def prefill_together(
    layer_idx: int,
    queries: list[torch.Tensor],  # [1, heads, n_r, d] each: a whole prompt per request
    requests: list[tuple[torch.Tensor, torch.Tensor, AttentionState]],
    scaling: float,
    budgets: tuple[int, ...] | None,
    kernel: str = "dense",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One layer's prefill of ``R`` requests in one call: per request ``out [n_r, heads, d]`` and the keys
    each of its queries read ``[n_r]``.

    ``requests[r]``: its keys and values ``[1, kv_heads, n_r, d]`` (the prompt's) and its fresh
    :class:`~rollouts.selective.attention.AttentionState`, which receives the layer's running ``F`` sums and,
    under budgets, what the layer holds after the prompt. The prompts are right-aligned in one batch
    (``L = max n_r``, left padding): padding keys are hidden from every query and padding queries see only
    themselves, as in the trainer's padded forward, and the eviction replay skips them
    (``AttentionState.padding_mask``). So ``F``, the replayed evictions and the outputs are each prompt's
    own, and the replay's loop over positions runs once for the batch instead of once per request. Under
    budgets the prompt is streamed over the held tokens (:func:`rollouts.selective.prefill.budgeted_prefill`,
    no ``[R, L, L]`` tensor), and the ``F`` sums of the keys it evicted are left at 0.
    """
    lengths = [q.shape[2] for q in queries]
    width = max(lengths)
    first_q, (first_k, *_) = queries[0], requests[0]
    batch, device = len(queries), first_q.device
    query = first_q.new_zeros(batch, first_q.shape[1], width, first_q.shape[3])
    keys = first_k.new_zeros(batch, first_k.shape[1], width, first_k.shape[3])
    values = keys.clone()
    real = torch.zeros(batch, width, dtype=torch.bool, device=device)
    for r, (q, (k, v, _), n) in enumerate(zip(queries, requests, lengths)):
        query[r, :, width - n :], keys[r, :, width - n :], values[r, :, width - n :] = q[0], k[0], v[0]
        real[r, width - n :] = True
    if budgets is not None:
        return _prefill_under_budget(
            layer_idx, query, keys, values, real, requests, lengths, budgets, scaling
        )
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=device)
    visible = (causal & real[:, None, :] & real[:, :, None]) | (eye & ~real[:, :, None])  # [R, L, L]
    together = AttentionState(padding_mask=real)
    out, _ = selective_attention_forward(
        types.SimpleNamespace(layer_idx=layer_idx),
        query,
        keys,
        values,
        visible[:, None],
        scaling=scaling,
        heed_state=together,
        kernel=kernel,
    )  # [R, L, heads, d]
    total = together.accumulators[layer_idx].total  # [R, L]
    reads = together.kv_reads[layer_idx]  # [R, L]
    outs, row_reads = [], []
    for r, ((_, _, state), n) in enumerate(zip(requests, lengths)):
        state.accumulators[layer_idx] = MaskAccumulator()
        state.accumulators[layer_idx].total = total[r : r + 1, width - n :]
        outs.append(out[r, width - n :])
        row_reads.append(reads[r, width - n :])
    return outs, row_reads


def _prefill_under_budget(layer_idx, query, keys, values, real, requests, lengths, budgets, scaling):
    """:func:`prefill_together` under budgets, streamed over the held tokens
    (:func:`rollouts.selective.prefill.budgeted_prefill`). Each state gets what the layer holds as a mask
    over the prompt, and ``F`` sums for the held keys (0 for the evicted ones, which nobody reads again)."""
    width = query.shape[2]
    result = budgeted_prefill(query, keys, values, real, budgets[layer_idx], scaling)
    outs, row_reads = [], []
    for r, ((_, _, state), n) in enumerate(zip(requests, lengths)):
        held = result.held[r]
        filled = held >= 0
        positions = held[filled] - (width - n)  # [kept] into the request's own prompt
        state.held[layer_idx] = torch.zeros(1, n, dtype=torch.bool, device=held.device)
        state.held[layer_idx][0, positions] = True
        state.accumulators[layer_idx] = MaskAccumulator()
        state.accumulators[layer_idx].total = result.total.new_zeros(1, n)
        state.accumulators[layer_idx].total[0, positions] = result.total[r, filled]
        outs.append(result.out[r, :, width - n :].transpose(0, 1))  # [n, heads, d]
        row_reads.append(result.reads[r, width - n :])
    return outs, row_reads


def decode_together(
    layer_idx: int,
    query: torch.Tensor,  # [R, heads, 1, d]: one arriving token per request
    requests: list[tuple[torch.Tensor, torch.Tensor, np.ndarray | None, AttentionState]],
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of one layer for ``R`` requests without budgets, in one call:
    ``(out [R, heads, d], reads [R])`` (under budgets requests decode in the layer's HeldCache).

    ``requests[r]``: request ``r``'s keys and values ``[1, kv_heads, n_r, d]`` (the arriving token's
    last), which of them its DA mode lets it read (``[n_r]`` bool, or None) and its
    :class:`~rollouts.selective.attention.AttentionState`, whose running ``F`` sums for the layer are read
    and written back. The requests are right-aligned in one ``[R, kv_heads, L, d]`` batch
    (``L = max n_r``): each arriving token is the last key, as Selective Attention's query over a cache
    expects, and the padding in front is hidden by the attention mask, so it is neither attended, selected
    nor held. The same function as one request at a time (:func:`selective_attention_forward`), one call
    instead of ``R``.
    """
    lengths = [keys.shape[2] for keys, *_ in requests]
    width, device = max(lengths), query.device
    for (*_, state), n in zip(requests, lengths):
        accumulator = state.accumulators.get(layer_idx)
        if accumulator is None or accumulator.total is None or accumulator.total.shape[-1] != n - 1:
            raise RuntimeError("decoding continues a prefill run with the same AttentionState")

    def right_aligned(rows: list[torch.Tensor]) -> torch.Tensor:  # [n_r, ...] each -> [R, L, ...]
        return pad_sequence(rows, batch_first=True, padding_side="left")

    keys = right_aligned([k[0].transpose(0, 1) for k, *_ in requests]).transpose(1, 2)  # [R, kv_heads, L, d]
    values = right_aligned([v[0].transpose(0, 1) for _, v, *_ in requests]).transpose(1, 2)
    pads = torch.tensor([width - n for n in lengths], device=device)
    visible = torch.arange(width, device=device)[None, :] >= pads[:, None]  # [R, L]
    for r, ((*_, da_keys, _), n) in enumerate(zip(requests, lengths)):
        if da_keys is not None:
            visible[r, width - n :] = torch.from_numpy(da_keys).to(device)
    total = right_aligned([state.accumulators[layer_idx].total[0] for *_, state in requests])  # [R, L - 1]
    together = AttentionState()
    together.accumulators[layer_idx] = MaskAccumulator()
    together.accumulators[layer_idx].total = total
    out, _ = selective_attention_forward(
        types.SimpleNamespace(layer_idx=layer_idx),
        query,
        keys,
        values,
        visible[:, None, None, :],
        scaling=scaling,
        heed_state=together,
    )
    total = together.accumulators[layer_idx].total  # [R, L]
    for r, ((_, _, _, state), n) in enumerate(zip(requests, lengths)):
        state.accumulators[layer_idx].total = total[r : r + 1, width - n :]
    return out[:, 0], together.kv_reads[layer_idx][:, 0]

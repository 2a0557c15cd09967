"""The DA mask inside vLLM: a general plugin that shortens each DA request's block table per decode step.

The idea (the paper's): stock paged-attention kernels read KV through a per-request block table and a
sequence length. Hand them, for one decode step, a table that lists only the blocks the request may
see (scaffold, the chunks its mode allows, its generated blocks; the tail block holding the current
token last) and the matching shortened length, and they read exactly those blocks — no kernel change.

Per decode step (query length 1) of a DA request, in the worker::

    _prepare_inputs          (vLLM fills positions, query_start_loc, the persistent block table)
      -> plan: advance the request's VisibilityTracker with its newest token; keep its visible
         block indices and kv_tokens (rollouts.masks.visibility, the single source of truth)
    _build_attention_metadata
      -> AttentionGroup.build_metadata(common_attn_metadata)   [every backend's builder.build()]
         gets a rewritten *copy* of CommonAttentionMetadata: block_table_tensor (kept blocks, tail
         last), seq_lens and seq_lens_cpu_upper_bound = kv_tokens, max_seq_len, and a reset
         _num_computed_tokens_cache.

Everything else is left alone: ``slot_mapping`` still points into the real table, so the new token's
KV goes to its real slot; positions are absolute, so RoPE is right (keys were rotated when written).
The persistent block table is never edited — on CPU the "device" table *is* that buffer.

Hook points (verified on vLLM 0.32.0, V1 model runner; ``CPUModelRunner`` inherits the first three):

- ``GPUModelRunner._update_states`` (``vllm/v1/worker/gpu_model_runner.py``): free finished requests;
- ``GPUModelRunner._prepare_inputs``: plan the step (real steps only: dummy runs never call it);
- ``GPUModelRunner._build_attention_metadata``: scope the rewrite to this call, never to CUDA-graph
  capture;
- ``GPUModelRunner._dummy_run``: a Selective Attention model's dummy batches run the backend's kernel;
- ``AttentionGroup.build_metadata`` (``vllm/v1/worker/utils.py``): the rewrite, before the backend's
  ``build()`` (the CPU builder derives its scheduler metadata from ``seq_lens``). Backend neutral:
  CPU_ATTN here, FlashAttention/FlashInfer on GPUs (keep GPUs on V1: ``VLLM_USE_V2_MODEL_RUNNER=0``);
- ``InputProcessor.process_inputs`` (``vllm/v1/engine/input_processor.py``): validate every DA request
  at submission, on the driver or API server (``rollouts.engines.da_args``), and salt its prefix cache;
- ``WorkerBase`` gains ``heed_da_*`` / ``heed_sa_*`` methods the driver calls by name through
  ``collective_rpc``.

A Selective Attention checkpoint (``selective_attention: true``) also gets its attention computed by Heed
(:mod:`rollouts.engines.vllm_selective`): ``_prepare_inputs`` plans its step after the DA plan (a masked
row's visible keys come from the same tracker), ``_update_states`` releases its finished requests.

Decisions and limits (each enforced, none silent):

- Prefill runs unmasked: prompt rows are never masked (docs/ARCHITECTURE.md, contract 3: tag timing).
- Preemption: a preempted request is re-prefilled, and vLLM's prefill cannot apply a per-token
  mask to the generated tokens it recomputes. The worker refuses — it raises ``DAMaskLost`` naming
  the request — rather than continue on KV the request never decoded under. Size the KV cache so
  running requests are not preempted. (A resumed request whose generated blocks all hit the prefix
  cache needs no recompute and continues correctly: its own salted blocks are masked KV.)
- Prefix caching stays on: ``da`` requests get a layout-derived ``cache_salt`` (see da_args).
- Refused for DA requests, at submission: speculative decoding (drafts verified as multi-token
  queries), async scheduling (the step's token is not on the host when metadata is built),
  full CUDA graphs (captured metadata; PIECEWISE and eager are fine), micro-batching/DBO and
  context parallelism (they split or shard the metadata), model runner V2 (these hooks are V1),
  n > 1. The worker also refuses hybrid/sliding-window KV layouts (it needs exactly one
  full-attention KV cache group) and cascade attention (removed in 0.32; checked anyway).
- A request that fails validation is rejected alone with ``VLLMValidationError`` (HTTP 400 when
  served); the engine keeps serving the others.

``register()`` is cheap and idempotent: it imports nothing from vLLM, it patches each module when
that module is imported (in every process vLLM loads plugins into). Requests without DA run
through the original code paths, with one dict lookup per request per step added.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import logging
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from rollouts.masks.visibility import VisibilityTracker
from rollouts.protocol.layout import LayoutError, PromptLayout
from rollouts.protocol.tokens import token_bytes_table

from .da_args import LAYOUT_KEY, MODE_KEY, DASpec, da_cache_salt, read_da_args
from .vllm_selective import SelectiveWorkerState, is_selective, selective_problems

logger = logging.getLogger(__name__)

VERIFIED_VLLM_VERSION = "0.32.0"
_STATE_ATTR = "_heed_da_state"
_SA_STATE_ATTR = "_heed_sa_state"  # a SelectiveWorkerState, or False for a standard model
_PATCHED = "__heed_da_patched__"
_MAX_FINISHED_REPORTS = 65536  # accounting kept for the driver to collect; oldest dropped first


class DAMaskLost(RuntimeError):
    """A DA request would run a step whose mask vLLM cannot apply (re-prefill after preemption)."""


class DAUnsupported(RuntimeError):
    """The engine runs with a feature the DA mask is not compatible with."""


# -- registration --------------------------------------------------------------------------------

_registered = False
_register_lock = threading.Lock()


def register() -> None:
    """The ``vllm.general_plugins`` entry point: arrange for the hooks to be installed."""
    global _registered
    with _register_lock:
        if _registered:
            return
        _registered = True
        hooks = {
            "vllm.v1.engine.input_processor": _patch_input_processor,
            "vllm.v1.worker.gpu_model_runner": _patch_model_runner,
            "vllm.v1.worker.utils": _patch_attention_group,
            "vllm.v1.worker.worker_base": _add_worker_methods,
        }
        pending = {}
        for name, patch in hooks.items():
            module = sys.modules.get(name)
            if module is not None:
                _apply(patch, module)
            else:
                pending[name] = patch
        if pending:
            sys.meta_path.insert(0, _PatchOnImport(pending))
        logger.debug("heed DA plugin registered (verified on vLLM %s)", VERIFIED_VLLM_VERSION)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after a watched module executes, so registering costs no import."""

    def __init__(self, patches: dict):
        self._patches = patches

    def find_spec(self, fullname, path, target=None):
        patch = self._patches.pop(fullname, None)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _apply(patch, module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _apply(patch, module) -> None:
    """Install one module's hooks. A vLLM that moved them must keep working for everyone else: log
    loudly instead of raising (``VLLMEngine`` then refuses to start, see ``worker_hooks_installed``)."""
    try:
        _check_version()
        patch(module)
    except Exception:
        logger.exception("DA hooks not installed in %s: the DA mask is NOT applied", module.__name__)


@functools.cache
def _check_version() -> None:
    import vllm

    if not vllm.__version__.startswith(VERIFIED_VLLM_VERSION.rsplit(".", 1)[0] + "."):
        logger.warning(
            "the DA plugin was verified on vLLM %s; this is %s", VERIFIED_VLLM_VERSION, vllm.__version__
        )


def _wrap(cls, name: str, hook) -> None:
    """Replace ``cls.name`` by ``hook(original, self, *args, **kwargs)``, once."""
    original = getattr(cls, name)
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        return hook(original, self, *args, **kwargs)

    setattr(wrapper, _PATCHED, True)
    setattr(cls, name, wrapper)


def _patch_input_processor(module) -> None:
    _wrap(module.InputProcessor, "process_inputs", _process_inputs)


def _patch_model_runner(module) -> None:
    cls = module.GPUModelRunner
    _wrap(cls, "_update_states", _update_states)
    _wrap(cls, "_prepare_inputs", _prepare_inputs)
    _wrap(cls, "_build_attention_metadata", _build_attention_metadata)
    _wrap(cls, "_dummy_run", _dummy_run)


def _patch_attention_group(module) -> None:
    _wrap(module.AttentionGroup, "build_metadata", _build_metadata)


def _add_worker_methods(module) -> None:
    """Worker methods the driver reaches by name: ``llm.collective_rpc("heed_da_reports", args=(keys,))``.
    By name, because a multiprocess engine refuses pickled callables (VLLM_ALLOW_INSECURE_SERIALIZATION)."""
    for name, fn in WORKER_METHODS.items():
        if not hasattr(module.WorkerBase, name):
            setattr(module.WorkerBase, name, fn)


# -- submission (driver / API server) ------------------------------------------------------------


def engine_problems(vllm_config) -> list[str]:
    """Engine settings the DA mask cannot run under, each with what to change (empty if none); for a
    Selective Attention checkpoint, also those it cannot be served under."""
    problems = selective_problems(vllm_config)  # (speculative decoding among them, for such a checkpoint)
    if vllm_config.speculative_config is not None and not is_selective(vllm_config.model_config.hf_config):
        problems.append(
            "speculative decoding is on (drafts are verified without the mask); drop speculative_config"
        )
    if vllm_config.scheduler_config.async_scheduling:
        problems.append(
            "async scheduling is on (a step's token must be on the host before its attention metadata "
            "is built); pass async_scheduling=False"
        )
    mode = vllm_config.compilation_config.cudagraph_mode
    if mode is not None and mode.has_full_cudagraphs():
        problems.append(
            f"cudagraph_mode={mode.name} captures attention metadata; use PIECEWISE, NONE or enforce_eager=True"
        )
    parallel = vllm_config.parallel_config
    if parallel.use_ubatching:
        problems.append(
            "micro-batching (DBO) splits the attention metadata; disable enable_dbo / ubatch_size"
        )
    if parallel.decode_context_parallel_size > 1 or getattr(parallel, "prefill_context_parallel_size", 1) > 1:
        problems.append("context parallelism shards the KV sequence; run DA with context parallel size 1")
    if vllm_config.use_v2_model_runner:
        problems.append("model runner V2 is in use; the DA hooks are on V1: set VLLM_USE_V2_MODEL_RUNNER=0")
    return problems


def _reject(message: str):
    from vllm.exceptions import VLLMValidationError

    return VLLMValidationError(f"DA request rejected: {message}", parameter="extra_args")


def admit_request(vllm_config, request, problems: list[str] | None = None) -> DASpec | None:
    """Validate one ``EngineCoreRequest`` and salt its prefix cache; raises ``VLLMValidationError``. Every
    request to a Selective Attention checkpoint is rejected while the engine runs with settings it cannot
    be served under (:func:`~rollouts.engines.vllm_selective.selective_problems`).

    ``problems``: :func:`engine_problems` of ``vllm_config`` if already computed.
    """
    if sa_problems := selective_problems(vllm_config):  # every request, DA or not
        from vllm.exceptions import VLLMValidationError

        raise VLLMValidationError(
            "request rejected: this Selective Attention checkpoint cannot run on this engine: "
            + "; ".join(sa_problems),
            parameter="model",
        )
    params = request.sampling_params
    extra = params.extra_args if params is not None else None
    if not extra or (LAYOUT_KEY not in extra and MODE_KEY not in extra) or extra.get(MODE_KEY) == "vanilla":
        return None
    if request.prompt_token_ids is None:
        raise _reject("DA needs a token-id prompt, not prompt embeddings")
    try:
        spec = read_da_args(extra, request.prompt_token_ids)
    except LayoutError as err:
        raise _reject(str(err)) from None
    if spec is None:
        return None
    block_size = vllm_config.cache_config.block_size
    if spec.layout.block_size != block_size:
        raise _reject(
            f"the layout is aligned to block_size={spec.layout.block_size} but the engine's KV block "
            f"size is {block_size}; lay the prompt out with build_prompt(..., block_size={block_size})"
        )
    if params.n != 1:
        raise _reject("n must be 1 (accounting is per request); submit n copies instead")
    problems = engine_problems(vllm_config) if problems is None else problems
    if problems:
        raise _reject("; ".join(problems))
    if spec.masked and vllm_config.cache_config.enable_prefix_caching:
        salt = da_cache_salt(spec)
        if request.cache_salt != salt:
            request.cache_salt = salt if not request.cache_salt else f"{request.cache_salt}|{salt}"
    return spec


def _process_inputs(original, processor, *args, **kwargs):
    request = original(processor, *args, **kwargs)
    problems = processor.__dict__.get("_heed_da_problems")
    if problems is None:  # the engine's settings do not change while it serves
        problems = processor._heed_da_problems = engine_problems(processor.vllm_config)
    admit_request(processor.vllm_config, request, problems)
    return request


# -- the worker: per-request trackers and the per-step rewrite -----------------------------------


@dataclass
class _TrackedRequest:
    """One DA request in the worker: its tracker and what each decode forward was handed."""

    spec: DASpec
    token_table: list[bytes]
    tracker: VisibilityTracker = field(init=False)
    kv_tokens: list[int] = field(default_factory=list)  # [steps] seq_len handed to attention

    def __post_init__(self):
        self.tracker = VisibilityTracker(self.spec.layout, self.token_table)

    @property
    def prompt_len(self) -> int:
        return self.spec.layout.prompt_len

    def sync(self, position: int, output_token_ids: list[int]) -> None:
        """Bring the tracker to the forward at ``position`` (normally one ``advance``)."""
        tracker = self.tracker
        if tracker.position > position:  # a step computed again: replay from the start (rare)
            tracker = self.tracker = VisibilityTracker(self.spec.layout, self.token_table)
        while tracker.position < position:
            j = tracker.position + 1 - self.prompt_len
            if j >= len(output_token_ids):
                raise RuntimeError(
                    f"DA request {self.spec.key}: forward at position {position} but only "
                    f"{len(output_token_ids)} generated tokens are known to the worker"
                )
            token = output_token_ids[j]
            if token < 0:
                raise DAUnsupported(
                    "a placeholder token reached the DA tracker: async scheduling must be off for DA"
                )
            tracker.advance(token)

    def record(self, position: int, kv_tokens: int) -> None:
        j = position - self.prompt_len
        del self.kv_tokens[j:]
        self.kv_tokens.extend([-1] * (j - len(self.kv_tokens)))  # unobserved steps, never expected
        self.kv_tokens.append(kv_tokens)

    def report(self) -> dict[str, Any]:
        return {"mode": self.spec.mode, "prompt_len": self.prompt_len, "kv_tokens": self.kv_tokens}


@dataclass
class _Rewrite:
    """One step's attention rewrite for the masked rows of the batch."""

    rows: list[int]  # batch rows of masked decode requests
    blocks: list[np.ndarray]  # per row: visible logical block indices, tail last
    kv_tokens: list[int]  # per row: the shortened seq_len
    block_table: np.ndarray  # [max_reqs, max_blocks] int32: the persistent table's host copy
    num_reqs: int  # real (unpadded) rows in the batch
    _last: tuple | None = None

    def apply(self, cm):
        """A copy of ``cm`` (CommonAttentionMetadata) that reads only the visible blocks."""
        if self._last is not None and self._last[0] is cm:
            return self._last[1]  # several attention groups share one metadata object
        table = cm.block_table_tensor
        device = table.device
        rows_np = np.asarray(self.rows, dtype=np.int64)
        host_rows = self.block_table[rows_np, : table.shape[1]].copy()
        for r, visible in enumerate(self.blocks):
            host_rows[r, : len(visible)] = self.block_table[self.rows[r], visible]
        rows = torch.from_numpy(rows_np).to(device)
        kv = torch.tensor(self.kv_tokens, dtype=cm.seq_lens.dtype)

        table = table.clone()
        table[rows] = torch.from_numpy(host_rows).to(device, dtype=table.dtype)
        seq_lens = cm.seq_lens.clone()
        seq_lens[rows] = kv.to(device)
        upper = cm.seq_lens_cpu_upper_bound
        max_seq_len = cm.max_seq_len
        if upper is not None:
            upper = upper.clone()
            upper[torch.from_numpy(rows_np)] = kv.to(upper.dtype)
            max_seq_len = int(upper[: self.num_reqs].max())
        new = replace(
            cm,
            block_table_tensor=table,
            seq_lens=seq_lens,
            seq_lens_cpu_upper_bound=upper,
            max_seq_len=max_seq_len,
            _num_computed_tokens_cache=None,
        )
        self._last = (cm, new)
        return new


_ACTIVE_REWRITE: contextvars.ContextVar[_Rewrite | None] = contextvars.ContextVar(
    "heed_da_rewrite", default=None
)


class DAWorkerState:
    """Per-worker DA state: trackers keyed by vLLM request id, accounting of finished requests."""

    def __init__(self):
        self.requests: dict[str, _TrackedRequest | None] = {}  # None: seen, not a DA request
        self.live: dict[str, _TrackedRequest] = {}  # by accounting key, until released or collected
        self.finished: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.pending: _Rewrite | None = None
        self._token_table: list[bytes] | None = None
        self._checked = False

    # request lifecycle
    def lookup(self, runner, req_id: str) -> _TrackedRequest | None:
        if req_id in self.requests:
            return self.requests[req_id]
        state = runner.requests[req_id]
        params = state.sampling_params
        try:
            spec = read_da_args(params.extra_args if params else None, state.prompt_token_ids or ())
        except LayoutError as err:  # admission validates first; reaching here means it was bypassed
            raise LayoutError(f"DA request {req_id} reached the worker with a bad layout: {err}") from None
        if spec is None:
            self.requests[req_id] = None
            return None
        if not self._checked:
            problems = runner_problems(runner, spec.layout)
            if problems:
                raise DAUnsupported("the DA mask cannot run on this engine: " + "; ".join(problems))
            self._checked = True
        tracked = self.requests[req_id] = _TrackedRequest(spec, self.token_table(runner))
        if spec.key is not None:
            self.live[spec.key] = tracked
        return tracked

    def release(self, req_ids) -> None:
        for req_id in req_ids:
            tracked = self.requests.pop(req_id, None)
            if tracked is None or tracked.spec.key is None:
                continue
            if self.live.pop(tracked.spec.key, None) is tracked:  # not collected while live
                self.finished[tracked.spec.key] = tracked.report()
                while len(self.finished) > _MAX_FINISHED_REPORTS:
                    self.finished.popitem(last=False)

    def pop_reports(self, keys) -> dict[str, dict[str, Any]]:
        """Reports of finished requests by key. A request the scheduler has finished may still be
        live here: the worker learns of it with the *next* step, which never comes when it was the
        last one. Its forwards are all done, so its report is complete; it is collected now."""
        out = {}
        for key in keys:
            if key in self.finished:
                out[key] = self.finished.pop(key)
            elif key in self.live:
                out[key] = self.live.pop(key).report()
        return out

    def token_table(self, runner) -> list[bytes]:
        if self._token_table is None:
            from vllm.tokenizers.registry import cached_tokenizer_from_config

            tokenizer = cached_tokenizer_from_config(runner.model_config)
            if tokenizer is None:
                raise DAUnsupported(
                    "DA parses generated text: the engine needs a tokenizer (skip_tokenizer_init=False)"
                )
            self._token_table = token_bytes_table(tokenizer)
        return self._token_table

    # the step
    def plan_step(self, runner) -> None:
        """Advance the trackers of this step's DA decode rows and stage the rewrite."""
        self.pending = None
        batch = runner.input_batch
        req_ids = batch.req_ids
        query_start = runner.query_start_loc.np
        computed = batch.num_computed_tokens_cpu
        rows, blocks, kvs = [], [], []
        for i, req_id in enumerate(req_ids):
            tracked = self.lookup(runner, req_id)
            if tracked is None:
                continue
            start = int(computed[i])
            query_len = int(query_start[i + 1] - query_start[i])
            if start + query_len <= tracked.prompt_len:
                continue  # prompt rows: prefill is unmasked
            if query_len != 1:
                if not tracked.spec.masked:  # da-nm: a causal re-prefill recomputes what decoding wrote
                    for position in range(max(start, tracked.prompt_len), start + query_len):
                        tracked.record(position, position + 1)
                    continue
                raise DAMaskLost(
                    f"DA request {tracked.spec.key or req_id} is being prefilled over generated positions "
                    f"{max(start, tracked.prompt_len)}..{start + query_len - 1}, which vLLM computes without "
                    "the DA mask. This is a re-prefill after preemption: give the engine enough KV cache "
                    "that running requests are not preempted (VLLM_CPU_KVCACHE_SPACE / "
                    "gpu_memory_utilization, or a lower max_num_seqs)."
                )
            tracked.sync(start, runner.requests[req_id].output_token_ids)
            if tracked.spec.masked:
                kv = tracked.tracker.kv_tokens
                rows.append(i)
                blocks.append(tracked.tracker.visible_blocks.copy())
                kvs.append(kv)
            else:
                kv = start + 1  # da-nm: full causal attention, as vLLM computes it
            tracked.record(start, kv)
        if rows:
            table = batch.block_table[0].get_numpy_array()
            self.pending = _Rewrite(rows, blocks, kvs, table, len(req_ids))

    def take_rewrite(self) -> _Rewrite | None:
        rewrite, self.pending = self.pending, None
        return rewrite


def runner_problems(runner, layout: PromptLayout) -> list[str]:
    """What keeps this model runner from applying the DA mask (empty if nothing)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, UniformTypeKVCacheSpecs

    problems = engine_problems(runner.vllm_config)
    if getattr(runner, "use_async_scheduling", False) and not any("async" in p for p in problems):
        problems.append("async scheduling is on; pass async_scheduling=False")
    if getattr(runner, "cascade_attn_enabled", False):
        problems.append("cascade attention is on; disable it")
    groups = runner.kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        problems.append(
            f"the model has {len(groups)} KV cache groups (hybrid or sliding-window layers); DA needs "
            "one full-attention group"
        )
    else:
        spec = groups[0].kv_cache_spec
        specs = list(spec.kv_cache_specs.values()) if isinstance(spec, UniformTypeKVCacheSpecs) else [spec]
        for s in specs:
            if type(s) is not FullAttentionSpec or s.sliding_window is not None:
                problems.append(f"KV cache spec {type(s).__name__} is not plain full attention")
                break
        if spec.block_size != layout.block_size:
            problems.append(f"KV block size {spec.block_size} != layout block size {layout.block_size}")
    return problems


def _state(runner) -> DAWorkerState:
    state = runner.__dict__.get(_STATE_ATTR)
    if state is None:
        state = DAWorkerState()
        setattr(runner, _STATE_ATTR, state)
    return state


def _selective_state(runner) -> SelectiveWorkerState | None:
    """The Selective Attention state of a runner whose model is one (installed on first use), else None."""
    state = runner.__dict__.get(_SA_STATE_ATTR)
    if state is None:
        selective = is_selective(runner.model_config.hf_config)
        state = SelectiveWorkerState(runner) if selective else False
        setattr(runner, _SA_STATE_ATTR, state)
    return state or None


def _update_states(original, runner, scheduler_output, *args, **kwargs):
    state = runner.__dict__.get(_STATE_ATTR)
    if state is not None and scheduler_output.finished_req_ids:
        state.release(scheduler_output.finished_req_ids)
    selective = runner.__dict__.get(_SA_STATE_ATTR)
    if selective:
        selective.step = None  # planned again by this step's _prepare_inputs
        selective.release(scheduler_output.finished_req_ids)
    return original(runner, scheduler_output, *args, **kwargs)


def _dummy_run(original, runner, *args, **kwargs):
    selective = runner.__dict__.get(_SA_STATE_ATTR)
    if selective:  # warm-up, profiling, idle data-parallel ranks: no requests, the backend's own kernel
        selective.step = None
    return original(runner, *args, **kwargs)


def _prepare_inputs(original, runner, *args, **kwargs):
    out = original(runner, *args, **kwargs)
    da_state = _state(runner)
    da_state.plan_step(runner)
    selective = _selective_state(runner)
    if selective is not None:
        selective.plan_step(runner, da_state)
    return out


def _build_attention_metadata(original, runner, *args, **kwargs):
    state = runner.__dict__.get(_STATE_ATTR)
    if state is None or state.pending is None or kwargs.get("for_cudagraph_capture", False):
        return original(runner, *args, **kwargs)
    token = _ACTIVE_REWRITE.set(state.take_rewrite())
    try:
        return original(runner, *args, **kwargs)
    finally:
        _ACTIVE_REWRITE.reset(token)


def _build_metadata(original, group, common_attn_metadata, *args, **kwargs):
    rewrite = _ACTIVE_REWRITE.get()
    if rewrite is not None:
        common_attn_metadata = rewrite.apply(common_attn_metadata)
    return original(group, common_attn_metadata, *args, **kwargs)


# -- driver-side access to the worker (collective_rpc by method name) ------------------------------


def pop_da_reports(worker, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Finished requests' KV-read accounting, by key (``heed_da_reports`` on the worker).

    Each report: ``mode``, ``prompt_len`` and ``kv_tokens`` — the ``seq_len`` attention was handed at
    every decode forward (positions ``prompt_len ..``), i.e. ``CompletionTrace.kv_tokens[1:]`` in
    ``da`` mode and ``kv_tokens_vanilla[1:]`` in ``da-nm``.
    """
    state = worker.model_runner.__dict__.get(_STATE_ATTR)
    return {} if state is None else state.pop_reports(keys)


def pop_sa_reports(worker, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Selective Attention requests' per-layer KV reads, by ``extra_args["heed_sa_key"]``
    (``heed_sa_reports`` on the worker): ``kv_tokens_per_layer`` ``[n][L]`` under budgets, else empty."""
    state = worker.model_runner.__dict__.get(_SA_STATE_ATTR)
    return state.pop_reports(keys) if state else {}


def worker_hooks_installed(worker) -> bool:
    """Whether this worker's model runner is hooked (``heed_da_hooks_installed`` on the worker).

    Where the engine runs in other processes, only the entry point can install the hooks there; a
    driver that registered the plugin itself would otherwise validate requests nobody masks.
    """
    runner_cls = type(worker.model_runner)
    return all(
        getattr(getattr(runner_cls, name, None), _PATCHED, False)
        for name in ("_update_states", "_prepare_inputs", "_build_attention_metadata")
    )


def live_da_requests(worker) -> int:
    """DA requests the worker still tracks, 0 when idle (``heed_da_live_requests`` on the worker)."""
    state = worker.model_runner.__dict__.get(_STATE_ATTR)
    return 0 if state is None else sum(t is not None for t in state.requests.values())


WORKER_METHODS = {
    "heed_da_reports": pop_da_reports,
    "heed_sa_reports": pop_sa_reports,
    "heed_da_hooks_installed": worker_hooks_installed,
    "heed_da_live_requests": live_da_requests,
}

"""The model runner's hooks: when each step's DA plan runs, the scope of its rewrite, what the driver reads.

:mod:`rollouts.engines.vllm_plugin` installs them (its docstring lists the hook points and the vLLM
version they were verified on); each receives the original method first and calls it. The runner
carries its :class:`~rollouts.engines.vllm_da_worker.DAWorkerState` (and, for a Selective Attention
model, its :class:`~rollouts.engines.vllm_selective.SelectiveWorkerState`) as an attribute, installed
on first use; the functions at the end read them for the driver, which calls them by name through
``collective_rpc``. A step's rewrite lives in a context variable for the one
``_build_attention_metadata`` call it was planned for, so CUDA-graph capture and dummy runs never see it.
"""

from __future__ import annotations

import contextvars
from typing import Any

from rollouts.selective.eviction import load_budgets

from .vllm_da_worker import DAWorkerState
from .vllm_rewrite import AttentionRewrite
from .vllm_selective import SelectiveWorkerState, freed_kv_specs, is_selective

_STATE_ATTR = "_heed_da_state"
_SA_STATE_ATTR = "_heed_sa_state"  # a SelectiveWorkerState, or False for a standard model

_ACTIVE_REWRITE: contextvars.ContextVar[AttentionRewrite | None] = contextvars.ContextVar(
    "heed_da_rewrite", default=None
)


def _state(runner) -> DAWorkerState:
    state = runner.__dict__.get(_STATE_ATTR)
    if state is None:
        # A Selective Attention model applies the DA mask in its own attention function: no table rewrite
        state = DAWorkerState(rewrites_tables=not is_selective(runner.model_config.hf_config))
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


def selective_counters(worker) -> dict[str, Any]:
    """A vLLM worker's Selective Attention counters, for ``llm.collective_rpc(selective_counters)``:
    ``path`` (which path it runs, and whether vLLM frees the KV blocks), ``prefilled_again`` (requests
    preempted and prefilled again) and ``decode_held_peak`` (per layer, the most keys a decoding request
    held in the plugin's KV). Empty for a standard model."""
    state = worker.model_runner.__dict__.get(_SA_STATE_ATTR)
    if not state:
        return {}
    return {
        "path": state.path,
        "prefilled_again": state.prefilled_again,
        "decode_held_peak": list(state.decode_held_peak),
    }


def get_kv_cache_spec(original, runner):
    """``GPUModelRunner.get_kv_cache_spec``: a Selective Attention model under budgets never reads vLLM's
    paged cache back, so each layer asks for a one-token sliding window (:func:`freed_kv_specs`) and vLLM
    frees the blocks behind it."""
    specs = original(runner)
    hf_config = runner.model_config.hf_config
    if is_selective(hf_config) and load_budgets(hf_config) is not None:
        return freed_kv_specs(specs)
    return specs


def update_states(original, runner, scheduler_output, *args, **kwargs):
    """``GPUModelRunner._update_states``: release finished requests (their accounting waits for the driver)."""
    state = runner.__dict__.get(_STATE_ATTR)
    if state is not None and scheduler_output.finished_req_ids:
        state.release(scheduler_output.finished_req_ids)
    selective = runner.__dict__.get(_SA_STATE_ATTR)
    if selective:
        selective.step = None  # planned again by this step's _prepare_inputs
        selective.release(scheduler_output.finished_req_ids)
    return original(runner, scheduler_output, *args, **kwargs)


def dummy_run(original, runner, *args, **kwargs):
    """``GPUModelRunner._dummy_run``: a Selective Attention model's dummy batches run the backend's kernel."""
    selective = runner.__dict__.get(_SA_STATE_ATTR)
    if selective:  # warm-up, profiling, idle data-parallel ranks: no requests, the backend's own kernel
        selective.step = None
    return original(runner, *args, **kwargs)


def prepare_inputs(original, runner, *args, **kwargs):
    """``GPUModelRunner._prepare_inputs``: plan the step once vLLM has filled positions and the block
    table; a Selective Attention model's plan follows the DA plan, whose tracker gives its visible keys."""
    out = original(runner, *args, **kwargs)
    da_state = _state(runner)
    da_state.plan_step(runner)
    selective = _selective_state(runner)
    if selective is not None:
        selective.plan_step(runner, da_state)
    return out


def build_attention_metadata(original, runner, *args, **kwargs):
    """``GPUModelRunner._build_attention_metadata``: the staged rewrite is active for this call only."""
    state = runner.__dict__.get(_STATE_ATTR)
    if state is None or state.pending is None or kwargs.get("for_cudagraph_capture", False):
        return original(runner, *args, **kwargs)
    token = _ACTIVE_REWRITE.set(state.take_rewrite())
    try:
        return original(runner, *args, **kwargs)
    finally:
        _ACTIVE_REWRITE.reset(token)


def build_metadata(original, group, common_attn_metadata, *args, **kwargs):
    """``AttentionGroup.build_metadata``: apply the active rewrite before the backend's ``build()``."""
    rewrite = _ACTIVE_REWRITE.get()
    if rewrite is not None:
        common_attn_metadata = rewrite.apply(common_attn_metadata)
    return original(group, common_attn_metadata, *args, **kwargs)


# -- the driver reads the worker (collective_rpc by method name) ---------------------------------


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


def live_da_requests(worker) -> int:
    """DA requests the worker still tracks, 0 when idle (``heed_da_live_requests`` on the worker)."""
    state = worker.model_runner.__dict__.get(_STATE_ATTR)
    return 0 if state is None else sum(t is not None for t in state.requests.values())

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

The plugin, one idea a module:

- this module: registration, the entry point that installs the hooks below;
- :mod:`~rollouts.engines.vllm_admission`: which requests the engine admits, at submission;
- :mod:`~rollouts.engines.vllm_hooks`: the model runner's hooks and the worker methods the driver calls;
- :mod:`~rollouts.engines.vllm_da_worker`: the worker's per-request trackers, each step's plan, the
  accounting;
- :mod:`~rollouts.engines.vllm_rewrite`: the step's rewritten copy of the attention metadata (what is
  rewritten and what is left alone);
- :mod:`~rollouts.engines.vllm_selective`: Selective Attention's own attention function.

Hook points (verified on vLLM 0.32.0, V1 model runner; ``CPUModelRunner`` inherits the first three):

- ``GPUModelRunner._update_states`` (``vllm/v1/worker/gpu_model_runner.py``): free finished requests;
- ``GPUModelRunner._prepare_inputs``: plan the step (real steps only: dummy runs never call it);
- ``GPUModelRunner._build_attention_metadata``: scope the rewrite to this call, never to CUDA-graph
  capture;
- ``GPUModelRunner._dummy_run``: a Selective Attention model's dummy batches run the backend's kernel;
- ``GPUModelRunner.get_kv_cache_spec``: a Selective Attention model under budgets asks for a one-token
  sliding window, so that vLLM frees the blocks its attention never reads;
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

import functools
import importlib.abc
import logging
import sys
import threading

from . import vllm_hooks
from .vllm_admission import process_inputs

logger = logging.getLogger(__name__)

VERIFIED_VLLM_VERSION = "0.32.0"
_PATCHED = "__heed_da_patched__"


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
    _wrap(module.InputProcessor, "process_inputs", process_inputs)


def _patch_model_runner(module) -> None:
    cls = module.GPUModelRunner
    _wrap(cls, "_update_states", vllm_hooks.update_states)
    _wrap(cls, "_prepare_inputs", vllm_hooks.prepare_inputs)
    _wrap(cls, "_build_attention_metadata", vllm_hooks.build_attention_metadata)
    _wrap(cls, "_dummy_run", vllm_hooks.dummy_run)
    _wrap(cls, "get_kv_cache_spec", vllm_hooks.get_kv_cache_spec)


def _patch_attention_group(module) -> None:
    _wrap(module.AttentionGroup, "build_metadata", vllm_hooks.build_metadata)


def _add_worker_methods(module) -> None:
    """Worker methods the driver reaches by name: ``llm.collective_rpc("heed_da_reports", args=(keys,))``.
    By name, because a multiprocess engine refuses pickled callables (VLLM_ALLOW_INSECURE_SERIALIZATION)."""
    for name, fn in WORKER_METHODS.items():
        if not hasattr(module.WorkerBase, name):
            setattr(module.WorkerBase, name, fn)


# -- the worker methods the driver calls by name ---------------------------------------------------


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


WORKER_METHODS = {
    "heed_da_reports": vllm_hooks.pop_da_reports,
    "heed_sa_reports": vllm_hooks.pop_sa_reports,
    "heed_da_hooks_installed": worker_hooks_installed,
    "heed_da_live_requests": vllm_hooks.live_da_requests,
}

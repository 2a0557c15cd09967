"""The worker's DA state: a visibility tracker per request, each decode step's plan, the KV-read accounting.

Per real step (``_prepare_inputs``, after vLLM has filled positions and the persistent block table),
:meth:`DAWorkerState.plan_step` advances each DA decode row's
:class:`~rollouts.masks.visibility.VisibilityTracker` with the row's newest token (docs/ARCHITECTURE.md,
contract 3: tag timing), keeps its visible block indices and ``kv_tokens`` (the single source of truth,
contract 1), records what the forward is handed, and stages an
:class:`~rollouts.engines.vllm_rewrite.AttentionRewrite` for the masked rows. Prompt rows are never
masked. Finished requests' accounting waits here, by key, for the driver to collect.

What it refuses, loudly: a masked request prefilled again over its generated positions (``DAMaskLost``:
a re-prefill after preemption, which vLLM computes without the mask), and a runner whose KV layout
or settings the mask cannot run under (``DAUnsupported``, :func:`runner_problems`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from rollouts.masks.visibility import VisibilityTracker
from rollouts.protocol.layout import LayoutError, PromptLayout
from rollouts.protocol.tokens import token_bytes_table

from .da_args import DASpec, read_da_args
from .vllm_admission import engine_problems
from .vllm_rewrite import AttentionRewrite

_MAX_FINISHED_REPORTS = 65536  # accounting kept for the driver to collect; oldest dropped first


class DAMaskLost(RuntimeError):
    """A DA request would run a step whose mask vLLM cannot apply (re-prefill after preemption)."""


class DAUnsupported(RuntimeError):
    """The engine runs with a feature the DA mask is not compatible with."""


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


class DAWorkerState:
    """Per-worker DA state: trackers keyed by vLLM request id, accounting of finished requests."""

    def __init__(self, rewrites_tables: bool = True):
        # False for a Selective Attention model, whose attention function reads each row's visible keys itself
        self.rewrites_tables = rewrites_tables
        self.requests: dict[str, _TrackedRequest | None] = {}  # None: seen, not a DA request
        self.live: dict[str, _TrackedRequest] = {}  # by accounting key, until released or collected
        self.finished: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.pending: AttentionRewrite | None = None
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
            problems = runner_problems(runner, spec.layout, self.rewrites_tables)
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
        if rows and self.rewrites_tables:
            table = batch.block_table[0].get_numpy_array()
            self.pending = AttentionRewrite(rows, blocks, kvs, table, len(req_ids))

    def take_rewrite(self) -> AttentionRewrite | None:
        rewrite, self.pending = self.pending, None
        return rewrite


def runner_problems(runner, layout: PromptLayout, rewrites_tables: bool = True) -> list[str]:
    """What keeps this model runner from applying the DA mask (empty if nothing). The KV cache layout
    matters only where the mask is a block-table rewrite (``rewrites_tables``)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, UniformTypeKVCacheSpecs

    problems = engine_problems(runner.vllm_config)
    if getattr(runner, "use_async_scheduling", False) and not any("async" in p for p in problems):
        problems.append("async scheduling is on; pass async_scheduling=False")
    if getattr(runner, "cascade_attn_enabled", False):
        problems.append("cascade attention is on; disable it")
    if not rewrites_tables:
        return problems
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

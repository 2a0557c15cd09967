"""How many of vLLM's KV blocks each request holds, counted where vLLM decides it: the scheduler.

The worker's block table cannot say: it is append-only, and a block the manager freed (a sliding-window
group's, say) keeps its stale id there. The manager's own list (``req_to_blocks``) puts the null block in
a freed block's place. So :func:`watch_kv_blocks` wraps the engine core scheduler's ``schedule()`` for the
duration of a ``with`` block and, after each call, counts every running request's non-null blocks over all
KV cache groups, and the blocks the pool has handed out. It needs the engine core in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``); benches and tests use it, the serving path does not.

    with watch_kv_blocks(engine.llm) as blocks:
        engine.generate(requests)
    blocks.per_request_decoding  # the most blocks one request held once its prompt was computed
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class KVBlockCounts:
    """Peaks over the scheduler steps watched."""

    per_request_decoding: int = 0  # blocks one request held (all groups), at a step after its prompt
    per_request_prefilling: int = 0  # the same, at a step computing its prompt
    in_use: int = 0  # blocks out of the pool at once, over all requests
    num_groups: int = 0  # KV cache groups (each holds its own blocks for a request)
    block_size: int = 0  # tokens per block (of the first group)


@contextmanager
def watch_kv_blocks(llm):
    """Count, after every ``schedule()`` inside the block, the KV blocks of each running request."""
    try:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    except AttributeError:
        raise RuntimeError(
            "watch_kv_blocks needs the engine core in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0"
        ) from None
    manager = scheduler.kv_cache_manager
    groups = manager.coordinator.single_type_managers
    pool = manager.block_pool
    counts = KVBlockCounts(num_groups=len(groups), block_size=groups[0].block_size)
    schedule = scheduler.schedule

    def counted_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        for request in scheduler.running:
            # schedule() has already advanced num_computed_tokens by this step's tokens
            before = request.num_computed_tokens - out.num_scheduled_tokens.get(request.request_id, 0)
            held = sum(
                sum(not block.is_null for block in group.req_to_blocks.get(request.request_id, ()))
                for group in groups
            )
            if before >= request.num_prompt_tokens:
                counts.per_request_decoding = max(counts.per_request_decoding, held)
            else:
                counts.per_request_prefilling = max(counts.per_request_prefilling, held)
        counts.in_use = max(counts.in_use, pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())
        return out

    scheduler.schedule = counted_schedule  # on the instance: the class and other engines are untouched
    try:
        yield counts
    finally:
        del scheduler.schedule

"""Visibility (the single source of truth), KV accounting and training-side masks."""

from .accounting import KVShape, dtype_bytes
from .training import MaskBatch, block_training_mask, dense_training_mask, mask_batch, shared_mask_batch
from .visibility import (
    CompletionTrace,
    VisibilityTracker,
    causal_kv_tokens,
    kv_tokens_read,
    state_visibility,
    trace_completion,
    visible_chunks,
)

__all__ = [
    "CompletionTrace",
    "KVShape",
    "MaskBatch",
    "VisibilityTracker",
    "block_training_mask",
    "causal_kv_tokens",
    "dense_training_mask",
    "dtype_bytes",
    "kv_tokens_read",
    "mask_batch",
    "shared_mask_batch",
    "state_visibility",
    "trace_completion",
    "visible_chunks",
]

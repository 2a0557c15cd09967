"""Rollout engines: vLLM with the DA plugin (production), a transformers reference (oracle, fallback).

Importing this package imports neither vLLM nor transformers' models: vLLM loads
``rollouts.engines.vllm_plugin`` into every one of its processes, and the reference engine must work
where vLLM is absent.
"""

from __future__ import annotations

import importlib.util
import logging

from .base import RolloutRequest, build_trajectory, decode_text
from .da_args import DASpec, da_cache_salt, da_extra_args, da_request, read_da_args

logger = logging.getLogger(__name__)

__all__ = [
    "DASpec",
    "RolloutRequest",
    "build_trajectory",
    "da_cache_salt",
    "da_extra_args",
    "da_request",
    "decode_text",
    "make_engine",
    "read_da_args",
]


def make_engine(model: str, *, block_size: int = 32, backend: str = "auto", **kwargs):
    """A rollout engine for ``model``: ``VLLMEngine`` when vLLM is installed, else ``ReferenceEngine``.

    ``backend``: ``"vllm"``, ``"reference"`` or ``"auto"`` (vLLM if importable, otherwise the
    reference engine with a warning: it is correct but decodes one request at a time).
    """
    if backend not in ("auto", "vllm", "reference"):
        raise ValueError(f"backend must be 'auto', 'vllm' or 'reference', got {backend!r}")
    if backend == "auto":
        backend = "vllm" if importlib.util.find_spec("vllm") is not None else "reference"
        if backend == "reference":
            logger.warning(
                "vLLM is not installed: rollouts use the transformers reference engine (one request at "
                "a time, no paged KV cache). Install heed-rl[cpu] or heed-rl[gpu] for production speed."
            )
    if backend == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model, block_size=block_size, **kwargs)
    from .reference import ReferenceEngine

    return ReferenceEngine(model, **kwargs)

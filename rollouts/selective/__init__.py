"""Selective Attention (Leviathan, Kalman, Matias, arXiv 2410.02703): the model masks context itself.

- :mod:`~rollouts.selective.mask` -- the accumulated mask ``F``, its streaming form, the memory loss
  ``L_mem`` (the single source of truth).
- :mod:`~rollouts.selective.attention` -- ``F`` inside transformers' decoder models: the attention function
  and :func:`~rollouts.selective.attention.register_selective_attention`.
- :mod:`~rollouts.selective.kernel` -- the same attention as fused Triton kernels (CUDA).
- :mod:`~rollouts.selective.eviction` -- KV eviction under per-layer budgets: the mechanism and its
  scoring policies (Selective, H2O, TOVA).
- :mod:`~rollouts.selective.prefill` -- a prefill under a KV budget streamed over the held tokens (the vLLM
  path's; no ``[n, n]`` tensor).
- :mod:`~rollouts.selective.held_cache` -- many sequences decoding under a KV budget from one buffer per
  layer, a row each of what it holds (the vLLM path's).
- :mod:`~rollouts.selective.decode` -- a reference decoding loop with a compacted per-layer cache.
- :mod:`~rollouts.selective.constants` -- names and numbers, torch-free.

Importing them changes nothing in transformers: a process that builds or loads a Selective Attention model
calls :func:`~rollouts.selective.attention.register_selective_attention` first. The vLLM path is
:mod:`rollouts.engines.vllm_selective`, the training side :mod:`rl.selective`.
"""

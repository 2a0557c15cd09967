"""Which DA requests an engine admits, decided at submission on the driver or API server.

:func:`engine_problems` names the engine settings the DA mask cannot run under (and, for a Selective
Attention checkpoint, those it cannot be served under), each with what to change; the list and its
reasons are in :mod:`rollouts.engines.vllm_plugin` ("Decisions and limits"). :func:`admit_request`
validates one request (its layout through ``rollouts.engines.da_args``, its block size against the
engine's, ``n == 1``) and salts a masked request's prefix cache with its layout, so KV written under a
mask is never served to another request. A request that fails is rejected alone with
``VLLMValidationError`` (HTTP 400 when served); the engine keeps serving the others.
"""

from __future__ import annotations

from rollouts.protocol.layout import LayoutError

from .da_args import LAYOUT_KEY, MODE_KEY, DASpec, da_cache_salt, read_da_args
from .vllm_selective import is_selective, selective_problems


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


def process_inputs(original, processor, *args, **kwargs):
    """The hook on ``InputProcessor.process_inputs``: each request is admitted as it is submitted."""
    request = original(processor, *args, **kwargs)
    problems = processor.__dict__.get("_heed_da_problems")
    if problems is None:  # the engine's settings do not change while it serves
        problems = processor._heed_da_problems = engine_problems(processor.vllm_config)
    admit_request(processor.vllm_config, request, problems)
    return request

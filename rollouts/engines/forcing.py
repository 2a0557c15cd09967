"""Teacher forcing inside vLLM: make decoding emit given tokens while returning the model's log-probs.

Scoring a known completion (a gold DA trace, a trajectory to re-score after a weight update) must go
through the *decode* path, because that is where the DA mask lives: ``prompt_logprobs`` over
prompt + completion would run one unmasked prefill. So the completion is decoded token by token, and
at each step this logits processor leaves only the wanted token possible. vLLM computes the returned
log-probs from the raw logits *before* logits processors run (``logprobs_mode="raw_logprobs"``, the
default; verified on vLLM 0.32.0, ``vllm/v1/sample/sampler.py``), so they are the model's own.

vLLM 0.32's ``trace_decode_token_ids`` does the same but needs model runner V2, which cannot run on
CPU; this works on the V1 runner the plugin hooks.

Enable it per engine (``LLM(..., logits_processors=[ForcedTokensLogitsProcessor])``) and per request
with ``extra_args={"heed_force": [ids...]}`` (plus ``max_tokens=len(ids)``, ``ignore_eos=True`` to
emit exactly those tokens; with a larger ``max_tokens`` decoding continues after them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

FORCE_KEY = "heed_force"


class ForcedTokensLogitsProcessor(AdapterLogitsProcessor):
    """Forces step ``j`` of a request to emit ``extra_args["heed_force"][j]``."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        forced = (sampling_params.extra_args or {}).get(FORCE_KEY)
        if forced is None:
            return
        if not isinstance(forced, list) or not forced or not all(type(t) is int and t >= 0 for t in forced):
            raise ValueError(f"extra_args[{FORCE_KEY!r}] must be a non-empty list of token ids")
        if sampling_params.n != 1:
            raise ValueError(f"extra_args[{FORCE_KEY!r}] needs n=1")

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy decoding picks: that is the point

    def new_req_logits_processor(
        self, params: SamplingParams
    ) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        forced = (params.extra_args or {}).get(FORCE_KEY)
        if not forced:
            return None
        forced = list(forced)

        def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            step = len(output_ids)  # the list is live: it holds the tokens emitted so far
            token = forced[step] if step < len(forced) else -1
            if (
                0 <= token < logits.shape[-1]
            ):  # an id outside the vocabulary is left unforced, never raised on
                logits.fill_(float("-inf"))
                logits[token] = 0.0
            return logits

        return force

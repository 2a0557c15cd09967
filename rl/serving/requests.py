"""A served ``/v1/completions`` body -> the DA request the engine runs, laid out as ``heed eval`` lays it out.

Server-side layout: a client that has no Heed sends the question and the documents in ``vllm_xargs``
(flat JSON values, as vLLM's schema wants them) and an empty ``prompt``::

    "vllm_xargs": {
        "heed_question": "What is the special magic number?",
        "heed_documents": ["first document", "second document", ...],   one magic chunk each, in order
        "heed_mode": "da",                  optional: "da" (default) | "da-nm" | "vanilla"
        "heed_chunk_tokens": 2048           optional: the longest a document may be, in tokens
    }

The body is rewritten to what a token-id client sends — the layout's ``input_ids`` as the prompt and the
wire layout as ``heed_da`` — so the plugin admits and masks it like any other DA request. The layout is
``data.prompts.layout_example``'s (the function ``heed eval``, SFT and rollouts lay an example out with)
under the export's settings for the mode (``rl.policy_settings.layout_settings``,
``LayoutSettings.for_mode``): a served example reads the prompt its eval read, ``vanilla`` included (no DA
instructions, stock engine).

Token-id requests that carry their own wire layout (``heed_da``) are only tracked for accounting; the
plugin validates them at submission, and one that does not parse here goes to vLLM as sent (its 400
comes from there). Anything else is not a DA request and passes untouched.

Refused (``ServeRequestError``, HTTP 400, that request alone): a question or documents missing or of the
wrong type, an empty document, one longer than ``heed_chunk_tokens``, more documents than the context has
KV blocks, a ``prompt`` beside them, both a server-side and a wire layout, an unknown mode, ``n`` other
than 1 (accounting is per request) and ``echo``. A prompt longer than the model's context is refused by
vLLM itself, also with a 400. ``stream`` is served: the accounting rides on the final event
(``rl/serving/streaming.py``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from data.prompts import DEFAULT_CHUNK_TOKENS
from rollouts.engines.da_args import LAYOUT_KEY, MODE_KEY, da_extra_args, read_da_args
from rollouts.protocol.layout import LayoutError, LayoutSettings, PromptLayout
from rollouts.trajectory import ROLLOUT_MODES

QUESTION_KEY = "heed_question"
DOCUMENTS_KEY = "heed_documents"
CHUNK_TOKENS_KEY = "heed_chunk_tokens"
SERVER_LAYOUT_KEYS = (QUESTION_KEY, DOCUMENTS_KEY, CHUNK_TOKENS_KEY, MODE_KEY)


class ServeRequestError(ValueError):
    """A request the server refuses (HTTP 400); the message says what to change."""


@dataclass(frozen=True)
class DARequest:
    """A request the server accounts for: its layout, mode, the body to forward, and whether the client
    asked for token ids itself (else they are dropped from the response again)."""

    layout: PromptLayout
    mode: str
    body: dict[str, Any]
    client_wants_token_ids: bool
    chat: bool = False  # a chat request laid out as this completions body (rl/serving/chat.py)
    # the per-layer reads' key, for a Selective Attention model (with_selective_key)
    sa_key: str | None = None


def with_selective_key(request: DARequest) -> DARequest:
    """``request`` with a fresh accounting key in its ``vllm_xargs`` (``SA_KEY``, replacing any the client
    sent): a Selective Attention model's worker then keeps what each layer read for it, which the
    middleware collects once the completion is done."""
    from rollouts.engines.vllm_selective import SA_KEY

    key = uuid.uuid4().hex
    xargs = {**(request.body.get("vllm_xargs") or {}), SA_KEY: key}
    return replace(request, body={**request.body, "vllm_xargs": xargs}, sa_key=key)


def da_request(
    body: Any, tokenizer, settings: LayoutSettings, max_model_len: int | None = None
) -> DARequest | None:
    """The DA request ``body`` asks for, ``None`` if it is not one (or is vLLM's to refuse).

    ``max_model_len``: the engine's; more documents than it has KV blocks can never fit (each is at least
    one block-aligned chunk), so they are refused before anything is tokenized.
    """
    if not isinstance(body, dict) or not isinstance(body.get("vllm_xargs"), dict):
        return None
    xargs = body["vllm_xargs"]
    if QUESTION_KEY in xargs or DOCUMENTS_KEY in xargs:
        return _server_side_layout(body, xargs, tokenizer, settings, max_model_len)
    if LAYOUT_KEY in xargs:
        return _wire_layout(body, xargs)
    return None


def _server_side_layout(body: dict, xargs: dict, tokenizer, settings, max_model_len: int | None) -> DARequest:
    from data.prompts import layout_example

    if LAYOUT_KEY in xargs:
        raise ServeRequestError(
            f"send either {QUESTION_KEY}/{DOCUMENTS_KEY} (the server lays the prompt out) or a wire layout "
            f"in {LAYOUT_KEY} with token ids, not both"
        )
    question, documents = xargs.get(QUESTION_KEY), as_documents(xargs.get(DOCUMENTS_KEY))
    if not isinstance(question, str) or not question.strip():
        raise ServeRequestError(f"vllm_xargs.{QUESTION_KEY} must be a non-empty string")
    if not isinstance(documents, list) or not documents:
        raise ServeRequestError(f"vllm_xargs.{DOCUMENTS_KEY} must be a non-empty list of strings")
    if max_model_len is not None and len(documents) > max_model_len // settings.block_size:
        raise ServeRequestError(
            f"{len(documents)} documents cannot fit a {max_model_len}-token context: each takes at least one "
            f"{settings.block_size}-token KV block"
        )
    mode = xargs.get(MODE_KEY, "da")
    if mode not in ROLLOUT_MODES:
        raise ServeRequestError(
            f"vllm_xargs.{MODE_KEY} must be one of {', '.join(ROLLOUT_MODES)}, got {mode!r}"
        )
    if body.get("prompt") not in (None, "", []):
        raise ServeRequestError(
            f'the server lays the prompt out from {QUESTION_KEY} and {DOCUMENTS_KEY}: send prompt ""'
        )
    _check_single(body)
    example: dict[str, Any] = {"question": question, "documents": documents}
    if CHUNK_TOKENS_KEY in xargs:
        chunk_tokens = xargs[CHUNK_TOKENS_KEY]
        if type(chunk_tokens) is not int or chunk_tokens < 1:
            raise ServeRequestError(f"vllm_xargs.{CHUNK_TOKENS_KEY} must be a positive integer")
        example["chunk_tokens"] = chunk_tokens
    try:
        layout = layout_example(example, tokenizer, settings.for_mode(mode))
    except (LayoutError, TypeError) as err:  # documents of the wrong type, empty ones
        raise ServeRequestError(f"the documents cannot be laid out: {err}") from None
    except ValueError as err:  # a document longer than chunk_tokens (data.prompts.layout_example)
        raise ServeRequestError(
            f"the documents cannot be laid out: {err}; split long documents or raise "
            f"vllm_xargs.{CHUNK_TOKENS_KEY} (default {DEFAULT_CHUNK_TOKENS})"
        ) from None
    rest = {k: v for k, v in xargs.items() if k not in SERVER_LAYOUT_KEYS}
    if mode != "vanilla":  # vanilla runs on the stock engine: nothing attached
        wire = da_extra_args(layout, mode)
        rest |= {LAYOUT_KEY: json.dumps(wire[LAYOUT_KEY]), MODE_KEY: mode}  # vllm_xargs values are flat
    forwarded = {**body, "prompt": list(layout.input_ids), "return_token_ids": True}
    forwarded.pop("vllm_xargs")
    if rest:
        forwarded["vllm_xargs"] = rest
    return DARequest(layout, mode, forwarded, bool(body.get("return_token_ids")))


def _wire_layout(body: dict, xargs: dict) -> DARequest | None:
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not all(type(t) is int for t in prompt):
        return None  # not a single token-id prompt: passed on as before, without accounting
    try:
        spec = read_da_args(xargs, prompt)
    except LayoutError:
        return None  # the plugin refuses it at submission with its own message
    if spec is None:
        return None
    return DARequest(
        spec.layout, spec.mode, {**body, "return_token_ids": True}, bool(body.get("return_token_ids"))
    )


def _check_single(body: dict) -> None:
    if body.get("n", 1) not in (1, None) or body.get("best_of") not in (1, None):
        raise ServeRequestError("n must be 1 (DA accounting is per request); send n requests instead")
    if body.get("echo"):
        raise ServeRequestError("echo is not supported with a server-side DA layout")


def as_documents(value: Any) -> Any:
    """``heed_documents`` as sent: a list, one document as a string, or a JSON list sent as text (vLLM's
    ``vllm_xargs`` schema wants flat values). Anything else is returned for the caller to refuse."""
    if isinstance(value, str):
        return _json_list(value) if value.lstrip().startswith("[") else [value]
    return value


def _json_list(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ServeRequestError(f"vllm_xargs.{DOCUMENTS_KEY} is not a valid JSON list") from None

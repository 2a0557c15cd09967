"""``/v1/chat/completions`` with documents: the conversation laid out as magic chunks, served as a completion.

The paper's own layout is a tool dialogue: each magic chunk answers a ``get_magic_chunk`` call. So an agent
or chat client sends its documents the way it already sends tool results::

    {"role": "user", "content": "What is the special magic number for red-clock?"},
    {"role": "assistant", "tool_calls": [...]},             ignored: the calls that fetched the documents
    {"role": "tool", "tool_call_id": "1", "content": "The child asked whether ..."},   magic chunk 1
    {"role": "tool", "tool_call_id": "2", "content": "One of the special ..."},       magic chunk 2

or names them in ``vllm_xargs.heed_documents`` as a completions request does. The request is laid out by
the completions path (:func:`rl.serving.requests.da_request`, ``heed eval``'s layout under the export's
settings), runs as that ``/v1/completions`` request, and comes back as a ``chat.completion`` with the same
``heed`` accounting. What becomes what:

- the **question** is the last user message;
- every **tool result** is a magic chunk, in conversation order (documents named in ``vllm_xargs`` come
  first);
- an **earlier turn** (a user question and the assistant's answer to it) is a chunk of its own, at its place
  in the conversation, so a follow-up can focus on what was said before; the assistant's text is reduced to
  its ``<answer>`` when it has one (its tags would be protocol text inside a document);
- a **system** (or developer) message is a chunk too, the first: nothing the client sent is dropped, and
  the export's layout keeps its own instructions.

A conversation with neither tool results nor ``heed_documents`` is not a DA request and passes to vLLM's own
chat handler untouched. Refused (HTTP 400, that request alone): no user message after the last document,
message content that is not text, ``n`` other than 1, ``logprobs``, ``response_format`` and tool calls
*requested* of the model (``tool_choice`` other than ``none``/``auto``), beside the completions path's own
refusals. ``tools`` is accepted and ignored: the documents are already in the prompt.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from rollouts.protocol.parser import parse_completion

from .accounting import HEED_FIELD
from .requests import DOCUMENTS_KEY, QUESTION_KEY, DARequest, ServeRequestError, as_documents, da_request

CHAT_PATH = "/v1/chat/completions"
# chat fields that mean the same in a completions body, or nothing once the documents are laid out
_SAME = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "user", "ignore_eos", "min_tokens",
    "skip_special_tokens", "include_stop_str_in_output", "n", "stream", "stream_options", "return_token_ids",
    "priority", "request_id", "logit_bias", "vllm_xargs",
})  # fmt: skip
_IGNORED = frozenset({"messages", "tools", "tool_choice", "parallel_tool_calls", "max_completion_tokens"})
_SYSTEM_ROLES = ("system", "developer")


def da_chat_request(body: Any, tokenizer, settings, max_model_len: int | None = None) -> DARequest | None:
    """The completions DA request a chat ``body`` with documents asks for; None if it has no documents.

    The returned request's ``body`` is a ``/v1/completions`` body (token-id prompt, wire layout), so the
    middleware forwards it there and turns the answer back into a chat completion (:func:`chat_response`).
    """
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None
    messages = body["messages"]
    xargs = body.get("vllm_xargs") if isinstance(body.get("vllm_xargs"), dict) else {}
    has_tool_results = any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
    if not has_tool_results and DOCUMENTS_KEY not in xargs:
        return None
    question, chunks = conversation_chunks(messages, settings)
    unknown = sorted(k for k, v in body.items() if k not in _SAME | _IGNORED and v not in (None, False))
    if unknown:
        raise ServeRequestError(
            f"{', '.join(unknown)} cannot be served with documents laid out as magic chunks: drop "
            f"{'them' if len(unknown) > 1 else 'it'}"
        )
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise ServeRequestError("the documents are already in the prompt: tool_choice must be none or auto")
    given = as_documents(xargs.get(DOCUMENTS_KEY, []))
    if not isinstance(given, list):
        raise ServeRequestError(f"vllm_xargs.{DOCUMENTS_KEY} must be a list of strings")
    completion = {k: v for k, v in body.items() if k in _SAME}
    if "max_completion_tokens" in body and "max_tokens" not in body:
        completion["max_tokens"] = body["max_completion_tokens"]
    completion["prompt"] = ""
    completion["vllm_xargs"] = {**xargs, QUESTION_KEY: question, DOCUMENTS_KEY: [*given, *chunks]}
    request = da_request(completion, tokenizer, settings, max_model_len)
    return None if request is None else replace(request, chat=True)


def conversation_chunks(messages: list, settings) -> tuple[str, list[str]]:
    """(question, chunks) of a chat conversation (module docstring: what becomes what).

    >>> from rollouts.protocol.layout import LayoutSettings
    >>> question, chunks = conversation_chunks([
    ...     {"role": "user", "content": "Which number?"},
    ...     {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
    ...     {"role": "tool", "content": "The number is 7."},
    ...     {"role": "assistant", "content": '<focus magic_chunks="1"> 7</focus><answer> 7</answer>'},
    ...     {"role": "user", "content": "And doubled?"},
    ...     {"role": "tool", "content": [{"type": "text", "text": "Doubling multiplies by two."}]},
    ... ], LayoutSettings())
    >>> question
    'And doubled?'
    >>> chunks
    ['The number is 7.', 'Earlier question: Which number?\\nEarlier answer: 7', 'Doubling multiplies by two.']
    """
    chunks: list[str] = []
    asked: str | None = None  # the user question no assistant text has answered yet
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ServeRequestError(f"messages[{i}] must be an object with a role")
        role, text = message["role"], _text(message, i)
        if role in _SYSTEM_ROLES or role == "tool":
            if text.strip():
                chunks.append(text)
        elif role == "user":
            if asked is not None:  # asked again before an answer: the first question stays in context
                chunks.append(f"Earlier question: {asked}")
            asked = text
        elif role == "assistant":
            if text.strip():  # an answer (a message that only calls tools has no text)
                answer = parse_completion(text, max(len(chunks), 1), version=settings.protocol_version).answer
                said = f"Earlier answer: {answer or text.strip()}"
                chunks.append(said if asked is None else f"Earlier question: {asked}\n{said}")
                asked = None
        else:
            raise ServeRequestError(f"messages[{i}] has role {role!r}: use system, user, assistant or tool")
    if asked is None or not asked.strip():
        raise ServeRequestError(
            "the conversation must end with an open user question (tool results may follow it)"
        )
    return asked, chunks


def _text(message: dict, i: int) -> str:
    """A message's text: a string, or the text parts of a content list (anything else is refused)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise ServeRequestError(f"messages[{i}].content must be text (a string or text parts)")


def chat_response(completion: dict) -> dict:
    """A ``text_completion`` response (one choice, with ``heed``) as the ``chat.completion`` it answers."""
    (choice,) = completion["choices"]
    message = {"role": "assistant", "content": choice["text"], "tool_calls": []}
    return _as_chat(completion, "chat.completion", [_chat_choice(choice, message=message)])


def chat_chunk(chunk: dict, first: bool) -> dict:
    """A streamed ``text_completion`` chunk as the ``chat.completion.chunk`` it answers (the first one
    names the role, as OpenAI's do); a usage chunk keeps no choices."""
    choices = []
    for choice in chunk["choices"]:
        delta = (
            {"role": "assistant", "content": choice.get("text", "")}
            if first
            else {"content": choice.get("text", "")}
        )
        choices.append(_chat_choice(choice, delta=delta))
    return _as_chat(chunk, "chat.completion.chunk", choices)


def _chat_choice(choice: dict, **content) -> dict:
    out = {
        "index": choice.get("index", 0),
        **content,
        "logprobs": None,
        "finish_reason": choice.get("finish_reason"),
    }
    for key in ("stop_reason", "token_ids", "prompt_token_ids"):
        if choice.get(key) is not None:
            out[key] = choice[key]
    return out


def _as_chat(completion: dict, kind: str, choices: list[dict]) -> dict:
    out = {
        "id": "chatcmpl-" + str(completion.get("id", "")).removeprefix("cmpl-"),
        "object": kind,
        "created": completion.get("created", int(time.time())),
        "model": completion.get("model"),
        "choices": choices,
    }
    for key in ("usage", HEED_FIELD):
        if completion.get(key) is not None:
            out[key] = completion[key]
    return out

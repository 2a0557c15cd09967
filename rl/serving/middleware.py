"""The ASGI middleware ``heed serve`` hands vLLM (``--middleware rl.serving.middleware.HeedMiddleware``).

Why a middleware: it is the one hook vLLM's OpenAI server offers for rewriting a request and its response
without replacing vLLM's handlers (endpoint plugins replace routes, and are gated by ``VLLM_PLUGINS``, which
would also filter the DA plugin's own ``vllm.general_plugins`` entry). It works the same under plain ``vllm
serve EXPORT --middleware ...``.

Per ``POST /v1/completions`` (and ``/v1/chat/completions`` whose documents arrive as tool results,
``rl/serving/chat.py``: laid out and run as the same completion, answered as a chat completion):

1. read the body; :func:`rl.serving.requests.da_request` decides whether it is a DA request (server-side
   layout -> rewritten to token ids + wire layout; token ids + wire layout -> tracked as sent) or not
   (passed on byte for byte). A refused one gets a 400 in vLLM's error format and never reaches the engine;
2. the (rewritten) request runs through vLLM's own handler: validation, the plugin's admission, the mask;
3. a 200 response gets ``"heed"`` (a streamed one on its final event: ``rl/serving/streaming.py``):
   :func:`rl.serving.accounting.request_accounting` of the completion's token ids, added to ``/metrics``
   as well. Token ids the client did not ask for are removed again. Any other
   response goes back untouched; an accounting failure is logged and the completion returned without it.

A Selective Attention model evicts in every mode, so its requests (``vanilla`` included) carry an
accounting key (``with_selective_key``), and once the completion is done the middleware collects what each
layer read from the worker (``collective_rpc("heed_sa_reports")`` on vLLM's engine client, as the rollout
engine does on its ``LLM``) for the record.

Layout tokenizes the documents, so it runs on one worker thread, off the event loop (the tokenizer is not
shared between threads). This middleware sits outside vLLM's own (``--api-key`` among them), so it checks
the key first with vLLM's own check and passes a request without a valid one on untouched, for vLLM to
answer 401: nothing is laid out for a client that may not use the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any

from .accounting import HEED_FIELD, REJECTED, record_metrics, request_accounting
from .chat import CHAT_PATH, chat_response, da_chat_request
from .requests import DARequest, ServeRequestError, da_request, with_selective_key
from .streaming import StreamAccounting

logger = logging.getLogger(__name__)

COMPLETIONS_PATH = "/v1/completions"


class _Serving:
    """What the middleware needs from the served model, loaded on the first request."""

    def __init__(self, app_state):
        from transformers import AutoTokenizer

        from rl.policy_settings import layout_settings, read_heed_json
        from rollouts.engines.vllm_selective import is_selective
        from rollouts.masks.accounting import KVShape
        from rollouts.protocol.tokens import token_bytes_table

        args, vllm_config = app_state.args, app_state.vllm_config
        model = args.model
        self.max_model_len = vllm_config.model_config.max_model_len
        self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or model)
        self.token_table = token_bytes_table(self.tokenizer)
        self.settings = layout_settings(model, read_heed_json(model), block_size=args.block_size)
        model_config = vllm_config.model_config
        cache_dtype = vllm_config.cache_config.cache_dtype
        dtype = model_config.dtype if cache_dtype in (None, "auto") else cache_dtype
        self.kv_shape = KVShape.from_config(model_config.hf_config, dtype)
        self.selective = is_selective(model_config.hf_config)  # per-layer reads come from the worker
        self.engine_client = app_state.engine_client

    async def layer_reads(self, request: DARequest) -> list[list[int]] | None:
        """What each layer of a Selective Attention model read per generated token of ``request`` (``[n][L]``),
        from the worker; ``None`` for a standard model, or one without budgets (nothing evicted)."""
        if request.sa_key is None:
            return None
        reports = await self.engine_client.collective_rpc("heed_sa_reports", args=([request.sa_key],))
        return reports[0].get(request.sa_key, {}).get("kv_tokens_per_layer") or None


class HeedMiddleware:
    """Server-side DA layout, per-request accounting and ``/metrics`` series (module docstring)."""

    def __init__(self, app):
        self.app = app
        self._serving: _Serving | None = None
        self._lock = asyncio.Lock()

    @cached_property
    def _executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="heed-layout")

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        chat = path.endswith(CHAT_PATH)
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and (chat or path.endswith(COMPLETIONS_PATH))
        ):
            return await self.app(scope, receive, send)
        if not self._authorized(scope):
            return await self.app(scope, receive, send)  # vLLM's own middleware answers 401
        raw = await _read_body(receive)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None  # vLLM answers a body that is not JSON
        serving = await self._serving_state(scope)
        loop = asyncio.get_running_loop()
        try:
            request = await loop.run_in_executor(
                self._executor, da_chat_request if chat else da_request, body, serving.tokenizer,
                serving.settings, serving.max_model_len,
            )  # fmt: skip
        except ServeRequestError as err:
            REJECTED.inc()
            return await _send_json(send, 400, _error(str(err)))
        if request is None:
            return await self.app(scope, _replay(raw, receive), send)
        if serving.selective:
            request = with_selective_key(request)
        await self._serve(request, scope, receive, send, serving)

    def _authorized(self, scope) -> bool:
        """vLLM's ``--api-key`` check (``AuthenticationMiddleware.verify_token``); True without a key."""
        if "_auth" not in self.__dict__:
            from vllm import envs
            from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

            args = scope["app"].state.args
            tokens = [key for key in (getattr(args, "api_key", None) or [envs.VLLM_API_KEY]) if key]
            self._auth = AuthenticationMiddleware(self.app, tokens=tokens) if tokens else None
        if self._auth is None:
            return True
        from starlette.datastructures import Headers

        return self._auth.verify_token(Headers(scope=scope))

    async def _serving_state(self, scope) -> _Serving:
        if self._serving is None:
            async with self._lock:
                if self._serving is None:
                    state = scope["app"].state
                    loop = asyncio.get_running_loop()
                    self._serving = await loop.run_in_executor(self._executor, _Serving, state)
        return self._serving

    async def _serve(self, request: DARequest, scope, receive, send, serving: _Serving) -> None:
        forwarded = json.dumps(request.body).encode()
        scope = {**scope, "headers": _with_length(scope["headers"], len(forwarded))}
        if request.chat:  # laid out as a completion: vLLM's completions handler runs it
            path = scope["path"].removesuffix(CHAT_PATH) + COMPLETIONS_PATH
            scope |= {"path": path, "raw_path": path.encode()}
        if request.body.get("stream"):
            return await self._stream(request, scope, forwarded, receive, send, serving)
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def capture(message):
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
            else:
                await send(message)

        await self.app(scope, _replay(forwarded, receive), capture)
        status, payload = start.get("status", 500), b"".join(chunks)
        if status == 200:
            payload = await self._with_accounting(request, payload, serving)
        headers = _with_length(start.get("headers", []), len(payload))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _stream(
        self, request: DARequest, scope, forwarded: bytes, receive, send, serving: _Serving
    ) -> None:
        """Relay vLLM's events as they come, rewritten by :class:`StreamAccounting`; an answer other than
        200 (a JSON error before the stream started) passes untouched."""
        rewriter = StreamAccounting(
            request, serving.token_table, serving.kv_shape, lambda: serving.layer_reads(request)
        )
        status: list[int] = []

        async def relay(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])
                if message["status"] == 200:  # the events change length: no content-length
                    headers = [
                        (k, v) for k, v in message.get("headers", []) if k.lower() != b"content-length"
                    ]
                    message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and status == [200]:
                more = message.get("more_body", False)
                body = await rewriter.feed(message.get("body", b"")) + (b"" if more else rewriter.close())
                message = {"type": "http.response.body", "body": body, "more_body": more}
            await send(message)

        await self.app(scope, _replay(forwarded, receive), relay)

    async def _with_accounting(self, request: DARequest, payload: bytes, serving: _Serving) -> bytes:
        try:
            data = json.loads(payload)
            (choice,) = data["choices"]
            accounting = request_accounting(
                request.layout, request.mode, choice["token_ids"], serving.token_table, serving.kv_shape,
                choice.get("finish_reason"), await serving.layer_reads(request),
            )  # fmt: skip
            if not request.client_wants_token_ids:
                choice.pop("token_ids", None)
                choice.pop("prompt_token_ids", None)
            data[HEED_FIELD] = accounting
            record_metrics(accounting)
            return json.dumps(chat_response(data) if request.chat else data).encode()
        except Exception:  # the completion is the client's either way; the accounting is a bonus
            logger.exception("heed: no accounting for a DA completion; returned without it")
        if request.chat:
            try:
                return json.dumps(chat_response(json.loads(payload))).encode()
            except Exception:
                logger.exception("heed: a completion that is not one; returned as vLLM sent it")
        return payload


def _error(message: str, status: int = 400) -> dict:
    """vLLM's (OpenAI's) error body."""
    return {"error": {"message": message, "type": "BadRequestError", "param": "vllm_xargs", "code": status}}


async def _read_body(receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


def _replay(body: bytes, receive):
    """A ``receive`` that yields ``body`` once, then the client's own messages (disconnects)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _with_length(headers, length: int) -> list:
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return [*kept, (b"content-length", str(length).encode())]


async def _send_json(send, status: int, data: dict) -> None:
    payload = json.dumps(data).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})

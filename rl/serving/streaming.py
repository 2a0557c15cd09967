"""Streamed DA responses: vLLM's server-sent events passed on as they come, the accounting on the final one.

vLLM streams a completion as ``data: {chunk}`` events, then ``data: [DONE]``. With ``return_token_ids``
(which Heed sets on every DA request) each chunk carries the token ids it added, so the stream holds the
whole completion by its end without buffering anything the client waits for. :class:`StreamAccounting`
rewrites the events one by one:

- token ids the client did not ask for are removed from every chunk again;
- the completion's token ids are collected; at the **final chunk** the ``heed`` record is computed from
  them (:func:`rl.serving.accounting.request_accounting`, as for a whole response, with a Selective
  Attention model's per-layer reads from ``layer_reads``, awaited only then) and attached: on the
  usage chunk when the client asked for ``stream_options.include_usage`` (it is then the last one, and the
  usage convention is to put per-request figures there), else on the chunk that carries ``finish_reason``;
- a chat request's chunks become ``chat.completion.chunk`` events (:func:`rl.serving.chat.chat_chunk`);
- anything else (an error event, ``[DONE]``, a chunk that is not JSON) passes as it came.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .accounting import HEED_FIELD, record_metrics, request_accounting
from .chat import chat_chunk
from .requests import DARequest

logger = logging.getLogger(__name__)

EVENT_END = b"\n\n"
DATA = b"data: "


class StreamAccounting:
    """Feed it the response body as it arrives (:meth:`feed`); send what it returns, then :meth:`close`.

    ``layer_reads``: returns the per-layer reads ``[n][L]`` of a Selective Attention model's completion
    (``None`` for a standard model), awaited once the completion is done."""

    def __init__(
        self,
        request: DARequest,
        token_table,
        kv_shape,
        layer_reads: Callable[[], Awaitable[list[list[int]] | None]] | None = None,
    ):
        self.request, self.token_table, self.kv_shape = request, token_table, kv_shape
        self.layer_reads = layer_reads
        options = request.body.get("stream_options")
        self.usage_chunk_follows = isinstance(options, dict) and bool(options.get("include_usage"))
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.accounting: dict[str, Any] | None = None
        self._pending = b""
        self._first_chat_chunk = True

    async def feed(self, data: bytes) -> bytes:
        """The events complete in ``data`` (with what came before), rewritten; a partial one waits."""
        self._pending += data
        *events, self._pending = self._pending.split(EVENT_END)
        return b"".join([await self._rewrite(event) + EVENT_END for event in events])

    def close(self) -> bytes:
        """Whatever the stream ended with that was not a complete event (passed on as it came)."""
        rest, self._pending = self._pending, b""
        return rest

    async def _rewrite(self, event: bytes) -> bytes:
        if not event.startswith(DATA):
            return event
        try:
            chunk = json.loads(event[len(DATA) :])
        except ValueError:  # [DONE], or something vLLM meant as is
            return event
        if not isinstance(chunk, dict) or "choices" not in chunk:
            return event  # an error event
        for choice in chunk["choices"]:
            self.token_ids.extend(choice.get("token_ids") or [])
            if not self.request.client_wants_token_ids:
                choice.pop("token_ids", None)
                choice.pop("prompt_token_ids", None)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        final = (not chunk["choices"]) if self.usage_chunk_follows else self.finish_reason is not None
        if final and self.accounting is None:
            self.accounting = await self._account()
            if self.accounting is not None:
                chunk[HEED_FIELD] = self.accounting
        if self.request.chat:
            chunk = chat_chunk(chunk, first=self._first_chat_chunk)
            self._first_chat_chunk = False
        return DATA + json.dumps(chunk).encode()

    async def _account(self) -> dict[str, Any] | None:
        try:
            per_layer = None if self.layer_reads is None else await self.layer_reads()
            accounting = request_accounting(
                self.request.layout, self.request.mode, self.token_ids, self.token_table, self.kv_shape,
                self.finish_reason, per_layer,
            )  # fmt: skip
        except Exception:  # the completion is the client's either way; the accounting is a bonus
            logger.exception("heed: no accounting for a streamed DA completion; streamed without it")
            return None
        record_metrics(accounting)
        return accounting

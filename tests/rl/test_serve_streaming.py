"""Streamed DA responses (`rl/serving/streaming.py`): vLLM-shaped server-sent events in, the same events out
with the accounting on the final one, whatever byte boundaries the body arrives in. The accounting must
equal the whole-response path's for the same token ids; the text must be what vLLM streamed. A Selective
Attention model's per-layer reads are fetched once, for the final event, and counted there."""

import asyncio
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.serving.accounting import request_accounting
from rl.serving.requests import DARequest
from rl.serving.streaming import StreamAccounting
from rollouts.masks.accounting import KVShape
from rollouts.protocol import PromptLayout

LAYOUT = PromptLayout(tuple(range(100, 196)), 32, ((32, 64),))  # 96 prompt tokens, chunk 1 at 32-63
SHAPE = KVShape(num_layers=2, num_kv_heads=1, head_dim=8, dtype_bytes=4)
TEXT = '<focus magic_chunks="1"> 42</focus>\n<answer> 42</answer>'


@pytest.fixture(scope="module")
def ids(tokenizer):
    return tokenizer(TEXT, add_special_tokens=False)["input_ids"]


def _events(tokenizer, ids, usage: bool) -> bytes:
    """vLLM's stream for ``ids`` in three pieces (return_token_ids on), a usage chunk if asked, [DONE]."""
    cuts = [0, 3, len(ids) // 2, len(ids)]
    chunks = []
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        last = b == len(ids)
        choice = {"index": 0, "text": tokenizer.decode(ids[a:b]), "finish_reason": "stop" if last else None,
                  "token_ids": ids[a:b]}  # fmt: skip
        if k == 0:
            choice["prompt_token_ids"] = list(LAYOUT.input_ids)
        chunks.append(
            {"id": "cmpl-7", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
        )
    if usage:
        chunks.append({"id": "cmpl-7", "object": "text_completion", "created": 1, "model": "m", "choices": [],
                       "usage": {"prompt_tokens": 96, "completion_tokens": len(ids), "total_tokens": 96 + len(ids)}})  # fmt: skip
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _request(*, usage=False, wants_ids=False, chat=False) -> DARequest:
    body = {"stream": True, **({"stream_options": {"include_usage": True}} if usage else {})}
    return DARequest(LAYOUT, "da", body, wants_ids, chat)


def _run(request, token_table, parts, layer_reads=None) -> list:
    stream = StreamAccounting(request, token_table, SHAPE, layer_reads)

    async def run():
        return b"".join([await stream.feed(p) for p in parts]) + stream.close()

    out = asyncio.run(run())
    assert out.endswith(b"data: [DONE]\n\n")
    return [json.loads(e[len(b"data: ") :]) for e in out.split(b"\n\n") if e and e != b"data: [DONE]"]


@pytest.mark.parametrize("usage", [False, True])
def test_the_final_event_carries_the_whole_response_accounting(tokenizer, token_table, ids, usage):
    chunks = _run(_request(usage=usage), token_table, [_events(tokenizer, ids, usage)])
    carrying = [i for i, c in enumerate(chunks) if "heed" in c]
    assert carrying == [len(chunks) - 1]  # once, on the last event: the usage chunk or the finishing one
    heed = chunks[-1]["heed"]
    assert heed == request_accounting(LAYOUT, "da", ids, token_table, SHAPE, "stop")
    assert heed["completion_tokens"] == len(ids) and heed["answer"] == "42" and heed["violations"] == []
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == TEXT
    assert all("token_ids" not in ch and "prompt_token_ids" not in ch for c in chunks for ch in c["choices"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=12))
def test_byte_boundaries_do_not_matter(tokenizer, token_table, ids, cuts):
    body = _events(tokenizer, ids, usage=True)
    points = sorted({c % (len(body) + 1) for c in cuts})
    parts = [body[a:b] for a, b in zip([0, *points], [*points, len(body)])]
    assert _run(_request(usage=True), token_table, parts) == _run(_request(usage=True), token_table, [body])


def test_token_ids_stay_when_asked_and_chat_chunks_name_the_role_once(tokenizer, token_table, ids):
    kept = _run(_request(wants_ids=True), token_table, [_events(tokenizer, ids, False)])
    assert [t for c in kept for t in c["choices"][0]["token_ids"]] == ids
    chat = _run(_request(chat=True), token_table, [_events(tokenizer, ids, False)])
    assert {c["object"] for c in chat} == {"chat.completion.chunk"} and chat[0]["id"] == "chatcmpl-7"
    assert [c["choices"][0]["delta"].get("role") for c in chat] == ["assistant", None, None]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chat) == TEXT
    assert chat[-1]["choices"][0]["finish_reason"] == "stop" and chat[-1]["heed"]["answer"] == "42"


def test_an_error_event_passes_as_it_came(token_table):
    error = b'data: {"error": {"message": "boom", "code": 500}}\n\n'
    stream = StreamAccounting(_request(), token_table, SHAPE)
    assert asyncio.run(stream.feed(error + b"data: [DONE]\n\n")) == error + b"data: [DONE]\n\n"
    assert stream.accounting is None


def test_a_selective_models_reads_are_fetched_once_and_counted_per_layer(tokenizer, token_table, ids):
    """Two layers under budgets: layer 0 read 5 keys at every step, layer 1 3 then 4. The record counts their
    mean per step (what heed eval sums), each layer's sum and its peak, not the DA trace's reads."""
    reads = [[5, 3]] + [[5, 4]] * (len(ids) - 1)
    calls = []

    async def layer_reads():
        calls.append(1)
        return reads

    parts = [_events(tokenizer, ids, usage=True)]
    heed = _run(_request(usage=True), token_table, parts, layer_reads)[-1]["heed"]
    assert calls == [1]
    n = len(ids)
    assert heed["kv_tokens_per_layer"] == [5 * n, 3 + 4 * (n - 1)]
    assert heed["kv_peak_per_layer"] == [5, 4]
    assert heed["kv_tokens"] == round((5 * n + 3 + 4 * (n - 1)) / 2)
    assert heed["kv_bytes"] == SHAPE.kv_bytes(heed["kv_tokens"])
    dense = request_accounting(LAYOUT, "da", ids, token_table, SHAPE, "stop")
    assert dense["kv_tokens_per_layer"] is None and dense["kv_tokens"] != heed["kv_tokens"]
    assert heed["kv_tokens_vanilla"] == dense["kv_tokens_vanilla"]  # causal reads: no eviction there
    with pytest.raises(ValueError, match="per-layer reads for 2 generated tokens"):
        request_accounting(LAYOUT, "da", ids, token_table, SHAPE, "stop", reads[:2])

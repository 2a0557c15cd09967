"""Chat requests with documents (`rl/serving/chat.py`): the completions request they become, what is refused,
and that no conversation, however malformed, breaks the converter (no engine here; the served round trip is
tests/rl/test_serve.py)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.serving.chat import chat_chunk, chat_response, conversation_chunks, da_chat_request
from rl.serving.requests import ServeRequestError, da_request
from rollouts.protocol.layout import LayoutSettings

SETTINGS = LayoutSettings(block_size=32, protocol_version=4, instructions=False, style="compact")
QUESTION = "What is the special magic number for red-clock?"
DOCS = [
    "The child asked whether the carrot was poor.",
    "One of the special magic numbers for red-clock is: 92.",
]


def _tool_dialogue(question=QUESTION, docs=DOCS) -> list[dict]:
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": "get_magic_chunk", "arguments": "{}"}}
             for k in range(len(docs))]  # fmt: skip
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *[{"role": "tool", "tool_call_id": f"c{k}", "content": d} for k, d in enumerate(docs)],
    ]


def test_a_tool_dialogue_becomes_the_completions_request_with_the_same_question_and_documents(tokenizer):
    chat = {"model": "m", "messages": _tool_dialogue(), "max_tokens": 9, "temperature": 0.0, "tools": [{}],
            "vllm_xargs": {"heed_mode": "da-nm"}}  # fmt: skip
    completion = {"model": "m", "prompt": "", "max_tokens": 9, "temperature": 0.0,
                  "vllm_xargs": {"heed_question": QUESTION, "heed_documents": DOCS, "heed_mode": "da-nm"}}  # fmt: skip
    got, want = da_chat_request(chat, tokenizer, SETTINGS), da_request(completion, tokenizer, SETTINGS)
    assert got.chat and not want.chat
    assert got.body == want.body and got.layout == want.layout and got.mode == want.mode == "da-nm"
    assert got.layout.num_chunks == 2


def test_documents_named_in_the_request_come_before_the_tool_results(tokenizer):
    chat = {"messages": _tool_dialogue(docs=DOCS[1:]), "vllm_xargs": {"heed_documents": json.dumps(DOCS[:1])}}
    question, chunks = conversation_chunks(chat["messages"], SETTINGS)
    request = da_chat_request(chat, tokenizer, SETTINGS)
    plain = da_request({"prompt": "", "vllm_xargs": {"heed_question": question, "heed_documents": DOCS}},
                       tokenizer, SETTINGS)  # fmt: skip
    assert chunks == DOCS[1:] and request.layout == plain.layout


def test_a_system_message_and_an_unanswered_question_stay_in_context():
    question, chunks = conversation_chunks(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "First?"},
         *_tool_dialogue("Second?", DOCS[:1])],
        SETTINGS,
    )  # fmt: skip
    assert question == "Second?" and chunks == ["Be brief.", "Earlier question: First?", DOCS[0]]


def test_a_chat_without_documents_is_not_heeds(tokenizer):
    assert da_chat_request({"messages": [{"role": "user", "content": "hi"}]}, tokenizer, SETTINGS) is None
    assert da_chat_request({"prompt": "x"}, tokenizer, SETTINGS) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"messages": _tool_dialogue()[1:]}, "must end with an open user question"),
        ({"response_format": {"type": "json_object"}}, "response_format cannot be served"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs, top_logprobs cannot be served"),
        ({"tool_choice": "required"}, "tool_choice must be none or auto"),
        ({"n": 2}, "n must be 1"),
        (
            {"messages": [*_tool_dialogue(), {"role": "tool", "content": [{"type": "image_url"}]}]},
            "must be text",
        ),
        ({"messages": [*_tool_dialogue(), {"role": "critic", "content": "x"}]}, "role 'critic'"),
        (
            {
                "messages": [
                    *_tool_dialogue(),
                    {"role": "tool", "content": "   "},
                    {"role": "tool", "content": ""},
                ]
            },
            None,
        ),
        ({"vllm_xargs": {"heed_documents": 5}}, "must be a list of strings"),
    ],
)
def test_what_cannot_be_served_is_refused_with_what_to_change(tokenizer, change, message):
    body = {"model": "m", "messages": _tool_dialogue(), **change}
    if message is None:  # blank tool results are left out, not laid out as empty chunks
        assert da_chat_request(body, tokenizer, SETTINGS).layout.num_chunks == 2
        return
    with pytest.raises(ServeRequestError, match=message):
        da_chat_request(body, tokenizer, SETTINGS)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "other", 3])},
    optional={"content": JSONISH | st.text(max_size=40)},
)


@settings(max_examples=150, deadline=None)
@given(st.lists(MESSAGE | JSONISH, max_size=6))
def test_any_conversation_is_laid_out_or_refused_never_crashes(messages):
    try:
        question, chunks = conversation_chunks(messages, SETTINGS)
    except ServeRequestError:
        return
    assert isinstance(question, str) and question.strip() and all(isinstance(c, str) and c for c in chunks)


def test_responses_and_stream_chunks_become_chat_shaped():
    completion = {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
                  "choices": [{"index": 0, "text": "<answer> 92</answer>", "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 3}, "heed": {"answer": "92"}}  # fmt: skip
    chat = chat_response(completion)
    assert (
        chat["id"] == "chatcmpl-1"
        and chat["object"] == "chat.completion"
        and chat["heed"] == {"answer": "92"}
    )
    assert chat["choices"][0]["message"] == {
        "role": "assistant",
        "content": "<answer> 92</answer>",
        "tool_calls": [],
    }
    first, later = chat_chunk(completion, first=True), chat_chunk(completion, first=False)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "<answer> 92</answer>"}
    assert later["choices"][0]["delta"] == {"content": "<answer> 92</answer>"}

"""Greedy decoding under KV budgets by verification (rl/selective/verified_greedy.py), against the reference
engine decoding token by token under the same budgets."""

import pytest

from rl.eval_requests import build_requests
from rl.selective.verified_greedy import VerifiedGreedy
from rollouts.engines.reference import ReferenceEngine
from rollouts.protocol import LayoutSettings

from ...rollouts.conftest import save_tiny_qwen3

ROWS = [
    {"id": f"r{i}", "task": "t", "question": f"Which number is {word}?", "answers": [str(i)],
     "metric": "string_match_all", "evidence_chunks": [1], "chunk_tokens": 27,
     "documents": [f"The {word} number is {i}.", "Nothing here at all.", "A river runs by the town."]}
    for i, word in enumerate(("first", "second", "third"))
]  # fmt: skip
# a DA trace: the focus and answer tags change what the completion's later tokens may read
TRACE = '<global>Chunk 2.</global>\n<focus magic_chunks="2"> 7</focus>\n<answer> 7</answer>'


@pytest.fixture(scope="module")
def policy(tmp_path_factory, tokenizer):
    path = save_tiny_qwen3(tmp_path_factory.mktemp("sa"), tokenizer, selective_attention=True)
    engine = ReferenceEngine(path, num_threads=1)  # loads it with Selective Attention
    requests = build_requests(
        ROWS, tokenizer, layout=LayoutSettings(block_size=32), modes=("da",), max_tokens=10
    )
    return engine.model, tokenizer, requests


def reference(model, tokenizer, requests, budgets):
    return [t.completion_ids for t in ReferenceEngine(model, tokenizer, budgets=budgets).generate(requests)]


def test_each_candidate_decodes_what_the_reference_engine_decodes(policy):
    """Budgets in the order a search tries them (its full cache, then lower): the same tokens, each call
    starting from the nearest budgets decoded before; budgets decoded again reuse every completion."""
    model, tokenizer, requests = policy
    full = max(r.layout.prompt_len for r in requests) + 10
    decoder = VerifiedGreedy(model, tokenizer, requests, batch_size=2)
    for budgets in [
        (full,) * 4,
        (full, full, 40, full),
        (40, 40, 40, 8),
        (8, 6, 4, 2),
        (2, 2, 2, 2),
        (full,) * 4,
    ]:
        got = [t.completion_ids for t in decoder.generate(budgets)]
        assert got == reference(model, tokenizer, requests, budgets), budgets
    assert decoder.decoded == 0  # the full cache again: its completions held, one forward a batch
    assert len(decoder.known) == 5


def test_a_draft_is_checked_under_its_da_mask_and_budgets(policy):
    """The check's argmax after each prefix of a DA trace equals the reference engine's greedy token after
    that prefix (forced through it, one token at a time, evicting under the budgets): the one forward
    replays the tags' visibility and the evictions a decoding loop goes through."""
    model, tokenizer, requests = policy
    trace = tokenizer(TRACE, add_special_tokens=False)["input_ids"]
    decoder = VerifiedGreedy(model, tokenizer, requests)
    for budgets in [(40, 30, 20, 10), (4, 3, 3, 2)]:
        (checked,) = decoder._argmax(requests[:1], [trace], budgets)
        engine = ReferenceEngine(model, tokenizer, budgets=budgets)
        want = []
        for j in range(len(trace) + 1):
            forced = tuple(trace[:j]) or None
            step = type(requests[0])(requests[0].layout, "da", forced_ids=forced, max_tokens=j + 1)
            want.append(engine.generate([step])[0].completion_ids[j])
        assert checked == want, budgets


def test_a_confirmed_prefix_that_ends_the_completion_is_not_decoded(policy):
    """A draft whose check finds a stop token, or its length limit, where the draft went on: finished as it
    stands (a forced stop token would not end a decode)."""
    model, tokenizer, requests = policy
    budgets = (2, 2, 2, 2)
    decoder = VerifiedGreedy(model, tokenizer, requests)
    want = decoder.generate(budgets)
    # plant drafts that run past the right completions; the check cuts each back where it ends
    decoder.known = {budgets: [list(t.completion_ids[:-1]) + [tokenizer.pad_token_id] * 3 for t in want]}
    got = decoder.generate(budgets)
    assert [t.completion_ids for t in got] == [t.completion_ids for t in want]
    assert [t.finish_reason for t in got] == [t.finish_reason for t in want]
    assert decoder.decoded == 0


def test_it_takes_greedy_da_requests_only(policy):
    model, tokenizer, _ = policy
    sampled = build_requests(
        ROWS, tokenizer, layout=LayoutSettings(block_size=32), modes=("da",), temperature=1.0
    )
    for bad in (
        sampled,
        build_requests(ROWS, tokenizer, layout=LayoutSettings(block_size=32), modes=("vanilla",)),
    ):
        with pytest.raises(ValueError, match="greedy `da` requests"):
            VerifiedGreedy(model, tokenizer, bad)

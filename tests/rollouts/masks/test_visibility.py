"""Visibility per decoding step and KV accounting, against a dense reference written here."""

import numpy as np
import pytest

from rollouts.masks import KVShape, VisibilityTracker, trace_completion, visible_chunks
from rollouts.masks.visibility import visible_keys
from rollouts.protocol import GLOBAL_STATE, LOCAL_STATE, ModeState, build_prompt, parse_completion

DOCS = [
    f"Document {i}: " + "the baker sells bread at the market near the bridge. " * (3 + i) for i in range(1, 6)
]


@pytest.fixture(scope="module")
def layout(tokenizer):
    return build_prompt("Which document mentions the bridge?", DOCS, tokenizer, block_size=16)


# A completion as (piece, state in force once the piece is read). Each piece is tokenized on its
# own, so token boundaries fall on piece boundaries and the expected state of every token is known
# by construction, without parsing.
PIECES = [
    ("<global>", GLOBAL_STATE),
    ("I should read documents two and four.", GLOBAL_STATE),
    ("</global>", GLOBAL_STATE),
    ('<focus magic_chunks="2,4">', ModeState("focus", (2, 4))),
    ("The baker sells bread near the bridge.", ModeState("focus", (2, 4))),
    ("</focus>", GLOBAL_STATE),
    ("<local>", LOCAL_STATE),
    ("Both mention it.", LOCAL_STATE),
    ("</local>", GLOBAL_STATE),
    ('<focus magic_chunks="5">', ModeState("focus", (5,))),
    ("More.", ModeState("focus", (5,))),
    ("</focus>", GLOBAL_STATE),
    ("<answer>2</answer>", GLOBAL_STATE),
]


def completion(tokenizer):
    ids, row_states = [], []
    for text, state in PIECES:
        piece_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece_ids
        # tokens before a tag's last token are still read under the previous state
        previous = row_states[-1] if row_states else GLOBAL_STATE
        row_states += [previous] * (len(piece_ids) - 1) + [state]
    return ids, row_states


def reference_row(layout, state, position):
    """Which keys the forward at ``position`` may read, decided key by key from the chunk spans."""
    row = np.zeros(position + 1, dtype=bool)
    for key in range(position + 1):
        chunk = next((i for i, (s, e) in enumerate(layout.chunk_spans, start=1) if s <= key < e), 0)
        if chunk == 0 or state.mode == "global" or chunk in state.chunks:
            row[key] = True
    return row


def test_visible_chunks_rule():
    # regions: scaffold, chunks 1..3, the index
    assert visible_chunks(GLOBAL_STATE, 3).tolist() == [True] * 5
    assert visible_chunks(LOCAL_STATE, 3).tolist() == [True, False, False, False, False]
    assert visible_chunks(ModeState("focus", (1, 3)), 3).tolist() == [True, True, False, True, False]
    assert visible_chunks(ModeState("index"), 3).tolist() == [True, False, False, False, True]


def test_tracker_blocks_and_kv_reads_match_dense_reference(layout, tokenizer, token_table):
    ids, row_states = completion(tokenizer)
    tracker = VisibilityTracker(layout, token_table)
    b = layout.block_size
    for j, (token, state) in enumerate(zip(ids, row_states)):
        blocks = tracker.advance(token).copy()
        position = layout.prompt_len + j
        assert tracker.state == state, f"step {j}"
        ref = reference_row(layout, state, position)
        ref_blocks = [blk for blk in range(position // b + 1) if ref[blk * b : (blk + 1) * b].any()]
        assert blocks.tolist() == ref_blocks, f"step {j}"
        # the kernel reads whole visible blocks before the tail, and the tail up to the current token
        assert tracker.kv_tokens == (len(ref_blocks) - 1) * b + position % b + 1
        # block rounding loses nothing: chunks are aligned, so block reads == visible tokens read
        assert tracker.kv_tokens == int(ref.sum())
        # the per-key form engines that attend token by token use (reference engine, Selective Attention)
        assert np.array_equal(visible_keys(blocks, position, b), ref), f"step {j}"


def test_trace_accounting(layout, tokenizer, token_table):
    ids, row_states = completion(tokenizer)
    trace = trace_completion(layout, ids, token_table)
    assert [trace.states[i] for i in trace.row_state] == row_states
    n = len(ids)
    # g_j is predicted by the forward at prompt_len + j - 1 (g_0 by the prefill's last row, global)
    expected = [int(reference_row(layout, GLOBAL_STATE, layout.prompt_len - 1).sum())]
    for j in range(1, n):
        expected.append(int(reference_row(layout, row_states[j - 1], layout.prompt_len + j - 1).sum()))
    assert trace.kv_tokens.tolist() == expected
    assert trace.kv_tokens_vanilla.tolist() == [layout.prompt_len + j for j in range(n)]
    assert 0 < trace.saving < 1
    # the tracker's parse is the text parse of the same completion
    text_parse = parse_completion("".join(p for p, _ in PIECES), layout.num_chunks)
    assert trace.parsed.segments == text_parse.segments
    assert (
        (trace.parsed.answer, trace.parsed.violations)
        == (text_parse.answer, text_parse.violations)
        == ("2", [])
    )
    assert trace.saving == pytest.approx(1 - sum(expected) / sum(layout.prompt_len + j for j in range(n)))


def test_global_only_completion_saves_nothing(layout, tokenizer, token_table):
    ids = tokenizer(
        "<global>just thinking about everything</global><answer>3</answer>", add_special_tokens=False
    )["input_ids"]
    trace = trace_completion(layout, ids, token_table)
    assert trace.kv_tokens.tolist() == trace.kv_tokens_vanilla.tolist()
    assert trace.saving == 0.0


def test_generated_blocks_stay_visible_in_local_mode(layout, tokenizer, token_table):
    filler = " word" * 200  # crosses many blocks while in local mode
    ids = tokenizer("<local>" + filler, add_special_tokens=False)["input_ids"]
    tracker = VisibilityTracker(layout, token_table)
    for token in ids:
        blocks = tracker.advance(token)
    scaffold_blocks = np.flatnonzero(layout.chunk_of_block == 0).tolist()
    last = (layout.prompt_len + len(ids) - 1) // layout.block_size
    assert blocks.tolist() == scaffold_blocks + list(range(layout.num_blocks, last + 1))


def test_kv_bytes():
    # 4 layers x (K and V) x 2 KV heads x 32 dims x 4 bytes = 2048 bytes per token
    assert KVShape(4, 2, 32, 4).bytes_per_token == 2048
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128, dtype="bfloat16"
    )
    shape = KVShape.from_config(cfg)
    assert shape.bytes_per_token == 36 * 2 * 8 * 128 * 2  # Qwen3-8B: 144 KiB per token
    assert shape.kv_bytes(np.array([1, 10])).tolist() == [147456, 1474560]
    with pytest.raises(ValueError, match="unknown KV dtype"):
        KVShape.from_config(cfg, dtype="int3")


def test_the_tracker_parses_with_the_layouts_protocol_version(layout, tokenizer, token_table):
    # a v1 layout (a v1 export served) is read by v1 rules; the same completion under v2 is malformed
    from dataclasses import replace

    text = '<focus magic_chunks="2">x</focus junk<answer>2</answer>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    v1 = trace_completion(replace(layout, protocol_version=1), ids, token_table)
    v2 = trace_completion(layout, ids, token_table)
    assert [v.kind for v in v1.parsed.violations] == ["unclosed_mode"]
    assert [v.kind for v in v2.parsed.violations] == ["malformed_tag", "unclosed_mode"]
    assert v1.states == v2.states and (v1.kv_tokens == v2.kv_tokens).all()  # the same masks either way


def test_version_5_reads_no_chunk_before_its_first_tag(layout, tokenizer, token_table):
    """Hand-worked against the dense reference: under v5 the first token is still predicted by the
    prompt's last row (the whole prompt, ``prompt_len`` keys), and every forward after it reads the
    scaffold and the generated tokens only, until ``<global>`` completes."""
    from dataclasses import replace

    v5 = replace(layout, protocol_version=5)
    text = "Let me see.<global>Two.</global><answer>2</answer>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    trace = trace_completion(v5, ids, token_table)
    opened = len(tokenizer("Let me see.<global>", add_special_tokens=False)["input_ids"])  # "<global>"'s ">"
    p = v5.prompt_len
    assert trace.kv_tokens[0] == p  # g_0: the prefill's last row
    for j in range(1, opened):  # predicted by the forwards of g_0 .. "<global>" before its ">"
        assert trace.kv_tokens[j] == reference_row(v5, LOCAL_STATE, p + j - 1).sum(), j
    assert trace.kv_tokens[opened] == p + opened  # the forward of ">" reads everything
    assert [trace.states[s].mode for s in trace.predicted_state[:2]] == ["global", "local"]
    v4 = trace_completion(layout, ids, token_table)
    assert (v4.kv_tokens[: opened + 1] == np.arange(p, p + opened + 1)).all()  # v4 starts in global


def test_causal_kv_tokens_is_what_the_trace_counts_as_vanilla(layout, tokenizer, token_table):
    from rollouts.masks import causal_kv_tokens, kv_tokens_read

    ids, _ = completion(tokenizer)
    trace = trace_completion(layout, ids, token_table)
    assert (trace.kv_tokens_vanilla == causal_kv_tokens(layout.prompt_len, len(ids))).all()
    positions = layout.prompt_len - 1 + np.arange(len(ids))  # every block visible: kv_tokens_read's rule
    every_block = positions // layout.block_size + 1
    assert (causal_kv_tokens(layout.prompt_len, len(ids)) == kv_tokens_read(every_block, positions, 16)).all()

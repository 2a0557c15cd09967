"""An independent oracle for visibility, fuzzed against everything built on it.

Engines, trainer masks and KV accounting all rest on :mod:`rollouts.masks.visibility`, so a bug there
would be shared by every parity test. The oracle here re-derives the answer from docs/ARCHITECTURE.md,
contracts 3, 4 and 7 and from nothing else the module computes: for every generated token it decodes the whole prefix
from the token bytes, re-parses it from scratch with :func:`parse_completion` (the text parser's one-shot
entry point), reads the mode off the parse's last segment, and decides key by key from the layout's chunk
spans what the forward at that position reads. Quadratic on purpose: it carries no state from one step to
the next, so a streaming or timing bug (a mode switched a token early or late, a stale block list, a tail
block lost) cannot be on both sides.

Fuzzed over random block-aligned layouts (any block size, chunks touching each other or the prompt's end,
thinking mode, every protocol version, with and without an index region) and random tag soup: tags, tag fragments, chunk lists and text,
cut into tokens at random byte offsets (so tokens split tags and UTF-8 characters), with empty-text
special tokens sprinkled in. Compared: :class:`VisibilityTracker` after every token,
:func:`trace_completion`'s states and KV counts, and both training masks (dense, and the FlexAttention
``BlockMask`` read tile by tile as the kernel reads it), for one completion per row and for a group of
completions sharing one prompt row.

CI runs the default number of examples; ``--hypothesis-profile=thorough`` runs 10^4.
"""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollouts.masks import (
    VisibilityTracker,
    block_training_mask,
    dense_training_mask,
    mask_batch,
    shared_mask_batch,
    trace_completion,
)
from rollouts.protocol import ModeState, PromptLayout, parse_completion
from rollouts.protocol.instructions import PROTOCOL_VERSIONS

# -- the oracle -----------------------------------------------------------------------------------


def prefix_text(table: list[bytes], ids) -> str:
    """The text of a token prefix, decoded in one go. A character split by the prefix's end decodes to
    U+FFFD where the stream holds it back; neither is a ``>``, so the mode after the prefix is the same."""
    return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")


def mode_after(text: str, layout: PromptLayout) -> ModeState:
    """The mode in force once ``text`` is read: the segment a further plain character would fall in.

    The space cannot complete a tag (only ``>`` does), so it lands in the mode ``text`` leaves behind,
    even when ``text`` ends with a tag (whose own segment would be empty)."""
    parsed = parse_completion(
        text + " ",
        layout.num_chunks,
        thinking=layout.thinking,
        version=layout.protocol_version,
        has_index=bool(layout.index_span),
    )
    return parsed.segments[-1].state


INDEX = "index"  # what chunk_of_each_key calls a key of the index region


def chunk_of_each_key(layout: PromptLayout, length: int) -> list:
    """1-based chunk id of every position ``< length``, ``INDEX`` inside the index span, 0 elsewhere
    (scaffold, generated)."""
    spans = [
        *enumerate(layout.chunk_spans, start=1),
        *([(INDEX, layout.index_span)] if layout.index_span else []),
    ]
    return [next((c for c, (start, end) in spans if start <= key < end), 0) for key in range(length)]


def readable(state: ModeState, chunk) -> bool:
    """Contract 4 and the mode rule: scaffold and generated tokens always; the index in global and index
    mode; chunks as the mode says."""
    if chunk == INDEX:
        return state.mode in ("global", "index")
    return chunk == 0 or state.mode == "global" or chunk in state.chunks


def keys_read(chunks: list[int], state: ModeState, position: int) -> np.ndarray:
    """``[position + 1]`` bool: the keys the forward at ``position`` reads under ``state``."""
    return np.array([readable(state, chunks[key]) for key in range(position + 1)])


def oracle_states(layout: PromptLayout, table: list[bytes], ids) -> list[ModeState]:
    """Per generated token ``j``: the mode after parsing ``g_0..g_j`` (what the forward of ``g_j`` reads under)."""
    return [mode_after(prefix_text(table, ids[: j + 1]), layout) for j in range(len(ids))]


# -- random layouts and tag soup ------------------------------------------------------------------


@st.composite
def layouts(draw, block_sizes=(1, 2, 3, 4, 8, 16, 32)) -> PromptLayout:
    """A block-aligned layout: scaffold gaps of 0-2 blocks, chunks of 1-2 blocks, from version 3 maybe an
    index of 1-2 blocks after them, a tail of 0..2 blocks that may be partial (or absent: the prompt may
    end on a chunk or on the index)."""
    block = draw(st.sampled_from(block_sizes))
    spans, cursor = [], 0
    for _ in range(draw(st.integers(0, 5))):
        start = cursor + block * draw(st.integers(0, 2))
        cursor = start + block * draw(st.integers(1, 2))
        spans.append((start, cursor))
    version = draw(st.sampled_from(PROTOCOL_VERSIONS))
    index_span = ()
    if version >= 3 and draw(st.booleans()):
        start = cursor + block * draw(st.integers(0, 1))
        cursor = start + block * draw(st.integers(1, 2))
        index_span = (start, cursor)
    prompt_len = max(1, cursor + draw(st.integers(0, 2 * block)))
    return PromptLayout(
        input_ids=tuple(range(prompt_len)),  # token ids play no part in visibility
        block_size=block,
        chunk_spans=tuple(spans),
        thinking=draw(st.booleans()),
        protocol_version=version,
        index_span=index_span,
    )


CHUNK_LISTS = st.builds(  # valid, out-of-range, malformed and empty ids
    lambda ids, sep: sep.join(ids),
    st.lists(st.sampled_from(["0", "1", "2", "3", "5", "7", "x", "", "02"]), max_size=3),
    st.sampled_from([",", " ", ", "]),
)
FOCUS_TAGS = st.builds(
    lambda ids, quote, gap: f"<focus{gap}magic_chunks={quote}{ids}{quote}>",
    CHUNK_LISTS,
    st.sampled_from(['"', "'"]),
    st.sampled_from([" ", "  ", "\n"]),
)
SOUP_WORDS = [
    "<global>", "</global>", "<local>", "</local>", "</focus>", "<answer>", "</answer>", "<think>", "</think>",
    "<focus>", "<focus magic_chunks=", "<focused>", "</focus junk", "<global junk>", "<answers>", "<", ">",
    "</", "/", "focus", "global", "x < 3 and y > 2", " ", "\n", "the mill", "é", "€", "😀", "7",
    "<index>", "</index>", "<index junk", "index",
]  # fmt: skip
WORDS = st.one_of(
    st.sampled_from(SOUP_WORDS),
    FOCUS_TAGS,
    FOCUS_TAGS,  # twice: focus is the mode with the most to get wrong
    st.text(alphabet="<>/=\"' ,0123abcfglosux_-é", max_size=4),
)


@st.composite
def tag_soup(draw) -> tuple[list[bytes], list[int]]:
    """``(token table, completion ids)``: soup cut at random byte offsets, special tokens (no text) mixed in."""
    data = "".join(draw(st.lists(WORDS, max_size=16))).encode()
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=len(data))))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]
    for at in draw(st.lists(st.integers(0, len(pieces)), max_size=2)):
        pieces.insert(at, b"")  # a special token: in the stream, no text
    return pieces, list(range(len(pieces)))  # each piece is its own token


# -- the properties -------------------------------------------------------------------------------


@given(layouts(), tag_soup())
def test_tracker_and_trace_agree_with_the_oracle(layout, soup):
    table, ids = soup
    states = oracle_states(layout, table, ids)
    n, prompt_len, block = len(ids), layout.prompt_len, layout.block_size
    chunks = chunk_of_each_key(layout, prompt_len + n)

    tracker = VisibilityTracker(layout, table)
    for j, token in enumerate(ids):
        blocks = tracker.advance(token).tolist()
        position = prompt_len + j
        read = keys_read(chunks, states[j], position)
        assert tracker.state == states[j], f"token {j}: {prefix_text(table, ids[: j + 1])!r}"
        assert blocks == sorted({key // block for key in np.flatnonzero(read)}), f"token {j}"
        assert tracker.kv_tokens == read.sum(), f"token {j}"  # aligned chunks: block rounding loses nothing

    trace = trace_completion(layout, ids, table)
    assert [trace.states[s] for s in trace.row_state] == states
    predicted_under = [ModeState("global"), *states[:-1]]  # g_0 by the prefill's last row, in global
    expected_kv = [keys_read(chunks, predicted_under[j], prompt_len - 1 + j).sum() for j in range(n)]
    assert trace.kv_tokens.tolist() == expected_kv
    assert trace.kv_tokens_vanilla.tolist() == [prompt_len + j for j in range(n)]
    whole = parse_completion(
        prefix_text(table, ids),
        layout.num_chunks,
        layout.thinking,
        layout.protocol_version,
        bool(layout.index_span),
    )
    assert (trace.parsed.segments, trace.parsed.answer, trace.parsed.violations) == (
        whole.segments, whole.answer, whole.violations,
    )  # fmt: skip


def oracle_mask(layout, table, ids, start: int, seq_len: int) -> np.ndarray:
    """``[T, T]`` bool: one padded training row, decided cell by cell from the oracle.

    Prompt rows read causally (prefill is unmasked); completion row ``prompt_len + j`` reads what the
    forward of ``g_j`` reads; padding rows read only themselves and nobody reads padding."""
    prompt_len, n = layout.prompt_len, len(ids)
    chunks = chunk_of_each_key(layout, prompt_len + n)
    states = oracle_states(layout, table, ids)
    mask = np.eye(seq_len, dtype=bool)
    for p in range(prompt_len):
        mask[start + p, start : start + p + 1] = True
    for j, state in enumerate(states):
        p = prompt_len + j
        mask[start + p, start : start + p + 1] = keys_read(chunks, state, p)
    return mask


def read_block_mask(block_mask, seq_len: int) -> torch.Tensor:
    """``[B, T, T]`` bool: what FlexAttention reads through ``block_mask``: full tiles whole, partial
    tiles through its ``mask_mod``, every other tile not at all."""
    q_block, kv_block = block_mask.BLOCK_SIZE
    batch, _, q_blocks = block_mask.kv_num_blocks.shape
    out = torch.zeros(batch, seq_len, seq_len, dtype=torch.bool)
    tile_lists = [(block_mask.kv_num_blocks, block_mask.kv_indices, False)]
    if block_mask.full_kv_num_blocks is not None:
        tile_lists.append((block_mask.full_kv_num_blocks, block_mask.full_kv_indices, True))
    for b in range(batch):
        for qb in range(q_blocks):
            q = torch.arange(qb * q_block, min((qb + 1) * q_block, seq_len))
            for counts, indices, full in tile_lists:
                for kb in indices[b, 0, qb, : counts[b, 0, qb]].tolist():
                    kv = torch.arange(kb * kv_block, min((kb + 1) * kv_block, seq_len))
                    tile = (
                        torch.ones(len(q), len(kv), dtype=torch.bool)
                        if full
                        else block_mask.mask_mod(torch.tensor(b), torch.tensor(0), q[:, None], kv[None, :])
                    )
                    out[b, q[:, None], kv[None, :]] |= tile
    return out


@given(
    # blocks up to 16 keep rows short (a dense mask is T^2); the tracker test above covers 32
    st.lists(
        st.tuples(layouts(block_sizes=(1, 2, 3, 4, 8, 16)), tag_soup(), st.integers(0, 5)),
        min_size=1,
        max_size=2,
    ),
    st.integers(0, 4),
    st.sampled_from([8, 16, 32]),
)
def test_training_masks_agree_with_the_oracle(rows, right_pad, flex_block):
    table_of = [soup[0] for _, soup, _ in rows]
    traces = [trace_completion(layout, soup[1], soup[0]) for layout, soup, _ in rows]
    lengths = [left + layout.prompt_len + len(soup[1]) for layout, soup, left in rows]
    seq_len = max(lengths) + right_pad
    batch = mask_batch(traces, [left for _, _, left in rows], seq_len)
    expected = np.stack(
        [
            oracle_mask(layout, table, soup[1], left, seq_len)
            for (layout, soup, left), table in zip(rows, table_of)
        ]
    )
    dense = dense_training_mask(batch)[:, 0].numpy()
    assert (dense == expected).all(), np.argwhere(dense != expected)[:5].tolist()
    flex = read_block_mask(block_training_mask(batch, block_size=flex_block), seq_len).numpy()
    assert (flex == expected).all(), np.argwhere(flex != expected)[:5].tolist()


@given(
    layouts(block_sizes=(1, 2, 3, 4, 8, 16)),
    st.lists(tag_soup(), min_size=1, max_size=3),
    st.integers(0, 5),
    st.integers(0, 4),
    st.sampled_from([8, 16, 32]),
)
def test_shared_prompt_rows_agree_with_the_oracle(layout, soups, left, right_pad, flex_block):
    """``[pad] prompt c_1 .. c_k [pad]``: completion ``i`` must read exactly what it read alone (the
    prompt under its own modes, and its own earlier tokens), at the positions the engine gave it."""
    prompt_len = layout.prompt_len
    traces = [trace_completion(layout, ids, table) for table, ids in soups]
    seq_len = left + prompt_len + sum(len(ids) for _, ids in soups) + right_pad
    batch = shared_mask_batch([traces], [left], seq_len)

    expected = np.eye(seq_len, dtype=bool)
    positions = np.zeros(seq_len, dtype=np.int64)
    for p in range(prompt_len):
        expected[left + p, left : left + p + 1] = True
        positions[left + p] = p
    offset = left + prompt_len  # where this completion's first token sits in the row
    for table, ids in soups:
        chunks = chunk_of_each_key(layout, prompt_len + len(ids))
        for j, state in enumerate(oracle_states(layout, table, ids)):
            alone = keys_read(chunks, state, prompt_len + j)  # [prompt_len + j + 1] in engine positions
            row = offset + j
            expected[row, left : left + prompt_len] = alone[:prompt_len]
            expected[row, offset : row + 1] = alone[prompt_len:]
            positions[row] = prompt_len + j
        offset += len(ids)

    real = np.arange(seq_len)[(np.arange(seq_len) >= left) & (np.arange(seq_len) < offset)]
    assert (batch.position_ids[0].numpy()[real] == positions[real]).all()
    dense = dense_training_mask(batch)[0, 0].numpy()
    assert (dense == expected).all(), np.argwhere(dense != expected)[:5].tolist()
    flex = read_block_mask(block_training_mask(batch, block_size=flex_block), seq_len)[0].numpy()
    assert (flex == expected).all(), np.argwhere(flex != expected)[:5].tolist()

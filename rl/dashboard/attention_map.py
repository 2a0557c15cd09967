"""The attention map of one trajectory record: which KV blocks each decoding step read.

Rebuilt from what the record stores — the layout geometry (``block_size``, ``prompt_len``,
``chunk_spans``), the table of mode states and the state each token was predicted under — through
the shared code: :class:`~rollouts.protocol.PromptLayout` maps blocks to chunks and
:func:`~rollouts.masks.visible_chunks` is the one visibility rule. Row ``j`` is the forward that
predicted token ``j`` (at position ``prompt_len - 1 + j``): its prompt blocks are those of visible
chunks (scaffold always), plus every block generation has written so far.

:func:`check_against_trace` recounts the KV tokens the map implies with
:func:`~rollouts.masks.kv_tokens_read` and compares them with the recorded per-step reads, so a
record whose geometry and trace disagree is caught rather than drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rollouts.masks import kv_tokens_read, visible_chunks
from rollouts.protocol import ModeState, PromptLayout

MASKED = -1  # cell value of a block the step did not read


@dataclass(frozen=True)
class AttentionMap:
    """``cells[j, b]``: ``MASKED``, or the owner of block ``b`` read at step ``j``: its prompt region
    (``PromptLayout.chunk_of_block``: 0 scaffold, chunk ids, ``num_chunks + 1`` the index) for prompt
    blocks, ``num_chunks + 2`` for generated blocks."""

    cells: np.ndarray  # [steps, blocks] int32
    modes: list[str]  # [steps] the mode each step's token was predicted under
    chunk_of_block: np.ndarray  # [blocks] owner of each block (as in ``cells``, unmasked)
    num_chunks: int
    block_size: int
    prompt_len: int

    @property
    def generated_owner(self) -> int:
        return self.num_chunks + 2


def attention_map(record: dict) -> AttentionMap:
    geometry = record["layout"]
    bs, prompt_len = int(geometry["block_size"]), int(geometry["prompt_len"])
    # Only the geometry matters for block ownership; token ids are not stored in the record.
    layout = PromptLayout(
        input_ids=(0,) * prompt_len,
        block_size=bs,
        chunk_spans=tuple((int(s), int(e)) for s, e in geometry["chunk_spans"]),
        index_span=tuple(int(x) for x in geometry.get("index_span", ())),
    )
    states = [ModeState(s["mode"], tuple(s["chunks"])) for s in record["states"]]
    predicted = np.asarray(record["predicted_state"], dtype=np.int64)
    steps = len(predicted)
    last_position = prompt_len - 1 + max(steps - 1, 0)
    n_blocks = max(layout.num_blocks, last_position // bs + 1)
    owner = np.full(n_blocks, layout.num_chunks + 2, dtype=np.int32)
    owner[: layout.num_blocks] = layout.chunk_of_block
    # The prompt's last block may also hold generated tokens; it is a prompt block for masking.
    cells = np.full((steps, n_blocks), MASKED, dtype=np.int32)
    for j, state_index in enumerate(predicted):
        visible = visible_chunks(states[state_index], layout.num_chunks)
        prompt_visible = visible[layout.chunk_of_block]
        cells[j, : layout.num_blocks] = np.where(prompt_visible, layout.chunk_of_block, MASKED)
        tail = (prompt_len - 1 + j) // bs
        cells[j, layout.num_blocks : tail + 1] = owner[layout.num_blocks : tail + 1]
    return AttentionMap(cells, [states[i].mode for i in predicted], owner, layout.num_chunks, bs, prompt_len)


def check_against_trace(amap: AttentionMap, record: dict) -> np.ndarray:
    """``[steps]`` bool: whether the map's KV tokens equal the recorded ``kv_tokens`` at each step."""
    steps = amap.cells.shape[0]
    visible_blocks = (amap.cells != MASKED).sum(axis=1)
    positions = amap.prompt_len - 1 + np.arange(steps)
    implied = kv_tokens_read(visible_blocks, positions, amap.block_size)
    return implied == np.asarray(record["kv_tokens"][:steps])

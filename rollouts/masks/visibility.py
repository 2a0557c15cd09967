"""Visibility: which KV positions each generated position may read. The single source of truth.

Everything that needs to know what a DA token saw calls into this module: the vLLM plugin (visible
block list per decoding step), the reference engine, the trainer's log-prob forward (the training
mask is built from :func:`state_visibility` and :class:`CompletionTrace`), the KV-read accounting and
the dashboards.

The rule, in one function (:func:`visible_chunks`): scaffold (region 0) and generated tokens are
always visible; ``global`` shows every chunk and the index, ``focus`` the listed chunks, ``local``
nothing more, ``index`` the index region only (``PromptLayout.index_region``).

Timing (docs/ARCHITECTURE.md, contract 3: tag timing): the forward of generated token ``g_j`` (at position
``prompt_len + j``) reads KV under the state reached after parsing ``g_0..g_j``; it predicts
``g_{j+1}``. So ``g_{j+1}`` is *predicted under* the state after ``g_0..g_j``, and ``g_0`` is
predicted by the prefill's last row, which reads the whole prompt: ``global``. Prompt rows are never
masked (prefill runs unmasked), so this holds in every protocol version, also in version 5, where the
parse starts in the resting mode: from ``g_0``'s own forward on, the state is the parser's.

Accounting (contract 7: accounting is exact): the forward at position ``P`` with ``k`` visible blocks reads
``(k - 1) * block_size + (P % block_size + 1)`` KV tokens: whole blocks for every visible block
before the tail, and the tokens written so far in the tail block (the block holding ``P``). That is
exactly the ``seq_len`` the engine hands to attention. Vanilla causal attention reads ``P + 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rollouts.protocol.layout import PromptLayout
from rollouts.protocol.modes import mode_by_name
from rollouts.protocol.parser import GLOBAL_STATE, ModeState, ParsedCompletion, ProtocolParser
from rollouts.protocol.tokens import TokenTextStream


def visible_chunks(state: ModeState, num_chunks: int) -> np.ndarray:
    """``[num_chunks + 2]`` bool, one entry per prompt region (``PromptLayout.chunk_of_block``'s ids):
    entry ``c`` in ``1..num_chunks`` says whether chunk ``c`` is visible, entry ``num_chunks + 1``
    whether the index is; entry 0 (scaffold and generated tokens) is always True. *The* visibility rule:
    a mode reads the regions of its ``visible`` rule (rollouts/protocol/modes.py), registered modes too.

    >>> visible_chunks(ModeState("focus", (2,)), 3).tolist(), visible_chunks(ModeState("index"), 3).tolist()
    ([True, False, True, False, False], [True, False, False, False, True])
    """
    vis = np.zeros(num_chunks + 2, dtype=bool)
    vis[0] = True
    rule = mode_by_name(state.mode).visible
    if rule == "all":
        vis[:] = True
    elif rule == "index":
        vis[num_chunks + 1] = True
    elif rule == "listed":
        vis[list(state.chunks)] = True
    return vis  # "none": the scaffold and the generated tokens only


def state_visibility(states: Sequence[ModeState], num_chunks: int) -> np.ndarray:
    """``[len(states), num_chunks + 2]`` bool, one :func:`visible_chunks` row per state."""
    return (
        np.stack([visible_chunks(s, num_chunks) for s in states])
        if states
        else np.ones((0, num_chunks + 2), bool)
    )


def kv_tokens_read(visible_blocks: int | np.ndarray, position: int | np.ndarray, block_size: int):
    """KV tokens read by the forward at ``position`` that sees ``visible_blocks`` blocks (tail included)."""
    return (visible_blocks - 1) * block_size + position % block_size + 1


def causal_kv_tokens(prompt_len: int, steps: int) -> np.ndarray:
    """``[steps]`` KV tokens vanilla causal attention reads over the first ``steps`` decoding steps after a
    ``prompt_len``-token prompt: step ``j`` is the forward at position ``prompt_len - 1 + j``, which sees
    every block, so it reads ``prompt_len + j`` (:func:`kv_tokens_read` with every block visible).

    >>> causal_kv_tokens(100, 4).tolist()
    [100, 101, 102, 103]
    """
    return np.arange(prompt_len, prompt_len + steps, dtype=np.int64)


def visible_keys(visible_blocks: np.ndarray, position: int, block_size: int) -> np.ndarray:
    """``[position + 1]`` bool: the keys the forward at ``position`` reads, given its visible blocks.

    Causal too: a key is read when its block is visible and it is already cached (``<= position``), so
    ``visible_keys(...).sum() == kv_tokens_read(len(visible_blocks), position, block_size)``.
    """
    block_visible = np.zeros(position // block_size + 1, dtype=bool)
    block_visible[np.asarray(visible_blocks, dtype=np.int64)] = True
    return block_visible[np.arange(position + 1) // block_size]


class VisibilityTracker:
    """Streaming visibility for one request: feed each new token, get the blocks its forward may read.

    ``advance(token_id)`` parses the token, then returns the visible block indices (int32, ascending,
    tail block last) for the forward of that token. Amortized O(1) per token: the prompt part of the
    list is rebuilt only when the mode changes, and a block is appended when generation enters it.
    """

    def __init__(self, layout: PromptLayout, token_table: list[bytes]):
        self.layout = layout
        self.parser = ProtocolParser(
            layout.num_chunks,
            thinking=layout.thinking,
            version=layout.protocol_version,
            has_index=layout.has_index,
        )
        self._text = TokenTextStream(token_table)
        self._chunk_of_block = layout.chunk_of_block
        self._block_size = layout.block_size
        self._num_blocks = layout.num_blocks
        self._prompt_blocks: dict[ModeState, np.ndarray] = {}
        self._buffer = np.empty(layout.num_blocks + 64, dtype=np.int32)
        self.state = GLOBAL_STATE  # the prefill's last row reads the whole prompt, in every version
        self.position = layout.prompt_len - 1  # the last forward so far was the prefill's last row
        self._tail = self.position // self._block_size
        self._n = self._load_prompt_blocks(GLOBAL_STATE)

    @property
    def visible_blocks(self) -> np.ndarray:
        """The blocks the current forward may read (a view; copy it to keep it)."""
        return self._buffer[: self._n]

    @property
    def kv_tokens(self) -> int:
        """KV tokens the current forward reads (the ``seq_len`` handed to attention)."""
        return int(kv_tokens_read(self._n, self.position, self._block_size))

    def advance(self, token_id: int) -> np.ndarray:
        piece = self._text(token_id)
        # The parser's state, also when the token completed no character: in version 5 the state
        # after g_0 is the resting one even while g_0's bytes are held back
        state = self.parser.feed(piece) if piece else self.parser.state
        if state != self.state:
            self.state = state
            self._n = self._load_prompt_blocks(state)
        self.position += 1
        tail = self.position // self._block_size
        if tail != self._tail:  # generation entered a new block (always past the prompt's blocks)
            self._tail = tail
            if self._n == len(self._buffer):
                self._buffer = np.concatenate([self._buffer, np.empty(len(self._buffer), np.int32)])
            self._buffer[self._n] = tail
            self._n += 1
        return self._buffer[: self._n]

    def finish(self):
        """Flush held-back bytes and close the parse (end-of-stream violations)."""
        rest = self._text.flush()
        if rest:
            self.parser.feed(rest)
        return self.parser.finish()

    def _load_prompt_blocks(self, state: ModeState) -> int:
        """Write the prompt's visible blocks for ``state`` plus the generated blocks so far; return the count."""
        prompt = self._prompt_blocks.get(state)
        if prompt is None:
            vis = visible_chunks(state, self.layout.num_chunks)
            prompt = self._prompt_blocks[state] = np.flatnonzero(vis[self._chunk_of_block]).astype(np.int32)
        first_gen = self._num_blocks
        tail = self.position // self._block_size
        n_gen = max(0, tail - first_gen + 1)
        need = len(prompt) + n_gen
        if need > len(self._buffer):
            self._buffer = np.empty(2 * need, dtype=np.int32)
        self._buffer[: len(prompt)] = prompt
        self._buffer[len(prompt) : need] = np.arange(first_gen, first_gen + n_gen, dtype=np.int32)
        return need


@dataclass(frozen=True)
class CompletionTrace:
    """Visibility and KV reads along one completion, step by step.

    ``states`` is the table of distinct mode states; per generated token ``j``:

    - ``row_state[j]``: index of the state after parsing ``g_0..g_j`` = the state the forward at
      position ``prompt_len + j`` reads under (the training mask row of that position);     # [n]
    - ``kv_tokens[j]`` / ``kv_tokens_vanilla[j]``: KV tokens read by the forward that *predicted*
      ``g_j`` (``j = 0``: the prefill's last row), under DA and under causal attention.     # [n]
    """

    layout: PromptLayout
    states: tuple[ModeState, ...]
    row_state: np.ndarray  # [n] int32
    kv_tokens: np.ndarray  # [n] int64
    kv_tokens_vanilla: np.ndarray  # [n] int64
    parsed: ParsedCompletion | None = (
        None  # the tracker's own parse of the completion (segments, answer, violations)
    )

    @property
    def predicted_state(self) -> np.ndarray:
        """``[n]`` int32: index of the state each generated token was predicted under."""
        return (
            np.concatenate([[0], self.row_state[:-1]]).astype(np.int32)
            if len(self.row_state)
            else self.row_state
        )

    @property
    def predicted_modes(self) -> list[str]:
        """``[n]``: the mode each generated token was predicted under (what mode mixes count)."""
        return [self.states[i].mode for i in self.predicted_state]

    @property
    def saving(self) -> float:
        """``1 - DA / vanilla`` KV tokens read over the completion (0 for an empty one)."""
        vanilla = int(self.kv_tokens_vanilla.sum())
        return 1.0 - int(self.kv_tokens.sum()) / vanilla if vanilla else 0.0


def trace_completion(
    layout: PromptLayout, completion_ids: Sequence[int], token_table: list[bytes]
) -> CompletionTrace:
    """Replay a completion through :class:`VisibilityTracker`, recording every step.

    The same tracker the engine runs, so trainer masks and accounting cannot drift from the engine;
    its parse (``CompletionTrace.parsed``) is the completion's parse, so nobody parses it twice.
    """
    tracker = VisibilityTracker(layout, token_table)
    n = len(completion_ids)
    index: dict[ModeState, int] = {GLOBAL_STATE: 0}
    row_state = np.zeros(n, dtype=np.int32)
    kv = np.empty(n, dtype=np.int64)
    if n:
        kv[0] = tracker.kv_tokens  # g_0 is predicted by the prefill's last row
    for j, token_id in enumerate(completion_ids):
        tracker.advance(int(token_id))
        row_state[j] = index.setdefault(tracker.state, len(index))
        if j + 1 < n:
            kv[j + 1] = tracker.kv_tokens
    vanilla = causal_kv_tokens(layout.prompt_len, n)
    return CompletionTrace(layout, tuple(index), row_state, kv, vanilla, tracker.finish())

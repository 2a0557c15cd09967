"""The paper's Acme example on a real DA layout, and trajectories built from completions on it."""

from __future__ import annotations

import numpy as np

from rollouts.masks import trace_completion
from rollouts.protocol import GLOBAL_STATE, LOCAL_STATE, ModeState, PromptLayout, parse_completion
from rollouts.trajectory import Trajectory

ACME_QUESTION = "How many years after Acme Corp was founded did it go public?"
_FILLER = (
    "The river runs past the old mill and the market opens early on most days. "
    "Farmers bring bread, apples and cheese, and the baker sells out before noon. "
)


def acme_documents() -> list[str]:
    """Seven documents; the founding year is in chunk 2, the listing year in chunk 7 (as in the paper)."""
    docs = [f"Document {i}. " + _FILLER * 6 for i in range(1, 8)]
    docs[1] += "Acme Corp was founded in 2003 in San Jose. " + _FILLER
    docs[6] += "Acme Corp went public on the NYSE in 2011. " + _FILLER
    return docs


def acme_example(**overrides) -> dict:
    """A dataset row in the project's example schema."""
    row = {
        "id": "acme-0",
        "task": "multi_hop",
        "question": ACME_QUESTION,
        "documents": acme_documents(),
        "answers": ["8"],
        "metric": "numeric",
        "evidence_chunks": [2, 7],
        "context_tokens": 0,
        "num_chunks": 7,
        "gold_completion": "".join(text for text, _ in ACME_GOLD),
        "gold_completion_thinking": "",
        "source": "paper",
    }
    return row | overrides


F2, F7 = ModeState("focus", (2,)), ModeState("focus", (7,))

# The paper's protocol-correct trace as (piece, state in force once the piece is read).
ACME_GOLD = [
    ("<global>", GLOBAL_STATE),
    ("I need the founding year and the IPO year. Magic Chunk 2 has the history.", GLOBAL_STATE),
    ("</global>", GLOBAL_STATE),
    ('<focus magic_chunks="2">', F2),
    ("Acme Corp was founded in 2003 in San Jose.", F2),
    ("</focus>", GLOBAL_STATE),
    ('<focus magic_chunks="7">', F7),
    ("Acme Corp went public on the NYSE in 2011.", F7),
    ("</focus>", GLOBAL_STATE),
    ("<local>", LOCAL_STATE),
    ("2011 - 2003 = 8 years.", LOCAL_STATE),
    ("</local>", GLOBAL_STATE),
    ("<answer>8 years</answer>", GLOBAL_STATE),
]
ACME_GOLD_TEXT = "".join(text for text, _ in ACME_GOLD)


def piece_ids(tokenizer, pieces) -> tuple[list[int], list[ModeState]]:
    """Token ids of the pieces tokenized one by one, and the state each token was *predicted under*.

    Tokenizing piece by piece puts token boundaries on piece boundaries, so a tag completes exactly
    at its piece's last token and every token of piece ``i`` is predicted under the state in force
    after piece ``i - 1`` (docs/ARCHITECTURE.md, contract 3: tag timing), with no parsing involved.
    """
    ids, predicted = [], []
    state = GLOBAL_STATE
    for text, after in pieces:
        new = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += new
        predicted += [state] * len(new)
        state = after
    return ids, predicted


def reference_reads(layout: PromptLayout, predicted: list[ModeState]) -> tuple[np.ndarray, np.ndarray]:
    """KV tokens each step reads, worked out from the chunk spans: causal minus the hidden chunks.

    Step ``j`` is the forward at position ``P = prompt_len - 1 + j``; vanilla reads ``P + 1`` tokens.
    Chunks are block aligned and lie wholly before ``P``, so hiding a chunk removes exactly its span.
    """
    n = len(predicted)
    vanilla = layout.prompt_len + np.arange(n)
    hidden = []
    for state in predicted:
        visible = range(1, layout.num_chunks + 1) if state.mode == "global" else state.chunks
        hidden.append(sum(e - s for c, (s, e) in enumerate(layout.chunk_spans, 1) if c not in visible))
    return vanilla - np.array(hidden), vanilla


def make_trajectory(
    layout: PromptLayout, tokenizer, token_table, completion, example: dict, **fields
) -> Trajectory:
    """A trajectory for ``completion`` (text, or (piece, state) pairs tokenized piece by piece)."""
    if isinstance(completion, str):
        text, ids = completion, tokenizer(completion, add_special_tokens=False)["input_ids"]
    else:
        text, ids = "".join(t for t, _ in completion), piece_ids(tokenizer, completion)[0]
    trace = trace_completion(layout, ids, token_table)
    parsed = parse_completion(text, layout.num_chunks, layout.thinking, layout.protocol_version)
    return Trajectory(example, layout, ids, text, parsed, trace, **fields)

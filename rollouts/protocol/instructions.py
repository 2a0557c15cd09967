"""The system instructions that teach a model the DA protocol (non-thinking and thinking variants)."""

from __future__ import annotations

# The protocol version new layouts, exports and trajectories carry, and every version the parser reads.
# v2 (rollouts/protocol/parser.py): text that starts a DA tag name but does not complete the tag
# (`</focus junk`, `<answer x`) is a `malformed_tag` violation. v1: it is plain text, nothing else.
# The instructions below are the same text for both: v2 changes only how broken tags are scored.
PROTOCOL_VERSION = 2
PROTOCOL_VERSIONS = (1, 2)

_MODES = """\
The context is delivered as numbered Magic Chunks, returned by the get_magic_chunk tool. You control \
which of them you can see while you write, with three modes:
- <global>...</global>: every Magic Chunk is visible. You start in this mode. Use it to plan which \
chunks hold what you need.
- <focus magic_chunks="K">...</focus>: only the listed chunks are visible (for example \
magic_chunks="2" or magic_chunks="2,7"). Use it to read and copy the facts you need.
- <local>...</local>: no Magic Chunk is visible, only the question and what you have written. Use it \
to combine the facts you extracted.
Chunks outside your current mode are hidden from you, so copy every fact you will need while you \
focus on it. Close each mode before opening the next. When you are done, give the final answer once, \
as <answer>...</answer>, and write nothing after it."""

_NON_THINKING = _MODES

_THINKING = (
    _MODES
    + """
Think step by step inside <think>...</think> before answering. The modes work the same inside your \
thinking: plan in <global>, read in <focus>, reason in <local>; the <answer> comes after </think>."""
)


def system_instructions(thinking: bool = False) -> str:
    """The protocol instructions placed in the system message (always visible scaffold)."""
    return _THINKING if thinking else _NON_THINKING


def chunk_header(chunk_id: int) -> str:
    """The visible label written before a chunk's text (scaffold: the model sees it in every mode)."""
    return f"Magic Chunk {chunk_id}:\n"


GET_MAGIC_CHUNK_TOOL = {
    "type": "function",
    "function": {
        "name": "get_magic_chunk",
        "description": "Return the text of one Magic Chunk of the context.",
        "parameters": {
            "type": "object",
            "properties": {"chunk_id": {"type": "integer", "description": "1-based chunk number"}},
            "required": ["chunk_id"],
        },
    },
}

"""The system instructions that teach a model the DA protocol (non-thinking and thinking variants)."""

from __future__ import annotations

# The protocol version new layouts, exports and trajectories carry, and every version the parser reads
# (rollouts/protocol/parser.py has the rules):
# v5: decoding also starts in the resting mode, so no chunk is read before a `<global>` or `<focus>`
#     and a focus tag written first is chosen blind.
# v4: in a prompt without an index, closing tags return to `local` (no chunk), so every read of the
#     context is declared (`<global>` to survey, `<focus>` to extract); decoding still starts in `global`.
# v3: the `<index>` mode, and prompts with an index region, where closing tags return to `index`.
# v2: text that starts a DA tag name but does not complete the tag (`</focus junk`) is a
#     `malformed_tag` violation. v1: it is plain text, nothing else.
# A prompt without an index reads the same under v2 and v3, except that `<index>` is a tag in v3.
PROTOCOL_VERSION = 3
PROTOCOL_VERSIONS = (1, 2, 3, 4, 5)

_MODES = """\
The context is delivered as numbered Magic Chunks, returned by the get_magic_chunk tool. You control \
which of them you can see while you write, with three modes:
- <global>...</global>: every Magic Chunk is visible.{start} Use it to plan which \
chunks hold what you need.
- <focus magic_chunks="K">...</focus>: only the listed chunks are visible (for example \
magic_chunks="2" or magic_chunks="2,7"). Use it to read and copy the facts you need.
- <local>...</local>: no Magic Chunk is visible, only the question and what you have written. Use it \
to combine the facts you extracted.
Chunks outside your current mode are hidden from you, so copy every fact you will need while you \
focus on it. Close each mode before opening the next. When you are done, give the final answer once, \
as <answer>...</answer>, and write nothing after it."""

_THINKING = """
Think step by step inside <think>...</think> before answering. The modes work the same inside your \
thinking: plan in <global>, read in <focus>, reason in <local>; the <answer> comes after </think>."""


_INDEX = """
The prompt also holds an Index of the Magic Chunks: one short line per chunk naming what it holds.
- <index>...</index>: only the Index is visible, no Magic Chunk. After you close any mode you are back \
in this mode, so navigate here: find in the Index which chunks to read, then focus on them. Use \
<global> only when the Index is not enough (for example to count over every chunk)."""


_LOCAL_REST = """
After you close any mode no Magic Chunk is visible until you open <global> or <focus> again, so every \
read is one you declared: write your answer after closing the last mode."""


# where decoding starts: in global before v5 (said in the <global> line), else in the resting mode
_GLOBAL_START = " You start in this mode."
_LOCAL_START = """
You start in that resting mode too: open <global> to find what to read before you focus on anything."""
_INDEX_START = """
You start in the Index mode too."""


def system_instructions(thinking: bool = False, index: bool = False, version: int = PROTOCOL_VERSION) -> str:
    """The protocol instructions placed in the system message (always visible scaffold); ``index``:
    the prompt has an index (protocol v3); ``version``: v4 without an index rests in ``local``, v5
    also starts there (or in ``index``)."""
    text = _MODES.format(start="" if version >= 5 else _GLOBAL_START) + (_THINKING if thinking else "")
    if index:
        text += _INDEX
    elif version >= 4:
        text += _LOCAL_REST
    if version >= 5:
        text += _INDEX_START if index else _LOCAL_START
    return text


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

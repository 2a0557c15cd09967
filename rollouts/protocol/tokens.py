"""Token ids -> text pieces for the streaming parser, without calling the tokenizer per step.

The engine advances the parser with one token id per decoding step. ``tokenizer.decode([id])`` is
slow and wrong for byte-level BPE tokens that hold part of a UTF-8 character, so the bytes of every
token are computed once per tokenizer and decoded incrementally. Tags are ASCII, so only the text
around them is ever affected by a split character, never the tags themselves.

Special tokens (``<|im_end|>``, EOS, ...) map to no text, as in vLLM's default detokenization; added
tokens that are not special (Qwen3's ``<think>``) map to their content.
"""

from __future__ import annotations

import codecs
import json
from functools import lru_cache


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes -> printable-unicode map used by byte-level BPE vocabularies."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _decoder_kinds(tokenizer) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    stack, kinds = [decoder], set()
    while stack:
        node = stack.pop()
        kinds.add(node.get("type", ""))
        stack.extend(node.get("decoders") or [])
    return kinds


def token_bytes_table(tokenizer) -> list[bytes]:
    """The UTF-8 bytes each token id stands for, indexed by id (``len(tokenizer)`` entries)."""
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    added = {i: t for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    kinds = _decoder_kinds(tokenizer)
    table: list[bytes] = []
    if "ByteLevel" in kinds:
        byte_of = byte_decoder()

        def to_bytes(token_id: int, tok: str) -> bytes:
            return bytes(byte_of[c] for c in tok) if all(c in byte_of for c in tok) else tok.encode()

    elif "Metaspace" in kinds or "ByteFallback" in kinds:

        def to_bytes(token_id: int, tok: str) -> bytes:
            if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
                return bytes([int(tok[3:5], 16)])
            return tok.replace("\u2581", " ").encode()

    else:

        def to_bytes(token_id: int, tok: str) -> bytes:
            return tokenizer.decode([token_id]).encode()

    for token_id, tok in enumerate(tokens):
        if token_id in added:
            table.append(b"" if added[token_id].special else added[token_id].content.encode())
        elif tok is None:
            table.append(b"")
        else:
            table.append(to_bytes(token_id, tok))
    return table


class TokenTextStream:
    """Feeds token ids, returns the text they complete (incomplete UTF-8 is held back)."""

    def __init__(self, table: list[bytes]):
        self._table = table
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds back split characters

    def __call__(self, token_id: int) -> str:
        try:
            data = self._table[token_id]
        except IndexError:
            data = b""  # an id outside the vocabulary decodes to nothing; never raise on model output
        return self._utf8.decode(data) if data else ""

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)

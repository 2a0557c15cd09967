"""The DA prompt layout: scaffold, question and block-aligned magic chunks, as token ids with spans.

The prompt is laid out as the paper does it: the protocol in the system message, the question from
the user, then the context as a simulated tool dialogue, one ``get_magic_chunk(N)`` call answered by
one tool message per chunk, rendered with the tokenizer's own chat template so a real model sees the
special tokens it was post-trained on. Tokenizers without tool support get a plain-text layout.

Block alignment (docs/ARCHITECTURE.md, contract 2: block granularity): the engine reads whole KV blocks, so every chunk starts on a
block boundary (the scaffold before it is padded with a neutral token) and ends on one (the chunk is
padded after its text). A masked chunk then costs exactly its own blocks and no block mixes a chunk
with scaffold or with another chunk::

    | scaffold ... pad | chunk 1 text ... pad | scaffold ... pad | chunk 2 text ... pad | scaffold ...
                       ^ block boundary       ^                  ^                      ^

With ``index_entry_tokens`` the prompt also holds an *index* (rollouts/protocol/index.py): one short entry
per chunk in one block-aligned region after the chunks, which ``<index>`` mode reads instead of the
chunks (protocol v3)::

    ... | chunk N text ... pad | Index: Chunk 1: ... Chunk N: ... pad | scaffold (question) ...

Untrusted text (question and documents) never passes through the template: the template is rendered
with sentinels, and the untrusted pieces are neutralized and tokenized separately with
``split_special_tokens=True``, so documents can neither speak the protocol nor close a chat turn.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from .chunking import split_text
from .index import index_entries
from .instructions import (
    GET_MAGIC_CHUNK_TOOL,
    PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    chunk_header,
    system_instructions,
)
from .neutralize import neutralize

logger = logging.getLogger(__name__)

LAYOUT_STYLES = ("auto", "tool", "plain", "compact")
_SENTINEL = re.compile("\ue000(Q|C|I)(\\d+)\ue001")
INDEX_TITLE = "Index of the Magic Chunks:\n"  # the index region's first line (inside the region)


class LayoutError(ValueError):
    """A layout that cannot be built or does not fit the prompt it claims to describe."""


@dataclass(frozen=True)
class PromptLayout:
    """A laid-out DA prompt: its token ids and where each magic chunk lives.

    ``chunk_spans[i]`` is the token span ``[start, end)`` of chunk ``i + 1`` (block aligned; it
    includes the chunk's trailing padding). ``index_span`` is the index region's span, ``()`` when the
    prompt has no index. Every other prompt position is scaffold.
    ``protocol_version`` is the DA protocol version completions of this prompt are parsed with (the
    engines' visibility trackers read it; a v1 export is served with v1 layouts).
    """

    input_ids: tuple[int, ...]
    block_size: int
    chunk_spans: tuple[tuple[int, int], ...]
    thinking: bool = False
    style: str = field(default="tool", compare=False)  # descriptive: "tool" or "plain"
    chunk_texts: tuple[str, ...] = field(default=(), compare=False)
    protocol_version: int = PROTOCOL_VERSION
    index_span: tuple[int, ...] = ()  # (start, end) of the index region, () for none
    index_texts: tuple[str, ...] = field(default=(), compare=False)  # descriptive: the entries' text

    def __post_init__(self):
        self.validate()

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_spans)

    @property
    def has_index(self) -> bool:
        return bool(self.index_span)

    @property
    def index_region(self) -> int:
        """The region id of the index in ``chunk_of_block`` (after the chunks' ids ``1..num_chunks``)."""
        return self.num_chunks + 1

    @property
    def num_blocks(self) -> int:
        """Blocks the prompt touches (the last one may be partly filled by generated tokens)."""
        return -(-self.prompt_len // self.block_size)

    @property
    def scaffold_spans(self) -> list[tuple[int, int]]:
        """Token spans that are always visible: everything that is neither a chunk nor the index."""
        spans, cursor = [], 0
        for start, end in sorted([*self.chunk_spans, *([self.index_span] if self.index_span else [])]):
            if start > cursor:
                spans.append((cursor, start))
            cursor = end
        if cursor < self.prompt_len:
            spans.append((cursor, self.prompt_len))
        return spans

    @cached_property
    def chunk_of_block(self) -> np.ndarray:
        """``[num_blocks]`` int32: the region each prompt block belongs to: the chunk id (1-based), 0 for
        scaffold, ``index_region`` for the index."""
        out = np.zeros(self.num_blocks, dtype=np.int32)
        for chunk_id, (start, end) in enumerate(self.chunk_spans, start=1):
            out[start // self.block_size : end // self.block_size] = chunk_id
        if self.index_span:
            start, end = self.index_span
            out[start // self.block_size : end // self.block_size] = self.index_region
        return out

    @cached_property
    def chunk_of_token(self) -> np.ndarray:
        """``[prompt_len]`` int32: the region of each prompt token (``chunk_of_block``'s ids)."""
        return np.repeat(self.chunk_of_block, self.block_size)[: self.prompt_len]

    def validate(self) -> None:
        """Raise ``LayoutError`` unless spans are block aligned, ordered, disjoint and inside the prompt
        (the index after every chunk, and only from protocol version 3 on)."""
        version = self.protocol_version
        if type(version) is not int or version not in PROTOCOL_VERSIONS:
            raise LayoutError(
                f"DA protocol version {version!r} is not supported (this Heed reads {PROTOCOL_VERSIONS})"
            )
        b = self.block_size
        if not isinstance(b, int) or b < 1:
            raise LayoutError(f"block_size must be a positive integer, got {b!r}")
        cursor = 0
        for i, span in enumerate(self.chunk_spans, start=1):
            if len(span) != 2 or not all(isinstance(x, int) for x in span):
                raise LayoutError(f"chunk {i}: span must be two integers, got {span!r}")
            start, end = span
            if start % b or end % b:
                raise LayoutError(
                    f"chunk {i}: span [{start}, {end}) is not aligned to block_size={b}; "
                    "lay the prompt out with build_prompt(..., block_size=) matching the engine"
                )
            if not cursor <= start < end:
                raise LayoutError(f"chunk {i}: span [{start}, {end}) is empty, unordered or overlapping")
            if end > self.prompt_len:
                raise LayoutError(
                    f"chunk {i}: span [{start}, {end}) ends past the prompt ({self.prompt_len} tokens)"
                )
            cursor = end
        if self.index_span:
            if version < 3:
                raise LayoutError(f"an index needs DA protocol version 3 or later, got version {version}")
            span = self.index_span
            if len(span) != 2 or not all(isinstance(x, int) for x in span):
                raise LayoutError(f"index: span must be two integers, got {span!r}")
            start, end = span
            if start % b or end % b:
                raise LayoutError(f"index: span [{start}, {end}) is not aligned to block_size={b}")
            if not cursor <= start < end <= self.prompt_len:
                raise LayoutError(
                    f"index: span [{start}, {end}) must be non-empty, after the last chunk (ends at {cursor}) "
                    f"and inside the prompt ({self.prompt_len} tokens)"
                )

    # -- travelling with a request (vLLM SamplingParams.extra_args must be msgpack-safe) ----------

    def to_wire(self) -> dict:
        """The minimal msgpack-safe form an engine needs; token ids travel as the prompt itself.

        ``version`` is the protocol version the engine parses the completion with; ``index_span`` is
        present only for a prompt with an index.
        """
        wire = {
            "version": self.protocol_version,
            "block_size": self.block_size,
            "prompt_len": self.prompt_len,
            "chunk_spans": [list(s) for s in self.chunk_spans],
            "thinking": self.thinking,
        }
        if self.index_span:
            wire["index_span"] = list(self.index_span)
        return wire

    @classmethod
    def from_wire(cls, wire: dict, prompt_token_ids: Sequence[int]) -> PromptLayout:
        """Rebuild a layout from ``to_wire()`` output; ``LayoutError`` if it does not fit the prompt."""
        if not isinstance(wire, dict):
            raise LayoutError(f"DA layout must be a dict, got {type(wire).__name__}")
        missing = {"version", "block_size", "prompt_len", "chunk_spans"} - wire.keys()
        if missing:
            raise LayoutError(f"DA layout is missing {sorted(missing)}")
        version = wire["version"]
        if type(version) is not int or version not in PROTOCOL_VERSIONS:
            raise LayoutError(
                f"DA layout version {version!r} is not supported (expected one of {PROTOCOL_VERSIONS})"
            )
        if wire["prompt_len"] != len(prompt_token_ids):
            raise LayoutError(
                f"DA layout was built for a {wire['prompt_len']}-token prompt but the request has "
                f"{len(prompt_token_ids)} tokens; send the layout's own input_ids as the prompt"
            )
        spans = wire["chunk_spans"]
        if not isinstance(spans, list | tuple):
            raise LayoutError("DA layout chunk_spans must be a list of [start, end] pairs")
        index_span = wire.get("index_span", ())
        if not isinstance(index_span, list | tuple):
            raise LayoutError("DA layout index_span must be a [start, end] pair")
        return cls(
            input_ids=tuple(prompt_token_ids),
            block_size=wire["block_size"],
            chunk_spans=tuple(tuple(s) if isinstance(s, list | tuple) else (s,) for s in spans),
            thinking=bool(wire.get("thinking", False)),
            protocol_version=version,
            index_span=tuple(index_span),
        )


# -- building -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutSettings:
    """How prompts are laid out: :func:`build_prompt`'s settings as one object. A run's SFT, rollouts and
    evals, its export's ``heed.json``, ``heed eval`` and ``heed serve`` lay prompts out from the same one,
    so a served request reads what training read.

    >>> LayoutSettings(style="compact", index_entry_tokens=10).to_dict()["index_entry_tokens"]
    10
    """

    block_size: int = 32  # KV block size of the engine (vLLM's CPU attention needs a multiple of 32)
    thinking: bool = False  # thinking-mode instructions and the template's thinking switch
    style: str = "auto"  # tool, plain, compact or auto (build_prompt)
    instructions: bool = True  # the protocol instructions in the system message
    index_entry_tokens: int = 0  # an index of the chunks with entries of this many tokens; 0: none
    protocol_version: int = PROTOCOL_VERSION  # what completions of these prompts are parsed with

    def __post_init__(self):
        if self.style not in LAYOUT_STYLES:
            raise LayoutError(f"style must be one of {LAYOUT_STYLES}, got {self.style!r}")
        if type(self.block_size) is not int or self.block_size < 1:
            raise LayoutError(f"block_size must be a positive integer, got {self.block_size!r}")
        if type(self.index_entry_tokens) is not int or self.index_entry_tokens < 0:
            raise LayoutError(f"index_entry_tokens must be an integer >= 0, got {self.index_entry_tokens!r}")
        if type(self.protocol_version) is not int or self.protocol_version not in PROTOCOL_VERSIONS:
            raise LayoutError(
                f"DA protocol version {self.protocol_version!r} is not supported (this Heed reads {PROTOCOL_VERSIONS})"
            )
        if self.index_entry_tokens and self.protocol_version < 3:
            raise LayoutError(
                f"an index needs DA protocol version 3 or later, got version {self.protocol_version}"
            )

    def build(self, question: str, context: str | Sequence[str], tokenizer, *, chunk_tokens: int = 2048):
        """:func:`build_prompt` under these settings."""
        return build_prompt(question, context, tokenizer, chunk_tokens=chunk_tokens, **self.to_dict())

    def for_mode(self, mode: str) -> LayoutSettings:
        """The settings a rollout ``mode`` lays its prompt out with: ``vanilla`` (the stock-engine
        reference, the paper's Vanilla) without the DA instructions, every other mode with these."""
        return replace(self, instructions=self.instructions and mode != "vanilla")

    def to_record(self) -> dict:
        """The settings as ``heed.json`` and the run config's ``run:`` section spell them (``style`` is
        ``layout_style``); :meth:`from_record` reads them back. The one serialiser of these settings.

        >>> LayoutSettings.from_record(LayoutSettings(style="compact").to_record()).style
        'compact'
        """
        return {key: getattr(self, name) for name, key in _RECORD_KEYS.items()}

    @classmethod
    def from_record(
        cls, record: Mapping, *, source: str = "", prefix: str = "", required: Sequence[str] = ()
    ) -> LayoutSettings:
        """The settings ``record`` holds (keys as :meth:`to_record` writes them; others are ignored). A
        missing key takes its default unless it is ``required``. A value of the wrong type or range is a
        :class:`LayoutError` naming ``source`` and the key as the user wrote it (``prefix`` + key, e.g.
        ``run.layout_style``).

        >>> LayoutSettings.from_record({"block_size": 64, "layout_style": "plain"}).to_dict()["style"]
        'plain'
        >>> LayoutSettings.from_record({"thinking": "yes"}, source="heed.json")
        Traceback (most recent call last):
        ...
        rollouts.protocol.layout.LayoutError: heed.json: thinking must be true or false, got 'yes'
        """
        at = f"{source}: " if source else ""
        missing = [key for key in required if key not in record]
        if missing:
            raise LayoutError(f"{at}{', '.join(prefix + key for key in missing)} missing")
        values = {}
        for name, key in _RECORD_KEYS.items():
            if key not in record:
                continue
            value, problem = record[key], _RECORD_CHECKS[key](record[key])
            if problem:
                raise LayoutError(f"{at}{prefix}{key} must be {problem}, got {value!r}")
            values[name] = value
        try:
            return cls(**values)
        except LayoutError as err:
            raise LayoutError(f"{at}{err}") from None

    def to_dict(self) -> dict:
        """:func:`build_prompt`'s keyword arguments."""
        return {
            "block_size": self.block_size,
            "thinking": self.thinking,
            "style": self.style,
            "instructions": self.instructions,
            "index_entry_tokens": self.index_entry_tokens,
            "protocol_version": self.protocol_version,
        }


DEFAULT_LAYOUT = LayoutSettings()  # build_prompt's defaults (frozen: safe as a default argument)
# LayoutSettings field -> its key in heed.json and in the run config's run: section
_RECORD_KEYS = {
    "block_size": "block_size",
    "thinking": "thinking",
    "style": "layout_style",
    "instructions": "instructions",
    "index_entry_tokens": "index_entry_tokens",
    "protocol_version": "protocol_version",
}


def _positive_int(value, least: int = 1) -> bool:
    return type(value) is int and value >= least


# record key -> what its value must be, or "" when it is that (bool is no int here: true is no block size)
_RECORD_CHECKS = {
    "block_size": lambda v: "" if _positive_int(v) else "a positive integer",
    "thinking": lambda v: "" if isinstance(v, bool) else "true or false",
    "layout_style": lambda v: "" if v in LAYOUT_STYLES else f"one of {', '.join(LAYOUT_STYLES)}",
    "instructions": lambda v: "" if isinstance(v, bool) else "true or false",
    "index_entry_tokens": lambda v: "" if _positive_int(v, 0) else "an integer >= 0",
    "protocol_version": lambda v: (
        "" if type(v) is int and v in PROTOCOL_VERSIONS else f"one of {PROTOCOL_VERSIONS}"
    ),
}


def build_prompt(
    question: str,
    context: str | Sequence[str],
    tokenizer,
    *,
    block_size: int = 32,
    chunk_tokens: int = 2048,
    thinking: bool = False,
    style: str = "auto",
    system_prompt: str | None = None,
    repeat_question: bool = True,
    pad_token_id: int | None = None,
    instructions: bool = True,
    protocol_version: int = PROTOCOL_VERSION,
    index_entry_tokens: int = 0,
) -> PromptLayout:
    """Lay out a DA prompt.

    Args:
        question: what the model must answer (scaffold: visible in every mode).
        context: raw text, split into chunks of about ``chunk_tokens`` at natural boundaries, or a
            list of documents, one chunk each (a document longer than ``chunk_tokens`` is split).
        tokenizer: a HF tokenizer; its chat template is used when it supports tool messages.
        block_size: KV block size of the engine (vLLM's CPU attention needs a multiple of 32).
        thinking: use the thinking-mode instructions and the template's thinking switch.
        style: ``"tool"`` (chat template tool dialogue), ``"plain"`` (plain text), ``"compact"``
            (plain text whose chunk headers sit inside their chunk's own blocks: no scaffold block per
            chunk, so a masked chunk hides its header too; for small models on short contexts), or
            ``"auto"`` (tool when the template supports it, else plain with a warning).
        system_prompt: text placed before the protocol instructions in the system message.
        repeat_question: repeat the question after the chunks (long contexts bury the first one).
        pad_token_id: token used to pad to block boundaries; default: the single token for ``"\\n"``.
        instructions: put the protocol instructions in the system message. A model that learns the
            protocol from SFT (the tiny default, trained from scratch) does not need them; a pretrained
            model following DA zero-shot does.
        protocol_version: the DA protocol version completions are parsed with (``PROTOCOL_VERSIONS``).
        index_entry_tokens: lay out an index after the chunks, one entry of at most this many tokens per
            chunk (rollouts/protocol/index.py); 0 for none. An index needs protocol version 3.
    """
    LayoutSettings(
        block_size, thinking, style, instructions, index_entry_tokens, protocol_version
    )  # checks them
    chunks = _split_context(context, chunk_tokens, tokenizer)
    if not chunks:
        raise LayoutError("the context is empty: DA needs at least one magic chunk")
    chunks = [neutralize(c) for c in chunks]
    entries: tuple[str, ...] = ()
    if index_entry_tokens:
        try:
            entries = index_entries(
                chunks, lambda t: len(_encode(tokenizer, t, trusted=False)), index_entry_tokens
            )
        except ValueError as err:
            raise LayoutError(str(err)) from None
    parts = [system_prompt] if system_prompt is not None else []
    system = "\n\n".join(
        parts + ([system_instructions(thinking, bool(entries), protocol_version)] if instructions else [])
    )

    rendered = None
    if style in ("auto", "tool"):
        rendered, why = _render_tool_dialogue(
            tokenizer, system, len(chunks), thinking, repeat_question, bool(entries)
        )
        if rendered is None:
            if style == "tool":
                raise LayoutError(
                    f"the tokenizer's chat template cannot lay out a tool dialogue ({why}); use style='plain'"
                )
            logger.warning(
                "chat template has no usable tool support (%s); using the plain-text DA layout", why
            )
    used_style = "tool" if rendered is not None else ("compact" if style == "compact" else "plain")
    if rendered is None:
        rendered = _render_plain(
            tokenizer, system, len(chunks), repeat_question, compact=style == "compact", index=bool(entries)
        )

    pad = _pad_token(tokenizer) if pad_token_id is None else pad_token_id
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    index_span: tuple[int, ...] = ()
    for kind, payload in _pieces(rendered, len(chunks)):
        if kind == "template":
            ids += _encode(tokenizer, payload, trusted=True)
        elif kind == "question":
            ids += _encode(tokenizer, neutralize(question), trusted=False)
        elif kind == "index":
            ids += [pad] * (-len(ids) % block_size)
            start = len(ids)
            ids += _encode(tokenizer, INDEX_TITLE, trusted=True)
            for entry in entries:
                # the header is ours, the rest comes from the documents: tokenized apart, capped to the entry size
                header, text = entry.split(": ", 1)
                head = _encode(tokenizer, header + ": ", trusted=True)
                ids += (head + _encode(tokenizer, text, trusted=False))[:index_entry_tokens]
                ids += _encode(tokenizer, "\n", trusted=True)
            ids += [pad] * (-len(ids) % block_size)
            index_span = (start, len(ids))
        else:
            ids += [pad] * (-len(ids) % block_size)
            start = len(ids)
            if used_style == "compact":  # the header is the chunk's first line, inside its blocks
                ids += _encode(tokenizer, chunk_header(payload + 1), trusted=True)
            ids += _encode(tokenizer, chunks[payload], trusted=False)
            ids += [pad] * (-len(ids) % block_size)
            spans.append((start, len(ids)))
    return PromptLayout(
        tuple(ids),
        block_size,
        tuple(spans),
        thinking,
        used_style,
        tuple(chunks),
        protocol_version,
        index_span,
        entries,
    )


def _split_context(context, chunk_tokens, tokenizer) -> list[str]:
    def count(pieces: list[str]) -> list[int]:
        enc = tokenizer(pieces, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return [len(x) for x in enc]

    if isinstance(context, str):
        return split_text(context, chunk_tokens, count)
    chunks = []
    for i, doc in enumerate(context):
        if not isinstance(doc, str):
            raise LayoutError(f"context document {i} must be a str, got {type(doc).__name__}")
        if not doc.strip():
            raise LayoutError(f"context document {i} is empty; drop it or give it text")
        chunks += split_text(doc, chunk_tokens, count)
    return chunks


def _sentinel(kind: str, index: int) -> str:
    return f"\ue000{kind}{index}\ue001"


def _render_tool_dialogue(
    tokenizer, system, n_chunks, thinking, repeat_question, index=False
) -> tuple[str | None, str]:
    if getattr(tokenizer, "chat_template", None) is None:
        return None, "no chat template"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": _sentinel("Q", 0)}]
    for i in range(1, n_chunks + 1):
        call = {"type": "function", "function": {"name": "get_magic_chunk", "arguments": {"chunk_id": i}}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{i}", **call}]})
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{i}",
                "name": "get_magic_chunk",
                "content": chunk_header(i) + _sentinel("C", i - 1),
            }
        )
    if repeat_question or index:  # the index opens the last user turn, before the repeated question
        content = (_sentinel("I", 0) if index else "") + (
            f"Question: {_sentinel('Q', 1)}" if repeat_question else ""
        )
        messages.append({"role": "user", "content": content})
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=[GET_MAGIC_CHUNK_TOOL],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=thinking,
        )
    except Exception as err:  # templates raise arbitrary errors on roles they do not know
        return None, f"{type(err).__name__}: {err}"
    found = [(m.group(1), int(m.group(2))) for m in _SENTINEL.finditer(text)]
    expected = [
        ("Q", 0),
        *[("C", i) for i in range(n_chunks)],
        *([("I", 0)] if index else []),
        *([("Q", 1)] if repeat_question else []),
    ]
    if found != expected:
        return None, "the template dropped or reordered tool messages"
    return text, ""


def _render_plain(
    tokenizer, system, n_chunks, repeat_question, compact: bool = False, index: bool = False
) -> str:
    bos = tokenizer.bos_token if _adds_bos(tokenizer) else ""
    parts = [f"{bos}{system + chr(10) * 2 if system else ''}Question: {_sentinel('Q', 0)}\n\n"]
    for i in range(1, n_chunks + 1):
        # compact: the header goes inside the chunk's span (build_prompt), and nothing comes between two
        # chunks, so no block holds only scaffold between them
        parts.append(
            _sentinel("C", i - 1)
            if compact
            else f"[get_magic_chunk({i})]\n{chunk_header(i)}{_sentinel('C', i - 1)}\n\n"
        )
    if index:
        parts.append(_sentinel("I", 0))
    if repeat_question:
        parts.append(f"Question: {_sentinel('Q', 1)}\n")
    parts.append("Response:\n")
    return "".join(parts)


def _adds_bos(tokenizer) -> bool:
    bos = getattr(tokenizer, "bos_token_id", None)
    return bos is not None and tokenizer("a")["input_ids"][:1] == [bos]


def _pieces(rendered: str, n_chunks: int):
    """Yield ("template", text) / ("question", None) / ("chunk", index) / ("index", None) in prompt order."""
    cursor = 0
    kinds = {"Q": "question", "I": "index"}
    for m in _SENTINEL.finditer(rendered):
        if m.start() > cursor:
            yield "template", rendered[cursor : m.start()]
        kind = m.group(1)
        yield (kinds[kind], None) if kind in kinds else ("chunk", int(m.group(2)))
        cursor = m.end()
    if cursor < len(rendered):
        yield "template", rendered[cursor:]


def _encode(tokenizer, text: str, trusted: bool) -> list[int]:
    return tokenizer(text, add_special_tokens=False, split_special_tokens=not trusted)["input_ids"]


def _pad_token(tokenizer) -> int:
    for text in ("\n", " "):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            return ids[0]
    raise LayoutError(
        "no single-token newline or space in this tokenizer; pass pad_token_id= to build_prompt"
    )

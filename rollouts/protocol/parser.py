"""The Declarative Attention tag parser: one streaming state machine for text pieces and token ids.

The model writes its attention plan into its own output:

    <global>I need the founding year, Magic Chunk 2 has the history.</global>
    <focus magic_chunks="2">Acme Corp was founded in 2003.</focus>
    <local>2011 - 2003 = 8 years.</local>
    <answer>8 years</answer>

Rules (docs/protocol.md repeats them; tests pin each one):

- Modes: ``global`` (every chunk visible, and the index if the prompt has one), ``focus`` (only the
  listed chunks), ``local`` (no chunk), ``index`` (version 3: the prompt's index region, no chunk).
  Decoding starts in ``global`` (version 5: in the resting mode). Scaffold and generated tokens are
  visible in every mode.
- ``<focus magic_chunks="LIST">``: LIST holds 1-based chunk ids separated by commas and/or spaces, in
  double or single quotes. Ids outside ``1..num_chunks`` (or not integers) are dropped with a violation;
  if none remains, or the attribute is missing or empty, the mode becomes ``local`` with a violation.
- ``<local>`` -> local, ``<global>`` -> global, ``<index>`` -> index; every closing tag (``</focus>``,
  ``</local>``, ``</global>``, ``</index>``) returns to the *resting* mode: ``index`` in a prompt with an
  index (``has_index``), so navigating between reads costs the index, not the context; without an index
  ``local`` from version 4 on, so every read of the context is declared, and ``global`` before it.
  Opening a mode tag while another is open switches mode (violation ``nested_mode``); a closing tag
  with nothing open is a violation (``unmatched_close``), one that closes a different tag too
  (``mismatched_close``); both still return to the resting mode. ``<index>`` in a prompt without an
  index is a ``no_index`` violation (the mode shows no chunk, like ``local``).
- A mode changes exactly when the ``>`` that completes its tag is read. A token is *predicted* under
  the mode in force after every earlier token, so the tag's own text belongs to the old mode and the
  text right after ``>`` to the new one (docs/ARCHITECTURE.md, contract 3: tag timing).
- ``<answer>...</answer>`` changes no mode; the answer is its stripped text, without tag text inside
  it. Missing answer, a second answer (the first counts), text after ``</answer>``, an answer or a
  mode tag still open at the end: each is a violation.
- In thinking mode ``<think>``/``</think>`` are read and change nothing; DA tags inside and outside
  them are parsed alike.
- Anything else that looks like ``<...>`` is plain text (``x < 3 and y > 2``, ``<focused>``); so is a
  ``<focus`` tag longer than ``MAX_TAG_CHARS``.
- Version 2 (``version=1`` reads as before): text that starts a DA tag -- ``<`` or
  ``</`` and a complete tag name (``global``, ``local``, ``focus``, ``answer``) followed by a character
  that cannot continue a name (not a letter, digit, ``_`` or ``-``), or by the end of the text -- but
  does not complete a tag is a ``malformed_tag`` violation: ``</focus junk``, ``<global junk>``,
  ``<answer junk``, ``<focus magic_chunks="3"`` without ``>`` within ``MAX_TAG_CHARS``. Its text stays
  text and the mode does not change. ``<focused>`` and ``<answers>`` are other names: plain text.
- Version 3 (``PROTOCOL_VERSION``) adds ``<index>``/``</index>`` (and ``index`` as a tag name for
  ``malformed_tag``); before it they are plain text, and a prompt with an index needs version 3.
- Version 4 changes only the resting mode of a prompt without an index: ``local`` instead of ``global``
  (decoding still starts in ``global``), so the moves between reads and the answer read no chunk.
- Version 5 also *starts* decoding in the resting mode (``local``, or ``index`` in a prompt with an
  index), so a completion reads no chunk before it opens ``<global>`` or ``<focus>``: a focus tag
  written first chooses its chunk without having seen any. The first token is still predicted by the
  prompt's last row, which like every prompt row sees the whole prompt (masks.visibility).
- The parser never raises on model output (docs/ARCHITECTURE.md, contract 5).

Because every decision depends only on the characters read so far, the mode after any prefix does
not depend on how the text was split into pieces; the hypothesis tests check exactly that.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from .instructions import PROTOCOL_VERSION, PROTOCOL_VERSIONS
from .modes import MODES, OTHER_TAG_NAMES, generation, mode_names, mode_table

MAX_TAG_CHARS = 256  # a `<focus ...>` candidate longer than this is plain text (bounds buffering)

GLOBAL, FOCUS, LOCAL, INDEX = MODES  # every mode (modes.py: the table the views iterate)


class ModeState(NamedTuple):
    """What the model may read: a mode and, for focus, the sorted chunk ids."""

    mode: str
    chunks: tuple[int, ...] = ()


GLOBAL_STATE = ModeState(GLOBAL)
LOCAL_STATE = ModeState(LOCAL)
INDEX_STATE = ModeState(INDEX)


def resting_state(has_index: bool, version: int = PROTOCOL_VERSION) -> ModeState:
    """The state a closing tag returns to: ``index`` in a prompt with an index (version 3 on); without
    one, ``local`` from version 4 on (every read of the context is declared) and ``global`` before.

    >>> [resting_state(False, v).mode for v in (3, 4)], resting_state(True, 4).mode
    (['global', 'local'], 'index')
    """
    if has_index:
        return INDEX_STATE
    return LOCAL_STATE if version >= 4 else GLOBAL_STATE


def starting_state(has_index: bool, version: int = PROTOCOL_VERSION) -> ModeState:
    """The state decoding starts in: the resting state from version 5 on, ``global`` before.

    >>> [starting_state(False, v).mode for v in (4, 5)], starting_state(True, 5).mode
    (['global', 'local'], 'index')
    """
    return resting_state(has_index, version) if version >= 5 else GLOBAL_STATE


class Violation(NamedTuple):
    """A protocol violation: its kind and the character offset in the completion where it occurred."""

    kind: str
    position: int


# Every violation kind the parser records (rewards count them by kind).
VIOLATION_KINDS = (
    "unknown_chunk",  # focus id outside 1..num_chunks, dropped
    "malformed_chunk_id",  # focus list item that is not an integer, dropped
    "empty_focus",  # no valid id left (or attribute missing): mode becomes local
    "nested_mode",  # a mode tag opened while another one was open
    "unmatched_close",  # a closing tag with nothing open
    "mismatched_close",  # a closing tag for a different tag than the open one
    "unclosed_mode",  # a mode tag still open at the end
    "missing_answer",
    "multiple_answers",  # a second <answer>; the first counts
    "nested_answer",  # <answer> inside an open answer
    "unclosed_answer",  # <answer> without </answer>; the text to the end is the answer
    "tag_in_answer",  # a mode tag inside the answer
    "text_after_answer",  # non-whitespace text after </answer>
    "malformed_tag",  # (v2) a DA tag name opened but no tag completed: `</focus junk`; read as text
    "no_index",  # (v3) <index> in a prompt laid out without an index: the mode shows no chunk
)

_ANSWER_TAGS = ("<answer>", "</answer>")
_THINK_TAGS = ("<think>", "</think>")
_FOCUS_HEAD = "<focus"
# The protocol's markup as a tokenizer can add it, one token each (data/tokenizer.py ``protocol_tokens``):
# every whole tag some version reads except a focus tag, which is its opening, the chunk ids and ``">``.
# The order fixes the tokens' ids in a tokenizer built from it: append, never reorder.
PROTOCOL_TAG_TOKENS = (
    *(f"<{mode}>" for mode in (GLOBAL, LOCAL, INDEX, "answer")),
    *(f"</{mode}>" for mode in (GLOBAL, LOCAL, INDEX, "answer", FOCUS)),
    '<focus magic_chunks="',
)
_CHUNKS_ATTR = re.compile(r"""magic_chunks\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_ID_SEPARATORS = re.compile(r"[,\s]+")


def tag_names() -> tuple[str, ...]:
    """Every tag name some version reads: the modes (registered ones included), answer, think
    (documents are neutralized against all of them: contract 6).

    >>> tag_names()
    ('global', 'focus', 'local', 'index', 'answer', 'think')
    """
    return (*mode_names(), *OTHER_TAG_NAMES)


def _prefixes(words) -> frozenset[str]:
    return frozenset(w[:i] for w in words for i in range(1, len(w) + 1))


class _TagTable(NamedTuple):
    """The tags one (thinking, version) reads, from the mode table (modes.py)."""

    opens: dict[str, str]  # "<global>" -> "global": every mode but focus, whose tag has attributes
    closes: dict[str, str]  # "</focus>" -> "focus"
    exact: frozenset[str]  # every whole tag
    prefixes: frozenset[str]  # every prefix of a tag, "<focus" included
    heads: frozenset[str]  # v2: a failed candidate beginning with one of these is malformed


def _tag_table(thinking: bool, version: int) -> _TagTable:
    return _tag_table_of(bool(thinking), version, generation())


@functools.cache
def _tag_table_of(thinking: bool, version: int, _generation: int) -> _TagTable:
    modes = [m.name for m in mode_table() if version >= m.since_version]
    opens = {f"<{m}>": m for m in modes if m != FOCUS}
    closes = {f"</{m}>": m for m in modes}
    plain = {*opens, *closes, *_ANSWER_TAGS}
    exact = frozenset(plain | set(_THINK_TAGS if thinking else ()))
    heads = frozenset({*(t[:-1] for t in plain), _FOCUS_HEAD})
    return _TagTable(opens, closes, exact, _prefixes([*exact, _FOCUS_HEAD]), heads)


def _names_a_tag(candidate: str, version: int = PROTOCOL_VERSION) -> bool:
    """Does ``candidate`` (text from a ``<``) begin with a complete DA tag name, i.e. ``<`` or ``</``,
    a tag name, then a character that cannot continue a name or nothing?

    >>> [_names_a_tag(t) for t in ("</focus junk", "<answer", "<focused>", "<glob x", "x < 3", "<index x")]
    [True, True, False, False, False, True]
    """
    start = end = 2 if candidate.startswith("</") else 1
    while end < len(candidate) and (candidate[end].isalnum() or candidate[end] in "_-"):
        end += 1
    return end > start and candidate[:end] in _tag_table(False, version).heads


@dataclass(frozen=True)
class Segment:
    """A span of completion characters ``[start, end)`` predicted under one mode."""

    mode: str
    chunks: tuple[int, ...]
    start: int
    end: int

    @property
    def state(self) -> ModeState:
        return ModeState(self.mode, self.chunks)


@dataclass
class ParsedCompletion:
    """The result of parsing one completion."""

    segments: list[Segment]
    answer: str | None
    violations: list[Violation]
    text: str = ""
    mode_tag_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each mode tag

    def without_mode_tags(self) -> str:
        """``text`` with every mode tag (``<global>``, ``<focus ...>``, ``</focus>``, ...) cut out: what
        the completion says without the protocol (its answer tags kept).

        >>> parse_completion('<global>plan</global><answer>8</answer>', 1).without_mode_tags()
        'plan<answer>8</answer>'
        """
        kept, cursor = [], 0
        for start, end in self.mode_tag_spans:
            kept.append(self.text[cursor:start])
            cursor = end
        kept.append(self.text[cursor:])
        return "".join(kept)

    @property
    def focused_chunks(self) -> tuple[int, ...]:
        """Every chunk id that some focus segment made visible, sorted."""
        return tuple(sorted({c for s in self.segments for c in s.chunks}))


@dataclass
class ProtocolParser:
    """Incremental DA parser over text pieces.

    ``feed(piece)`` returns the mode state in force after the piece, i.e. the state under which the
    *next* token is predicted. ``transitions`` records ``(offset, state)`` at every change, so the
    engine pays nothing for segment bookkeeping it does not read. ``version`` is the protocol version
    to read (``PROTOCOL_VERSIONS``); version 1 does not know ``malformed_tag``.
    """

    num_chunks: int
    thinking: bool = False
    version: int = PROTOCOL_VERSION
    has_index: bool = False  # the prompt has an index region (version 3): closing tags return to index
    state: ModeState = field(init=False)  # starting_state(), set in __post_init__
    violations: list[Violation] = field(default_factory=list, init=False)
    transitions: list[tuple[int, ModeState]] = field(init=False)  # [(0, state)] to begin with

    def __post_init__(self):
        if self.num_chunks < 0:
            raise ValueError(f"num_chunks must be >= 0, got {self.num_chunks}")
        if type(self.version) is not int or self.version not in PROTOCOL_VERSIONS:
            raise ValueError(f"protocol version must be one of {PROTOCOL_VERSIONS}, got {self.version!r}")
        if self.has_index and self.version < 3:
            raise ValueError(f"an index needs protocol version 3 or later, got version {self.version}")
        self._tags = _tag_table(self.thinking, self.version)
        self._exact, self._tag_prefixes = self._tags.exact, self._tags.prefixes
        self._rest = resting_state(self.has_index, self.version)
        self.state = starting_state(self.has_index, self.version)
        self.transitions = [(0, self.state)]
        self._consumed = 0  # characters fully read (as text or as a completed tag)
        self._pending = ""  # a candidate tag that is not complete yet, starting with "<"
        self._open_mode: str | None = None
        self._in_answer = False
        self._answer_parts: list[str] | None = None  # collects the first answer's text
        self._answers_seen = 0
        self._after_answer_flagged = False
        self.answer: str | None = None
        self._focus_cache: dict[str, tuple[ModeState, list[str]]] = {}
        self.mode_tag_spans: list[tuple[int, int]] = []  # character spans of the mode tags read so far

    # -- input -------------------------------------------------------------------------------------

    def feed(self, piece: str) -> ModeState:
        """Read one piece of generated text; return the state the next token is predicted under."""
        i, n = 0, len(piece)
        while i < n:
            if not self._pending:
                j = piece.find("<", i)
                if j < 0:
                    self._text(piece[i:])
                    break
                if j > i:
                    self._text(piece[i:j])
                self._pending = "<"
                i = j + 1
            else:
                # Extend the candidate tag one character at a time: tags are short and rare.
                self._extend(piece[i])
                i += 1
        return self.state

    def finish(self) -> ParsedCompletion:
        """End of the completion: flush, record end-of-stream violations, return the result."""
        if self._pending:
            pending, self._pending = self._pending, ""
            self._not_a_tag(pending)
        end = self._consumed
        if self._open_mode is not None:
            self._violation("unclosed_mode", end)
        if self._in_answer:
            self._violation("unclosed_answer", end)
            self._close_answer()
        elif self._answers_seen == 0:
            self._violation("missing_answer", end)
        return ParsedCompletion(
            self.segments(end), self.answer, list(self.violations), mode_tag_spans=list(self.mode_tag_spans)
        )

    def segments(self, end: int | None = None) -> list[Segment]:
        """Segments ``[start, end)`` by the state their characters were predicted under."""
        end = self._consumed if end is None else end
        bounds = [*self.transitions, (end, None)]
        return [
            Segment(state.mode, state.chunks, start, stop)
            for (start, state), (stop, _) in itertools.pairwise(bounds)
            if stop > start
        ]

    # -- the machine -------------------------------------------------------------------------------

    def _extend(self, ch: str) -> None:
        pending = self._pending + ch
        if pending in self._exact:
            self._pending = ""
            self._tag(pending)
        elif pending in self._tag_prefixes:
            self._pending = pending
        elif pending.startswith(_FOCUS_HEAD) and self._focus_candidate(pending):
            if ch == ">":
                self._pending = ""
                self._tag(pending)
            else:
                self._pending = pending
        else:
            # Not a tag. The old candidate held one "<" (at its start), so only `ch` can open a new one.
            self._pending = ""
            if ch == "<":
                self._not_a_tag(pending[:-1], pending)
                self._pending = "<"
            else:
                self._not_a_tag(pending)

    def _not_a_tag(self, text: str, candidate: str | None = None) -> None:
        """A candidate that failed (``candidate``, by default ``text``) is read as ``text``; from version
        2 on it is a ``malformed_tag`` when it began with a complete DA tag name."""
        if self.version >= 2 and _names_a_tag(text if candidate is None else candidate, self.version):
            self._violation("malformed_tag", self._consumed)
        self._text(text)

    @staticmethod
    def _focus_candidate(pending: str) -> bool:
        """Can ``pending`` (which starts with ``<focus``) still become or be a focus tag?"""
        if len(pending) > MAX_TAG_CHARS:
            return False
        sep = pending[len(_FOCUS_HEAD)]
        if sep != ">" and not sep.isspace():
            return False  # <focused> is text
        return "<" not in pending[1:]

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._in_answer:
            if self._answer_parts is not None:
                self._answer_parts.append(text)
        elif self._answers_seen and not self._after_answer_flagged and not text.isspace():
            self._after_answer_flagged = True
            self._violation("text_after_answer", self._consumed + (len(text) - len(text.lstrip())))
        self._consumed += len(text)

    def _tag(self, tag: str) -> None:
        start = self._consumed
        self._consumed += len(tag)
        opens, closes = self._tags.opens, self._tags.closes
        if tag in opens or tag.startswith(_FOCUS_HEAD) or tag in closes:
            self.mode_tag_spans.append((start, self._consumed))
        if tag in opens or tag.startswith(_FOCUS_HEAD):
            if self._open_mode is not None:
                self._violation("nested_mode", start)
            if self._in_answer:
                self._violation("tag_in_answer", start)
            if tag in opens:
                self._open_mode = opens[tag]
                if self._open_mode == INDEX and not self.has_index:
                    self._violation("no_index", start)
                self._set_state(ModeState(self._open_mode))
            else:
                self._open_mode = FOCUS
                self._set_state(self._focus_state(tag, start))
        elif tag in closes:
            if self._in_answer:
                self._violation("tag_in_answer", start)
            if self._open_mode is None:
                self._violation("unmatched_close", start)
            elif self._open_mode != closes[tag]:
                self._violation("mismatched_close", start)
            self._open_mode = None
            self._set_state(self._rest)
        elif tag == "<answer>":
            if self._in_answer:
                self._violation("nested_answer", start)
            else:
                if self._answers_seen:
                    self._violation("multiple_answers", start)
                self._in_answer = True
                self._answer_parts = [] if self._answers_seen == 0 else None
        elif tag == "</answer>":
            if not self._in_answer:
                self._violation("unmatched_close", start)
            else:
                self._close_answer()
        # <think> and </think> (thinking mode): read, and change nothing.

    def _close_answer(self) -> None:
        self._in_answer = False
        if self._answer_parts is not None:
            self.answer = "".join(self._answer_parts).strip()
            self._answer_parts = None
        self._answers_seen += 1

    def _focus_state(self, tag: str, start: int) -> ModeState:
        # The same tag text always yields the same state and violations: cache it (the engine
        # sees one focus tag per request step at most, but GRPO groups repeat the same plans).
        cached = self._focus_cache.get(tag)
        if cached is None:
            cached = self._focus_cache[tag] = self._read_focus(tag)
        state, kinds = cached
        for kind in kinds:
            self._violation(kind, start)
        return state

    def _read_focus(self, tag: str) -> tuple[ModeState, list[str]]:
        kinds: list[str] = []
        match = _CHUNKS_ATTR.search(tag)
        raw = (match.group(1) if match.group(1) is not None else match.group(2)) if match else ""
        ids: set[int] = set()
        for item in filter(None, _ID_SEPARATORS.split(raw)):
            if not (item.isascii() and item.isdigit()):
                kinds.append("malformed_chunk_id")
            elif 1 <= int(item) <= self.num_chunks:
                ids.add(int(item))
            else:
                kinds.append("unknown_chunk")
        if not ids:
            kinds.append("empty_focus")
            return LOCAL_STATE, kinds
        return ModeState(FOCUS, tuple(sorted(ids))), kinds

    def _set_state(self, state: ModeState) -> None:
        if state != self.state:
            self.state = state
            self.transitions.append((self._consumed, state))

    def _violation(self, kind: str, position: int) -> None:
        self.violations.append(Violation(kind, position))


def parse_completion(
    text: str,
    num_chunks: int,
    thinking: bool = False,
    version: int = PROTOCOL_VERSION,
    has_index: bool = False,
) -> ParsedCompletion:
    """Parse a whole completion (``version``: the protocol version to read it with; ``has_index``:
    the prompt has an index region).

    >>> p = parse_completion('<focus magic_chunks="2">x</focus><answer>8</answer>', num_chunks=7)
    >>> [(s.mode, s.chunks) for s in p.segments], p.answer, p.violations
    ([('global', ()), ('focus', (2,)), ('global', ())], '8', [])
    >>> parse_completion('<focus magic_chunks="2">x</focus junk<answer>8</answer>', 7).violations
    [Violation(kind='malformed_tag', position=25), Violation(kind='unclosed_mode', position=55)]
    >>> parse_completion('<focus magic_chunks="2">x</focus junk<answer>8</answer>', 7, version=1).violations
    [Violation(kind='unclosed_mode', position=55)]
    >>> p = parse_completion('<index>3</index><focus magic_chunks="3">x</focus><answer>8</answer>', 7, has_index=True)
    >>> [s.mode for s in p.segments], p.violations
    (['global', 'index', 'focus', 'index'], [])
    >>> p = parse_completion('<global>3</global><focus magic_chunks="3">x</focus><answer>8</answer>', 7, version=4)
    >>> [s.mode for s in p.segments], p.violations
    (['global', 'local', 'focus', 'local'], [])
    >>> p = parse_completion('<global>3</global><focus magic_chunks="3">x</focus><answer>8</answer>', 7, version=5)
    >>> [s.mode for s in p.segments], p.violations
    (['local', 'global', 'local', 'focus', 'local'], [])
    """
    parser = ProtocolParser(num_chunks, thinking=thinking, version=version, has_index=has_index)
    parser.feed(text)
    result = parser.finish()
    result.text = text
    return result

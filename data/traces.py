"""Gold DA traces for the supervised warm start: plan in global, read in focus, combine in local, answer.

A task describes *what* a correct reading does as a ``TracePlan`` (which chunks to read and what to
copy from them, how to combine, the answer); this module writes it as protocol text, drawing the
wording from small phrase pools so a model learns the protocol rather than one sentence. Two forms:

    non-thinking:  <global>plan</global>
                   <focus magic_chunks="3">copied needle</focus>
                   <local>combination</local>
                   <answer>...</answer>
    thinking:      <think>
                   ...the same modes, worded more deliberately...
                   </think>
                   <answer>...</answer>

Two styles (``TRACE_STYLES``, the data config's ``trace_style``): ``verbose`` (above: a sentence of plan,
the needle copied whole, the default for real models) and ``terse``, for a model trained from scratch
that must learn to copy within minutes: the plan only names the chunks, each focus copies the read's
value-bearing span (``Read.value``: the magic number, not the sentence around it) and the answer repeats
it, each value written after a space as it stands in the document, so that it is the same token in the
document, the focus and the answer::

    <global>Chunk 5.</global>
    <focus magic_chunks="5"> 63</focus>
    <answer> 63</answer>

Two navigations (``NAVIGATIONS``, the data config's ``trace_navigation``): ``global`` plans in
``<global>`` (above), ``index`` plans in ``<index>`` (protocol v3: the prompt's index of the chunks, not
the chunks themselves), for prompts laid out with an index. Aggregation still surveys in ``<global>``:
counting needs every chunk, which no index summarizes::

    <index>Chunk 5.</index>
    <focus magic_chunks="5"> 63</focus>
    <answer> 63</answer>

Seven strategies (``STRATEGIES``, the data config's ``trace_strategies``: a weight each, one drawn per
example) for one-hop reads, each what a real reader does, and each reading a different amount of the
context (under protocol v4, where closing tags rest in ``local``, the answer reads no chunk)::

    plan        <global>Chunk 5.</global>                 names the chunk before reading: commit to
                <focus magic_chunks="5"> 63</focus>       where, then read (the form above)
    direct      <focus magic_chunks="5"> 63</focus>       the focus tag itself, written while decoding
                                                          still sees every chunk, names the chunk
    sentence    <global>The answer is in Chunk 5.</global> the plan as a chat model words it: what it
                <focus magic_chunks="5"> 63</focus>       looks for, then where
    candidates  <global>Chunks 2, 5 and 6.</global>       keys look alike (near-miss distractors): list
                <focus magic_chunks="5"> 63</focus>       every chunk holding a candidate needle first
    wide        <focus magic_chunks="2,5,6"> 63</focus>   focus every candidate chunk at once and match
                                                          the key inside them: choosing among look-alikes
                                                          becomes recall of a key's value in a few chunks,
                                                          not naming one chunk from the whole context
    keyed       <focus magic_chunks="2,5,6"> silver-owl   ``wide``, and the focus first writes the asked
                is: 63</focus>                            key, then the needle's words on to the value: the
                                                          value then follows the key it belongs to, as in
                                                          the base's recall tables, not a tag far from it
    global      <global>Chunk 5: 63.</global>             reads the value in global, declaring no focus:
                                                          how a model reads before it learns to focus

Under protocol v5, where decoding starts with no chunk in view, ``direct`` would choose its chunk
blind: a run on v5 refuses it (``RunConfig.validate``). Only the terse style draws strategies; surveys and
minimal traces keep their one form, chained reads too except under ``keyed``, which focuses the first hop
at once (the asked key of a two-hop question has no look-alike) and copies the key it links to, then
lists in global every chunk that may hold the next hop (``TracePlan.candidates``: the linked key's needle
and its look-alikes) and focuses them all, writing the linked key through its value::

    <focus magic_chunks=" 2"> early-onion</focus>
    <global>Chunks 4, 7 and 9.</global>
    <focus magic_chunks=" 4 7 9"> early-onion is: 90</focus>
    <answer> 90</answer>

A plan without look-alike needles writes ``candidates`` as ``plan`` and ``wide`` as ``direct`` (``keyed``
as ``direct`` that writes the key).

Plans never copy the question's key (a tiny model trained from scratch could not learn to copy a rare
key into ``<global>``); they name the chunks. Only ``keyed`` writes the key, inside its focus, for a model
pretrained to bind look-alike keys (models/heed-tiny-base). Reads that depend on each other (a variable chain) are
*chained*: the model returns to global between them to find the next hop. Independent reads are
written either as one focus over all their chunks or as back-to-back focuses. Aggregation tasks,
whose evidence is everywhere, are written as a global survey with no focus at all, and plain
sequence tasks (Variable Assignment) as just the answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .phrasings import restated

_OPENERS = (
    "I need {need}.",
    "The question asks for {need}.",
    "To answer, I have to find {need}.",
    "What matters here is {need}.",
    "First I locate {need}.",
)
_WHERE_ONE = (
    "Magic Chunk {c} has it.",
    "It is in Magic Chunk {c}.",
    "Magic Chunk {c} should state it.",
    "The relevant text is in Magic Chunk {c}.",
)
_WHERE_MANY = (
    "Magic Chunks {cs} hold what I need.",
    "The facts are in Magic Chunks {cs}.",
    "I will read Magic Chunks {cs}.",
    "Magic Chunks {cs} are the ones to read.",
)
_CHAIN_START = (
    "The chain starts in Magic Chunk {c}.",
    "The first link is in Magic Chunk {c}.",
    "It begins in Magic Chunk {c}.",
)
_NEXT = (
    "Next, Magic Chunk {c}.",
    "The next step is in Magic Chunk {c}.",
    "Now Magic Chunk {c}.",
    "It continues in Magic Chunk {c}.",
)
_SURVEY = (
    "This needs every Magic Chunk, so I stay in global.",
    "The answer depends on the whole context; no single chunk is enough.",
    "Counting needs all of the chunks at once.",
)
_COMBINE = ("", "Combining: ", "Putting it together: ", "From the copied facts: ")
_THINK_PLAN = ("Let me plan where to look. ", "Okay. ", "Let me see which chunks matter. ", "")
_THINK_CHECK = ("Let me check: ", "Working it out: ", "", "Now I combine what I copied. ")


TRACE_STYLES = ("verbose", "terse")
# terse one-hop reads (the module docstring)
STRATEGIES = ("plan", "direct", "sentence", "candidates", "wide", "keyed", "global")
# the strategies whose focus tag comes first, written before any chunk is read (refused under protocol v5)
FOCUS_FIRST = ("direct", "wide", "keyed")
# How a terse focus tag writes its chunk ids: "digits" (magic_chunks="5") or "header" (magic_chunks=" 5",
# each id after a space, as it stands in the chunk's "Magic Chunk 5:" header and in the plan's "Chunk 5.",
# so it is the same token there, the rule the values follow). The parser reads both alike.
CHUNK_ID_FORMS = ("digits", "header")
NAVIGATIONS = ("global", "index", "mixed")  # mixed: each example draws global or index (data/tasks/base.py)


@dataclass(frozen=True)
class Read:
    """One extraction: focus on ``chunks`` (1-based) and copy ``quote`` from them (``value``: the part of
    the quote that carries the answer, what a terse trace copies; default the whole quote)."""

    chunks: tuple[int, ...]
    quote: str
    value: str = ""
    key: str = ""  # the asked key the quote states ("" for none): what a ``keyed`` focus writes first

    @property
    def span(self) -> str:
        return self.value or self.quote

    @property
    def keyed(self) -> str:
        """The quote from its key through its value (the ``keyed`` strategy's focus), else :attr:`span`.

        >>> Read((5,), "One of the special magic numbers for silver-owl is: 63.", "63", "silver-owl").keyed
        'silver-owl is: 63'
        """
        return restated(self.quote, self.key, self.value) or self.span


@dataclass(frozen=True)
class TracePlan:
    """What a correct reading of one example does, independent of wording."""

    answer: str  # the text inside <answer>
    need: str = ""  # what to look for, as a noun phrase ("the special magic number")
    reads: tuple[Read, ...] = ()
    combine: str = ""  # the <local> computation; "" for none
    chained: bool = False  # each read needs the previous one: navigate in global between reads
    survey: str = ""  # aggregation: work done in global over all chunks instead of reads
    minimal: bool = False  # plain sequence task: only the answer (and the combine line when thinking)
    candidates: tuple[int, ...] = ()  # chunks holding look-alike needles, evidence included ("candidates")


def _chunk_list(chunks) -> str:
    chunks = list(chunks)
    return ", ".join(map(str, chunks[:-1])) + f" and {chunks[-1]}" if len(chunks) > 1 else str(chunks[0])


def _focus(read: Read) -> str:
    return f'<focus magic_chunks="{",".join(map(str, read.chunks))}">{read.quote}</focus>'


def render_trace(
    plan: TracePlan,
    rng: random.Random,
    thinking: bool,
    style: str = "verbose",
    navigation: str = "global",
    strategy: str = "plan",
    chunk_ids: str = "digits",
) -> str:
    """One gold completion for ``plan`` in ``style``, planning in the ``navigation`` mode with
    ``strategy``, focus tags writing ``chunk_ids`` (both terse only); the wording is drawn from ``rng``."""
    if style not in TRACE_STYLES:
        raise ValueError(f"trace style must be one of {TRACE_STYLES}, got {style!r}")
    if navigation not in ("global", "index"):
        raise ValueError(f"trace navigation must be global or index, got {navigation!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"trace strategy must be one of {STRATEGIES}, got {strategy!r}")
    if chunk_ids not in CHUNK_ID_FORMS:
        raise ValueError(f"trace chunk ids must be one of {CHUNK_ID_FORMS}, got {chunk_ids!r}")
    if style == "terse":
        return _render_terse(plan, thinking, navigation, strategy, chunk_ids)
    if strategy != "plan":
        raise ValueError(f"trace strategy {strategy!r} needs the terse style; verbose traces always plan")
    nav = navigation
    answer = f"<answer>{plan.answer}</answer>"
    if plan.minimal:
        return f"<think>\n{plan.combine}\n</think>\n{answer}" if thinking else answer
    lead = rng.choice(_THINK_PLAN) if thinking else ""
    opener = rng.choice(_OPENERS).format(need=plan.need)
    segments = []
    if plan.survey:
        segments.append(f"<global>{lead}{opener} {rng.choice(_SURVEY)} {plan.survey}</global>")
    elif plan.chained:
        where = rng.choice(_CHAIN_START).format(c=_chunk_list(plan.reads[0].chunks))
        segments.append(f"<{nav}>{lead}{opener} {where}</{nav}>")
        for i, read in enumerate(plan.reads):
            if i:
                segments.append(f"<{nav}>{rng.choice(_NEXT).format(c=_chunk_list(read.chunks))}</{nav}>")
            segments.append(_focus(read))
    else:
        chunks = sorted({c for r in plan.reads for c in r.chunks})
        if len(chunks) == 1:
            where = rng.choice(_WHERE_ONE).format(c=chunks[0])
        else:
            where = rng.choice(_WHERE_MANY).format(cs=_chunk_list(chunks))
        segments.append(f"<{nav}>{lead}{opener} {where}</{nav}>")
        if len(plan.reads) > 1 and rng.random() < 0.5:
            segments.append(_focus(Read(tuple(chunks), " ".join(r.quote for r in plan.reads))))
        else:
            segments.extend(_focus(r) for r in plan.reads)
    if plan.combine:
        prefix = rng.choice(_THINK_CHECK) if thinking else rng.choice(_COMBINE)
        segments.append(f"<local>{prefix}{plan.combine}</local>")
    body = "\n".join(segments)
    return f"<think>\n{body}\n</think>\n{answer}" if thinking else f"{body}\n{answer}"


def _render_terse(
    plan: TracePlan, thinking: bool, nav: str, strategy: str = "plan", ids: str = "digits"
) -> str:
    answer = f"<answer> {plan.answer}</answer>"
    if plan.minimal:
        return f"<think>\n{plan.combine}\n</think>\n{answer}" if thinking else answer
    segments = []
    if plan.survey:
        segments.append(f"<global>{plan.survey}</global>")
    elif plan.chained and strategy == "keyed":
        for i, read in enumerate(plan.reads):
            if i:  # back in global to find the next hop: every chunk that may hold it
                read = _widened(read, plan.candidates)
                segments.append(f"<{nav}>{terse_where(read.chunks)}</{nav}>")
            segments.append(_terse_focus(read, ids, keyed=True))
    elif plan.chained:
        for read in plan.reads:
            segments.append(f"<{nav}>{terse_where(read.chunks)}</{nav}>")
            segments.append(_terse_focus(read, ids))
    elif strategy == "global":
        found = "; ".join(f"{terse_where(r.chunks)[:-1]}: {r.span}" for r in plan.reads)
        segments.append(f"<global>{found}.</global>")
    else:
        chunks = sorted({c for r in plan.reads for c in r.chunks})
        look_alikes = len(plan.candidates) > len(chunks)
        if strategy == "candidates" and look_alikes:
            segments.append(f"<{nav}>{terse_where(plan.candidates)}</{nav}>")
        elif strategy == "sentence":
            segments.append(f"<{nav}>The answer is in {terse_where(chunks)}</{nav}>")
        elif strategy not in FOCUS_FIRST:
            segments.append(f"<{nav}>{terse_where(chunks)}</{nav}>")
        if strategy in ("wide", "keyed") and look_alikes:
            reads = [_widened(r, plan.candidates) for r in plan.reads]
        else:
            reads = list(plan.reads)
        segments.extend(_terse_focus(r, ids, keyed=strategy == "keyed") for r in reads)
    if plan.combine:
        segments.append(f"<local>{plan.combine}</local>")
    body = "\n".join(segments)
    return f"<think>\n{body}\n</think>\n{answer}" if thinking else f"{body}\n{answer}"


def _widened(read: Read, candidates) -> Read:
    """``read`` over every candidate chunk too: the look-alikes are matched inside the focus."""
    return replace(read, chunks=tuple(sorted({*candidates, *read.chunks})))


def terse_where(chunks) -> str:
    """The terse plan naming ``chunks``.

    >>> terse_where([5]), terse_where([2, 5, 6])
    ('Chunk 5.', 'Chunks 2, 5 and 6.')
    """
    chunks = list(chunks)
    return f"Chunk{'s' if len(chunks) > 1 else ''} {_chunk_list(chunks)}."


def _terse_focus(read: Read, ids: str = "digits", keyed: bool = False) -> str:
    listed = ",".join(map(str, read.chunks)) if ids == "digits" else "".join(f" {c}" for c in read.chunks)
    return f'<focus magic_chunks="{listed}"> {read.keyed if keyed else read.span}</focus>'


def render_traces(
    plan: TracePlan,
    rng: random.Random,
    style: str = "verbose",
    navigation: str = "global",
    strategy: str = "plan",
    chunk_ids: str = "digits",
) -> tuple[str, str]:
    """(non-thinking, thinking) gold completions in ``style``, ``navigation`` and ``strategy``, worded
    independently."""
    return (
        render_trace(plan, rng, False, style, navigation, strategy, chunk_ids),
        render_trace(plan, rng, True, style, navigation, strategy, chunk_ids),
    )

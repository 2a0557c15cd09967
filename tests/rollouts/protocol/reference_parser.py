"""An independent, non-streaming DA parser written from the rules, used as the tests' oracle.

It finds tags with one left-to-right regex scan over the whole text (no buffering, no pieces) and
applies the rules to the tag list. The streaming parser must agree with it on every input. From
version 2 on, where no tag matches, a DA tag name opened at ``<`` or ``</`` (then no name character)
is matched too: a ``malformed_tag`` whose text stays text.
"""

from __future__ import annotations

import itertools
import re

MAX_TAG = 256  # must equal rollouts.protocol.parser.MAX_TAG_CHARS


def _tag_regex(thinking: bool, version: int) -> re.Pattern:
    exact = ["<global>", "</global>", "<local>", "</local>", "</focus>", "<answer>", "</answer>"]
    if thinking:
        exact += ["<think>", "</think>"]
    if version >= 3:
        exact += ["<index>", "</index>"]
    # <focus> or <focus + whitespace + up to (MAX_TAG - 8) non-angle chars + '>'
    focus = r"<focus(?:>|\s[^<>]{0," + str(MAX_TAG - 8) + r"}>)"
    alternatives = [*map(re.escape, exact), focus]
    if version >= 2:  # tried last: only where no tag matches. A name character is \w or '-'.
        names = "global|local|focus|answer" + ("|index" if version >= 3 else "")
        alternatives.append(r"(?P<malformed></?(?:" + names + r"))(?![\w-])")
    return re.compile("|".join(alternatives))


def reference_parse(text: str, num_chunks: int, thinking: bool = False, version: int = 3, has_index=False):
    """Return (segments as (mode, chunks, start, end), answer, violations as (kind, position)).

    ``has_index``: the prompt has an index, so closing tags return to ``index``; without one they return
    to ``local`` from version 4 on and to ``global`` before. Version 5 starts in that resting mode too.
    """
    rest = ("index", ()) if has_index else ("local", ()) if version >= 4 else ("global", ())
    violations = []
    state = rest if version >= 5 else ("global", ())
    changes = [(0, state)]
    open_mode = None
    in_answer = False
    answer_text = None
    first_answer_parts = None
    answer_count = 0
    flagged_after = False
    cursor = 0

    def text_run(start, end):
        nonlocal flagged_after
        chunk = text[start:end]
        if not chunk:
            return
        if in_answer:
            if first_answer_parts is not None:
                first_answer_parts.append(chunk)
        elif answer_count and not flagged_after and chunk.strip():
            flagged_after = True
            violations.append(("text_after_answer", start + len(chunk) - len(chunk.lstrip())))

    def set_state(new, at):
        nonlocal state
        if new != state:
            state = new
            changes.append((at, new))

    for m in _tag_regex(thinking, version).finditer(text):
        text_run(cursor, m.start())
        tag, start, end = m.group(0), m.start(), m.end()
        cursor = end
        if m.lastgroup == "malformed":
            violations.append(("malformed_tag", start))
            cursor = start  # its text is text: read on with the next run
        elif tag in ("<global>", "<local>", "<index>") or tag.startswith("<focus"):
            if open_mode is not None:
                violations.append(("nested_mode", start))
            if in_answer:
                violations.append(("tag_in_answer", start))
            if tag == "<global>":
                open_mode = "global"
                set_state(("global", ()), end)
            elif tag == "<local>":
                open_mode = "local"
                set_state(("local", ()), end)
            elif tag == "<index>":
                open_mode = "index"
                if not has_index:
                    violations.append(("no_index", start))
                set_state(("index", ()), end)
            else:
                open_mode = "focus"
                attr = re.search(r"""magic_chunks\s*=\s*(?:"([^"]*)"|'([^']*)')""", tag)
                raw = "" if not attr else (attr.group(1) if attr.group(1) is not None else attr.group(2))
                ids = set()
                for item in re.split(r"[,\s]+", raw):
                    if not item:
                        continue
                    if not re.fullmatch(r"[0-9]+", item):
                        violations.append(("malformed_chunk_id", start))
                    elif 1 <= int(item) <= num_chunks:
                        ids.add(int(item))
                    else:
                        violations.append(("unknown_chunk", start))
                if ids:
                    set_state(("focus", tuple(sorted(ids))), end)
                else:
                    violations.append(("empty_focus", start))
                    set_state(("local", ()), end)
        elif tag in ("</global>", "</local>", "</focus>", "</index>"):
            if in_answer:
                violations.append(("tag_in_answer", start))
            if open_mode is None:
                violations.append(("unmatched_close", start))
            elif open_mode != tag[2:-1]:
                violations.append(("mismatched_close", start))
            open_mode = None
            set_state(rest, end)
        elif tag == "<answer>":
            if in_answer:
                violations.append(("nested_answer", start))
            else:
                if answer_count:
                    violations.append(("multiple_answers", start))
                in_answer = True
                first_answer_parts = [] if answer_count == 0 else None
        elif tag == "</answer>":
            if not in_answer:
                violations.append(("unmatched_close", start))
            else:
                in_answer = False
                if first_answer_parts is not None:
                    answer_text = "".join(first_answer_parts).strip()
                    first_answer_parts = None
                answer_count += 1
    text_run(cursor, len(text))
    end = len(text)
    if open_mode is not None:
        violations.append(("unclosed_mode", end))
    if in_answer:
        violations.append(("unclosed_answer", end))
        if first_answer_parts is not None:
            answer_text = "".join(first_answer_parts).strip()
    elif answer_count == 0:
        violations.append(("missing_answer", end))
    bounds = [*changes, (end, None)]
    segments = [(s[0], s[1], a, b) for (a, s), (b, _) in itertools.pairwise(bounds) if b > a]
    return segments, answer_text, violations

"""Protocol compliance and evidence coverage, read from the parser's result.

**Compliance** is 1 when the completion follows the DA protocol and 0 otherwise. It follows it when

1. the parser recorded no violation (``ParsedCompletion.violations``: malformed or unknown chunk ids,
   nested or unclosed modes, malformed tags such as ``</focus junk`` (protocol v2), tags inside the
   answer, text after it, ...);
2. it narrowed its attention at least once when the example names evidence chunks: some ``focus``
   segment lists fewer than all the chunks. A focus on every chunk is ``global`` under another name
   (it reads exactly what ``global`` reads), so it neither counts as a focus nor covers evidence;
   otherwise ``<focus magic_chunks="1,2,...,N">`` would buy compliance and full coverage for free;
3. it answered exactly once, i.e. neither ``missing_answer`` nor ``multiple_answers`` / ``nested_answer``
   was recorded (part of 1; listed because it is the rule a policy most often breaks).

All-or-nothing on purpose: partial credit per violation kind would pay a policy for trading one
violation for another. Each failure is reported as a reason: the violation kind, or ``no_focus``.

**Evidence coverage** is the fraction of the example's evidence chunks that the union of narrowing
focuses made visible, or ``None`` when the example does not know where its evidence is.
"""

from __future__ import annotations

from collections.abc import Collection

from rollouts.protocol import ParsedCompletion


def narrowed_chunks(parsed: ParsedCompletion, num_chunks: int) -> set[int]:
    """Chunk ids made visible by focus segments that hide at least one chunk (any focus when N = 1).

    >>> from rollouts.protocol import parse_completion
    >>> sorted(narrowed_chunks(parse_completion('<focus magic_chunks="2,3">x</focus><answer>8</answer>', 3), 3))
    [2, 3]
    >>> narrowed_chunks(parse_completion('<focus magic_chunks="1,2,3">x</focus><answer>8</answer>', 3), 3)
    set()
    """
    limit = max(num_chunks, 2)  # with a single chunk, focusing on it is the only focus there is
    return {c for s in parsed.segments if s.mode == "focus" and len(s.chunks) < limit for c in s.chunks}


def compliance(
    parsed: ParsedCompletion, evidence_chunks: Collection[int], num_chunks: int
) -> tuple[float, list[str]]:
    """``(1.0, [])`` for a protocol-correct completion, else ``(0.0, reasons)``.

    >>> from rollouts.protocol import parse_completion
    >>> compliance(parse_completion('<focus magic_chunks="2">x</focus><answer>8</answer>', 7), [2], 7)
    (1.0, [])
    >>> compliance(parse_completion("<local>8</local><answer>8</answer><answer>9</answer>", 7), [2], 7)
    (0.0, ['multiple_answers', 'no_focus'])
    """
    reasons = list(dict.fromkeys(v.kind for v in parsed.violations))
    if evidence_chunks and not narrowed_chunks(parsed, num_chunks):
        reasons.append("no_focus")
    return (0.0 if reasons else 1.0), reasons


def evidence_coverage(
    parsed: ParsedCompletion, evidence_chunks: Collection[int], num_chunks: int
) -> float | None:
    """Fraction of ``evidence_chunks`` that a narrowing focus made visible; ``None`` without evidence.

    >>> from rollouts.protocol import parse_completion
    >>> evidence_coverage(parse_completion('<focus magic_chunks="2, 5">x</focus><answer>8</answer>', 7), [2, 7], 7)
    0.5
    """
    evidence = set(evidence_chunks)
    if not evidence:
        return None
    return len(evidence & narrowed_chunks(parsed, num_chunks)) / len(evidence)

"""Make context text unable to speak the protocol (docs/ARCHITECTURE.md, contract 6: documents
cannot speak the protocol).

A document that contains ``<focus magic_chunks="3">`` or ``<answer>42</answer>`` must not steer the
model, the parser or the compliance check. Every ``<`` that opens something shaped like a protocol
tag (any case, optional ``/`` and spaces) becomes ``‹`` (U+2039), which reads the same to a person
and can never start a tag. Chat-template control tokens inside documents are handled separately:
untrusted text is tokenized with ``split_special_tokens=True`` so ``<|im_end|>`` stays plain text.
"""

from __future__ import annotations

import functools
import re

from .modes import generation
from .parser import tag_names

NEUTRAL_LT = "\u2039"


@functools.cache
def _tag_like(_generation: int) -> re.Pattern:
    """The ``<`` of anything shaped like a tag of some mode (registered ones included, modes.py)."""
    return re.compile(r"<(?=\s*/?\s*(?:" + "|".join(tag_names()) + r"))", re.IGNORECASE)


def neutralize(text: str) -> str:
    """Replace the ``<`` of every protocol-tag-like sequence with ``‹``.

    >>> neutralize('see <focus magic_chunks="1"> and </ANSWER>, but 3 < 4')
    'see ‹focus magic_chunks="1"> and ‹/ANSWER>, but 3 < 4'
    """
    return _tag_like(generation()).sub(NEUTRAL_LT, text)

"""Two-hop needle: the asked key's number is given as another key's, so the reader must follow a link.

::

    The special magic number for silver-owl is the same as the one for red-fox.   (chunk 2)
    One of the special magic numbers for red-fox is: 63.                           (chunk 6)
    One of the special magic numbers for silver-fox is: 41.                        (a look-alike)

Asked "What is the special magic number for silver-owl ...?", the answer is 63: read the link, then find the
linked key's needle among look-alikes (``num_distractors`` needles of other keys, half of them near misses of
the linked key). The question is worded as the single needle's, so a reader cannot tell from it that a hop
is needed: it must read what the key's sentence says. The two statements sit in different chunks, link
first, so the gold trace is *chained*: find the link, copy the linked key under focus, return to global to
find that key's needle, copy its number.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .. import phrasings
from ..filler import TokenCounter
from ..packing import Needle, num_docs_for, pack_documents
from ..traces import Read, TracePlan
from .base import Draft, Task
from .names import distinct_numbers, magic_keys
from .niah import check_needle_params


@dataclass(frozen=True)
class TwoHopNeedle(Task):
    name: str = "niah_twohop"
    num_distractors: int = 2  # needles of keys nobody links to; half are near misses of the linked key
    value_digits: int = 2  # digits of each magic number
    phrasing: str = "train"  # family of wordings (data/phrasings.py)

    def __post_init__(self):
        check_needle_params(self)

    def draft(
        self, rng: random.Random, count: TokenCounter, target_tokens: int, chunk_tokens: int, ood: bool
    ) -> Draft:
        # keys[0] is linked to (its needle holds the answer), keys[1:] distract, the last ones near misses
        # of keys[0]; the asked key is drawn apart so it shares no word with the linked one by design
        keys = magic_keys(rng, 1 + self.num_distractors, near=(self.num_distractors + 1) // 2)
        asked = keys[0]
        while asked in keys:
            asked = magic_keys(rng, 1)[0]
        low = 10 ** (self.value_digits - 1)
        values = distinct_numbers(rng, len(keys), low, 10 * low - 1)
        hop = phrasings.link(rng, self.phrasing, asked, keys[0])
        facts = [phrasings.needle(rng, self.phrasing, k, v) for k, v in zip(keys, values)]

        num_docs = num_docs_for(target_tokens, chunk_tokens, min_docs=2 + len(facts[1:]))
        placed = rng.sample(range(num_docs), 2 + len(facts[1:]))  # one statement a chunk
        (first, second), others = sorted(placed[:2]), placed[2:]  # the link before the fact it names
        needles = [
            Needle(hop, first),
            Needle(facts[0], second),
            *(Needle(t, d) for t, d in zip(facts[1:], others)),
        ]
        documents = pack_documents(rng, count, needles, num_docs, target_tokens, chunk_tokens, self.name)

        answer = str(values[0])
        question = phrasings.question(rng, self.phrasing, asked)
        plan = TracePlan(
            answer=answer,
            need="the special magic number of the key it names",
            reads=(Read((first + 1,), hop, keys[0]), Read((second + 1,), facts[0], answer, keys[0])),
            chained=True,
            candidates=tuple(sorted([second + 1, *(d + 1 for d in others)])),  # the second hop's look-alikes
        )
        return Draft(
            question=question,
            documents=documents,
            answers=[answer],
            metric="string_match_all",
            evidence_chunks=[first + 1, second + 1],
            plan=plan,
            leak_keys=frozenset([question, hop, *facts]),
            needles=[hop, facts[0]],
            meta={
                "keys": [asked],
                "linked_key": keys[0],
                "distractor_keys": keys[1:],
                "distractor_needles": facts[1:],
            },
        )

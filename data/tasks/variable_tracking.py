"""Multi-hop variable tracking (RULER's ``vt``): follow a chain of assignments spread over chunks.

A chain binds a value and then copies it from variable to variable::

    VAR QXWRT = 48213.      (chunk 2)
    VAR BLOPA = VAR QXWRT.  (chunk 5)
    VAR ZZKEM = VAR BLOPA.  (chunk 7)

The question names the value and asks for every variable that ends up holding it. Other chains
(``num_chains - 1``, each with its own value) are the distractors. The statements of a chain appear
in reading order, one per chunk while there are enough chunks, so the reader must hop: find the
binding in global, copy it under focus, go back to global to find who copies that variable, and so
on. That is why the gold trace is *chained*. Evidence: the chunks of the asked chain's statements.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from ..filler import TokenCounter
from ..packing import Needle, num_docs_for, pack_documents
from ..traces import Read, TracePlan
from .base import Draft, Task, spread
from .names import distinct_numbers, variable_names


def chain_statements(names: list[str], value: int) -> list[str]:
    return [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in itertools.pairwise(names)]


@dataclass(frozen=True)
class VariableTracking(Task):
    name: str = "variable_tracking"
    num_hops: int = 4  # copies after the binding: a chain holds num_hops + 1 variables (RULER: 4)
    num_chains: int = 2  # chains in the context; one is asked about, the others distract

    def __post_init__(self):
        self.check("num_hops", self.num_hops, self.num_hops >= 1, "must be at least 1")
        self.check("num_chains", self.num_chains, self.num_chains >= 1, "must be at least 1")

    def draft(
        self, rng: random.Random, count: TokenCounter, target_tokens: int, chunk_tokens: int, ood: bool
    ) -> Draft:
        length = self.num_hops + 1
        names = variable_names(rng, length * self.num_chains)
        values = distinct_numbers(rng, self.num_chains, 10_000, 99_999)
        chains = [chain_statements(names[i * length : (i + 1) * length], v) for i, v in enumerate(values)]

        num_docs = num_docs_for(target_tokens, chunk_tokens, min_docs=2)
        placed = [sorted(spread(rng, length, num_docs)) for _ in chains]  # reading order = chain order
        needles = [Needle(s, d) for chain, docs in zip(chains, placed) for s, d in zip(chain, docs)]
        documents = pack_documents(rng, count, needles, num_docs, target_tokens, chunk_tokens, self.name)

        asked, asked_docs = chains[0], placed[0]
        answers = names[:length]
        question = f"Find all variables that are assigned the value {values[0]} in the text above."
        reads: list[Read] = []
        for statement, doc in zip(asked, asked_docs):  # hops that share a chunk are read together
            if reads and reads[-1].chunks == (doc + 1,):
                reads[-1] = Read((doc + 1,), f"{reads[-1].quote} {statement}")
            else:
                reads.append(Read((doc + 1,), statement))
        plan = TracePlan(
            answer=", ".join(answers),
            need="every variable that ends up holding this value",
            reads=tuple(reads),
            combine=f"The chain is {' = '.join(reversed(answers))} = {values[0]}.",
            chained=True,
        )
        return Draft(
            question=question,
            documents=documents,
            answers=answers,
            metric="string_match_all",
            evidence_chunks=sorted({d + 1 for d in asked_docs}),
            plan=plan,
            leak_keys=frozenset([question, *asked]),
            needles=asked,
            meta={"value": values[0], "distractor_values": values[1:]},
        )

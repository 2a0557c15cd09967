"""Multi-span reasoning, the paper's Acme example: facts in different chunks combined in ``local``.

"How many years after Acme Corp was founded did it go public?" needs the founding year from one
chunk and the listing year from another, then a subtraction that needs no context at all. That is
the shape DA is built for: focus, focus, local. Three kinds of question, drawn per example:

- ``years_between``: founding and listing years of a company; answer the difference (``numeric``).
- ``compare``: residents of two towns; answer the larger town's name (``exact``).
- ``total``: baskets a trader sold on ``num_facts`` days; answer the sum (``numeric``).

Each fact of the asked entity sits in its own chunk. ``num_distractors`` facts of the same kind
about other entities sit anywhere, so the reader must pick the right sentences, not just any number.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..filler import TokenCounter, lexicon
from ..packing import Needle, num_docs_for, pack_documents
from ..traces import TracePlan
from .base import Draft, Task, reads_in_document_order, spread
from .names import distinct_numbers, proper_names

KINDS = ("years_between", "compare", "total")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


@dataclass(frozen=True)
class MultiSpan(Task):
    name: str = "multi_span"
    kinds: tuple[str, ...] = KINDS  # question kinds to draw from, uniformly
    num_facts: int = 3  # facts summed by a "total" question (the other kinds combine two)
    num_distractors: int = 2  # facts of the same kind about other entities

    def __post_init__(self):
        object.__setattr__(self, "kinds", tuple(self.kinds))
        unknown = sorted(set(self.kinds) - set(KINDS))
        self.check("kinds", list(self.kinds), bool(self.kinds) and not unknown, f"choose from {KINDS}")
        self.check("num_facts", self.num_facts, 2 <= self.num_facts <= len(_DAYS), "must be 2..7")
        self.check("num_distractors", self.num_distractors, self.num_distractors >= 0, "must be >= 0")

    def draft(
        self, rng: random.Random, count: TokenCounter, target_tokens: int, chunk_tokens: int, ood: bool
    ) -> Draft:
        kind = rng.choice(self.kinds)
        facts, fakes, question, answer, metric, need, combine = getattr(self, f"_{kind}")(rng)
        num_docs = num_docs_for(target_tokens, chunk_tokens, min_docs=len(facts))
        fact_docs = rng.sample(range(num_docs), len(facts))
        needles = [Needle(t, d) for t, d in zip(facts, fact_docs)]
        needles += [Needle(t, d) for t, d in zip(fakes, spread(rng, len(fakes), num_docs))]
        rng.shuffle(needles)
        documents = pack_documents(rng, count, needles, num_docs, target_tokens, chunk_tokens, self.name)
        plan = TracePlan(
            answer=answer, need=need, reads=reads_in_document_order(documents, facts), combine=combine
        )
        return Draft(
            question=question,
            documents=documents,
            answers=[answer],
            metric=metric,
            evidence_chunks=sorted(d + 1 for d in fact_docs),
            plan=plan,
            leak_keys=frozenset([question, *facts]),
            needles=facts,
            meta={"kind": kind, "distractor_needles": fakes},
        )

    def _years_between(self, rng: random.Random):
        company, *others = [f"{n} Corp" for n in proper_names(rng, 1 + self.num_distractors)]
        founded = rng.randint(1850, 1990)
        listed = founded + rng.randint(2, 40)
        facts = [f"{company} was founded in {founded}.", f"{company} went public in {listed}."]
        fakes = [
            f"{other} was founded in {rng.randint(1850, 1990)}."
            if rng.random() < 0.5
            else f"{other} went public in {rng.randint(1880, 2020)}."
            for other in others
        ]
        question = f"How many years after {company} was founded did it go public?"
        combine = f"{listed} - {founded} = {listed - founded}."
        need = "the founding year and the year of going public"
        return facts, fakes, question, str(listed - founded), "numeric", need, combine

    def _compare(self, rng: random.Random):
        towns = proper_names(rng, 2 + self.num_distractors)
        sizes = distinct_numbers(rng, len(towns), 1_000, 99_999)
        facts = [f"The town of {t} has {n} residents." for t, n in zip(towns[:2], sizes[:2])]
        fakes = [f"The town of {t} has {n} residents." for t, n in zip(towns[2:], sizes[2:])]
        a, b = towns[:2] if rng.random() < 0.5 else towns[1::-1]
        bigger = towns[0] if sizes[0] > sizes[1] else towns[1]
        big, small = max(sizes[:2]), min(sizes[:2])
        question = f"Which town has more residents, {a} or {b}?"
        combine = f"{big} is more than {small}, so {bigger} is larger."
        return facts, fakes, question, bigger, "exact", "the number of residents of both towns", combine

    def _total(self, rng: random.Random):
        cats = lexicon()
        trader, *others = proper_names(rng, 1 + self.num_distractors)
        food = rng.choice(cats["food"])
        days = rng.sample(_DAYS, self.num_facts)
        baskets = [rng.randint(2, 60) for _ in days]
        facts = [f"On {d}, {trader} sold {n} baskets of {food} at the market." for d, n in zip(days, baskets)]
        fakes = []
        for other in others:  # another trader with the same food, or the same trader with another food
            who, what = (other, food) if rng.random() < 0.5 else (trader, rng.choice(cats["food"]))
            if what == food and who == trader:
                who = other
            fakes.append(
                f"On {rng.choice(_DAYS)}, {who} sold {rng.randint(2, 60)} baskets of {what} at the market."
            )
        question = f"How many baskets of {food} did {trader} sell at the market in total?"
        combine = f"{' + '.join(map(str, baskets))} = {sum(baskets)}."
        need = "every sale of these baskets by this trader"
        return facts, fakes, question, str(sum(baskets)), "numeric", need, combine

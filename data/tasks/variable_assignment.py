"""Variable Assignment, the Selective Attention paper's motivating task, as a plain sequence task.

    y=7; x=1; x=3; z=5; x=?   ->   3

The answer is the most recent value assigned to the queried variable: every assignment makes the
earlier ones to the same variable irrelevant, which selective attention can express by masking
them. The paper trains on 3 variables with 1,000 possible values and tests out of distribution on
the same 3 variables with only 2 values, where a standard transformer drops to 70% accuracy and a
selective-attention one stays at 100%. ``ood=True`` draws that out-of-distribution set.

This is not a long-context DA task: the sequence is a single document (one magic chunk) whose
length is set by ``num_assignments``, not by the length targets, and the gold traces are just the
answer (non-thinking) or one line of reasoning and the answer (thinking). The full training string
is ``documents[0] + " " + question`` (also in ``meta["sequence"]``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from ..filler import TokenCounter
from ..schema import DataError
from ..traces import TracePlan
from .base import Draft, Task


@dataclass(frozen=True)
class VariableAssignment(Task):
    name: str = "variable_assignment"
    length_targeted: ClassVar[bool] = False
    has_ood: ClassVar[bool] = True
    variables: str = "xyz"  # one-letter variable names (the paper: 3 variables)
    num_assignments: int = 16  # assignments before the query
    num_values: int = 1000  # values are 0..num_values-1 (the paper: 1,000)
    ood_num_values: int = 2  # values in the out-of-distribution split (the paper: 2)

    def __post_init__(self):
        ok = len(self.variables) >= 1 and len(set(self.variables)) == len(self.variables)
        self.check("variables", self.variables, ok and self.variables.isalpha(), "distinct letters")
        self.check("num_assignments", self.num_assignments, self.num_assignments >= 1, "must be >= 1")
        self.check("num_values", self.num_values, self.num_values >= 2, "must be >= 2")
        self.check("ood_num_values", self.ood_num_values, self.ood_num_values >= 1, "must be >= 1")

    def draft(
        self, rng: random.Random, count: TokenCounter, target_tokens: int, chunk_tokens: int, ood: bool
    ) -> Draft:
        values = self.ood_num_values if ood else self.num_values
        steps = [(rng.choice(self.variables), rng.randrange(values)) for _ in range(self.num_assignments)]
        query = rng.choice(sorted({v for v, _ in steps}))  # ask only about a variable that was assigned
        answer = next(value for var, value in reversed(steps) if var == query)
        sequence = " ".join(f"{var}={value};" for var, value in steps)
        if count.one(sequence) > chunk_tokens:
            raise DataError(
                f"{self.name}: {self.num_assignments} assignments take {count.one(sequence)} tokens, more "
                f"than chunk_tokens={chunk_tokens}; lower params.num_assignments or raise chunk_tokens"
            )
        question = f"{query}=?"
        plan = TracePlan(
            answer=str(answer), combine=f"The last assignment to {query} is {query}={answer}.", minimal=True
        )
        return Draft(
            question=question,
            documents=[sequence],
            answers=[str(answer)],
            metric="exact",
            evidence_chunks=[1],
            plan=plan,
            leak_keys=frozenset([f"{self.name}:{sequence} {question}"]),
            needles=[f"{query}={answer};"],
            meta={"sequence": f"{sequence} {question}", "ood": ood, "num_values": values},
        )

"""Reward terms beyond the four built into the composite reward, added in one place.

A term is a function of one parsed completion, its dataset row and its KV reads, and a weight.
:func:`register_term` adds it to the total (``weight * value``), to the breakdown of every completion
(``RewardBreakdown.value(name)``), to TRL's reward functions (``<name>_reward``, logged as
``rewards/<name>_reward/mean``), to the run's metrics (``reward/<name>``), the dashboards, the wandb
mirror and ``heed eval``'s table: each of those iterates :func:`shown`. A real term takes three pieces:
its function, its weight's field in :class:`~rewards.config.RewardConfig` (named by ``weight``), and the
:func:`register_term` call, in the module that defines it (imported before the trainer is built)::

    def brevity(parsed, example, reads):  # 1 for an answer of at most 3 words, else 0
        return float(parsed.answer is not None and len(parsed.answer.split()) <= 3)

    register_term(RewardTerm("brevity", brevity, weight="brevity_weight"))

The four built-in terms (``COMPONENTS``: accuracy, efficiency, compliance, coverage) keep their own
code in ``composite.py``: their gates depend on each other. A registered term is scored after them and
gated by nothing; a completion that cannot be graded (truncated, empty, a failed rollout) scores 0 in it,
and a term that raises scores ``None`` with the reason ``<name>/error``, never the whole batch.

What is left out: registrations live in one process. The trainer scores where the pool answers (rank 0
of ``heed train``), so registering at import of one's own module is enough there; a term meant for
``heed launch`` jobs must be imported by the job's entry point as well.
"""

from __future__ import annotations

import contextlib
import keyword
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from rollouts.protocol import ParsedCompletion

from .config import RewardConfig
from .efficiency import KVReads

logger = logging.getLogger(__name__)

# The composite reward's own terms (RewardBreakdown fields, in the order every view shows them).
COMPONENTS = ("accuracy", "efficiency", "compliance", "coverage")
_RESERVED = ("total", *COMPONENTS, "kv_saving", "accuracy_ruler", "reasons", "extra")

Score = Callable[[ParsedCompletion, Mapping, "KVReads | None"], "float | None"]


@dataclass(frozen=True)
class RewardTerm:
    """One registered term: ``weight * score(parsed, example, reads)`` is added to the total."""

    name: str  # its key everywhere: RewardBreakdown.value(name), <name>_reward, reward/<name>
    score: Score  # the term for one completion (None: unknown, counts as 0 in the total)
    weight: float | str = 1.0  # a number, or the RewardConfig field that holds it (0: logged only)

    def __post_init__(self):
        if not self.name.isidentifier() or keyword.iskeyword(self.name) or self.name in _RESERVED:
            raise ValueError(
                f"reward term name {self.name!r} must be a Python identifier other than {', '.join(_RESERVED)}"
            )
        if isinstance(self.weight, str) and self.weight not in RewardConfig.__dataclass_fields__:
            raise ValueError(
                f"reward term {self.name!r}: weight {self.weight!r} is no RewardConfig field; add the field "
                "(rewards/config.py) or give the weight as a number"
            )

    def weight_in(self, config: RewardConfig) -> float:
        return float(getattr(config, self.weight) if isinstance(self.weight, str) else self.weight)

    def value(self, parsed: ParsedCompletion, example: Mapping, reads: KVReads | None, reasons: list[str]):
        """The term for one completion; a term that raises is ``None`` with the reason ``<name>/error``."""
        try:
            value = self.score(parsed, example, reads)
            return None if value is None else float(value)
        except Exception:
            logger.exception("reward term %r failed; it scores None", self.name)
            reasons.append(f"{self.name}/error")
            return None


_REGISTERED: dict[str, RewardTerm] = {}


def register_term(term: RewardTerm) -> None:
    """Add ``term`` to the composite reward and every view of it (module docstring)."""
    if term.name in _REGISTERED:
        raise ValueError(f"a reward term named {term.name!r} is registered already")
    _REGISTERED[term.name] = term


def unregister_term(name: str) -> None:
    _REGISTERED.pop(name, None)


@contextlib.contextmanager
def registered(term: RewardTerm) -> Iterator[RewardTerm]:
    """``term`` registered for the ``with`` block only."""
    register_term(term)
    try:
        yield term
    finally:
        unregister_term(term.name)


def extra_terms() -> tuple[RewardTerm, ...]:
    """The registered terms, in registration order."""
    return tuple(_REGISTERED.values())


def term_names() -> tuple[str, ...]:
    """Every term of the reward: the built-in ones, then the registered ones.

    >>> term_names()
    ('accuracy', 'efficiency', 'compliance', 'coverage')
    """
    return (*COMPONENTS, *_REGISTERED)


def shown() -> tuple[str, ...]:
    """What the views show of a reward, in order: the total, then every term."""
    return ("total", *term_names())

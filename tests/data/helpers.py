"""Generate one example the way the builder does, for tests that check it independently."""

from __future__ import annotations

import random

from data.filler import TokenCounter
from data.tasks import TASKS, finalize, make_task

LENGTH_TASKS = tuple(name for name, (cls, _) in TASKS.items() if cls.length_targeted)


def generate(
    tokenizer, task: str, target: int, seed: int = 0, chunk_tokens: int = 128, params=None, ood=False,
    trace_style: str = "verbose", trace_navigation: str = "global", trace_strategies=None,
):  # fmt: skip
    generator = make_task(task, params)
    count = TokenCounter(tokenizer)
    rng = random.Random(f"test/{seed}/{task}/{target}")
    target = target if generator.length_targeted else 0
    draft = generator.draft(rng, count, target, chunk_tokens, ood=ood)
    return finalize(
        task,
        draft,
        example_id=f"{task}-{seed}",
        count=count,
        chunk_tokens=chunk_tokens,
        target_tokens=target,
        rng=rng,
        trace_style=trace_style,
        trace_navigation=trace_navigation,
        trace_strategies=trace_strategies,
    )

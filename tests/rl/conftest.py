"""What the two `heed launch` test files share, started once per session: the two-node Ray cluster and the
uninterrupted two-rank job (tests/rl/ray_cluster.py), so the cluster test and the fault test pay for
neither twice."""

import pytest

from tests.rl.ray_cluster import SECRET, launch_two_ranks, start_cluster


@pytest.fixture(scope="session")
def cluster():
    pytest.importorskip("vllm")
    # four CPUs a node: two jobs side by side (each holds two of each node's). Task states reach the state
    # API within 0.1 s, so a test can see a rollout actor decoding
    cluster = start_cluster(cpus_per_node=4, extra_env={"RAY_task_events_report_interval_ms": "100"})
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def launched(cluster, tmp_path_factory):
    """``TWO_RANK_JOB`` launched to its end, with a secret on the command line; run dir, output, job id."""
    run_dir = tmp_path_factory.mktemp("launch") / "two-nodes"
    return launch_two_ranks(cluster, run_dir, f"logging.wandb_api_key={SECRET}").finished()


def pytest_runtest_teardown(item, nextitem):
    """Stop the shared cluster after the last test that uses it rather than at the end of the session:
    the tests after it should not share this machine's CPUs and memory with an idle Ray."""
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if cluster is None:
        return
    later = item.session.items[item.session.items.index(item) + 1 :]
    if not any("cluster" in getattr(other, "fixturenames", ()) for other in later):
        cluster.stop()  # the fixture's own teardown then finds nothing left to stop

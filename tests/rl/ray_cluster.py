"""A Ray cluster on this machine for the launch and pool tests: a head (node A) and, for two nodes, a
second node (node B), started as separate `ray start --block` processes, each with its own CPUs, its own
agent ports and a custom resource that marks it, token authentication on (a token of the cluster's own),
the dashboard and job server on loopback. A node counts as up once the dashboard (which asks the GCS)
lists it ALIVE, so a client connecting to ``gcs_address`` afterwards finds a GCS that answers.

Everything lives in a temp dir of its own and in the two `ray start` processes' trees; teardown kills
those trees, never `ray stop` (which would stop every Ray instance on the machine, other tests' too).

Also the job both `heed launch` test files run (``TWO_RANK_JOB``): the shrunk tiny job with SFT and
gold-forced GRPO (tests/rl/gold_forced_train.py), two trainer ranks on node A and two rollout actors on
node B. tests/rl/conftest.py runs it once per session (``launched``): test_launch_cluster.py compares it
with one process, test_launch_faults.py with a run that lost a rank and resumed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.rl.gold_forced_train import SMALL_DATA_AND_EVAL
from tests.rl.jobs import ROOT, free_port

TRAINER_RESOURCE, ROLLOUT_RESOURCE = "heed_node_a", "heed_node_b"

GRPO_STEPS = 3  # checkpointed after each: a rank lost after the first leaves later ones to compare
JOB = [
    "sft.max_steps=3",
    "sft.warmup_steps=1",
    "sft.logging_steps=1",
    f"grpo.max_steps={GRPO_STEPS}",
    "grpo.warmup_steps=0",  # every step at the full rate, so each one moves the weights
    "grpo.prompts_per_step=2",
    "grpo.num_generations=2",
    "grpo.max_completion_length=48",  # room for the gold traces (32 tokens) the even slots are forced to
    # vLLM's processed log-probs come after the forcing logits processor (0 for a forced token); its raw
    # ones are the model's, and at temperature 1 (top_p 1) the same as the processed ones for sampled
    # tokens: engine and trainer log-probs then agree on every token, forced or sampled
    "grpo.temperature=1.0",
    "rollout.engine_kwargs.logprobs_mode=raw_logprobs",  # the config's other engine arguments kept
    "grpo.save_steps=1",
    *SMALL_DATA_AND_EVAL,
    "eval.after_sft=false",
    "rollout.num_actors=2",
]  # the shrunk tiny job; as one process add sft.per_device_batch_size=4
TWO_NODES = [  # two trainer ranks on node A, the rollout actors on node B: each job holds half of each node
    "cluster.trainer_workers=2",
    f"cluster.trainer_resources={{CPU: 1, {TRAINER_RESOURCE}: 1}}",
    f"rollout.resources_per_actor={{{ROLLOUT_RESOURCE}: 1}}",
    f"cluster.rollout_node_resource={ROLLOUT_RESOURCE}",  # rank 0 checks where they landed
]
TWO_RANK_JOB = [*JOB, *TWO_NODES, "sft.per_device_batch_size=2"]  # the same global batch over two ranks
SECRET = f"wandb-{secrets.token_hex(12)}"  # made at run time: no source file the job packages holds it


def heed(*args: str, gold_forced: bool = False) -> list[str]:
    """The `heed ARGS` command line; ``gold_forced``: GRPO rollouts gold-forced on even slots, also inside
    a `heed launch` job's trainer ranks (tests/rl/gold_forced_train.py)."""
    module = "tests.rl.gold_forced_train" if gold_forced else "rl.cli"
    return [sys.executable, "-m", module, *args]


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
        """SIGKILL every process the nodes started, then remove the temp dir. A graceful exit of
        `ray start --block` takes about 30 s and leaves nothing these tests read."""
        import psutil

        # each `ray start` process and all its descendants, taken whole before any dies. Not the process
        # groups: Ray gives each worker a group of its own, and a job's driver a session of its own
        doomed = []
        for proc in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                node = psutil.Process(proc.pid)
                doomed += [node, *node.children(recursive=True)]
        for process in doomed:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        for proc in self.processes:
            proc.wait()
        self.processes.clear()
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


def launch(cluster: LocalCluster, log: Path, *args: str, gold_forced: bool = False) -> subprocess.Popen:
    """`heed launch ARGS` on ``cluster``, started; its output (stdout and stderr) goes to ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            heed("launch", "--address", cluster.address, *args, gold_forced=gold_forced),
            cwd=ROOT, env=cluster.env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


SUBMITTED = re.compile(r"^heed: submitted job (\S+)", re.M)  # what `heed launch` prints once it submitted


def submitted_job_id(output: str) -> str | None:
    """The id of the job `heed launch` submitted, from its output; None before it printed one."""
    ids = set(SUBMITTED.findall(output))
    assert len(ids) <= 1, f"one launch, several job ids: {sorted(ids)}"
    return next(iter(ids), None)


@dataclass
class TwoRankLaunch:
    """A `heed launch` of ``TWO_RANK_JOB`` (gold-forced), started by :func:`launch_two_ranks`."""

    run_dir: Path
    log: Path
    client: subprocess.Popen  # the `heed launch` process, which follows the job to its end

    def finished(self) -> tuple[Path, str, str]:
        """Wait for the job's end; its run dir, output and job id."""
        try:
            returncode = self.client.wait(timeout=900)
        finally:
            self.stop()
        output = self.log.read_text()
        assert returncode == 0, output[-6000:]
        job_id = submitted_job_id(output)
        assert job_id, output[-6000:]
        return self.run_dir, output, job_id

    def stop(self) -> None:
        """Kill the client if it still runs (the job itself ends with the cluster)."""
        if self.client.poll() is None:
            self.client.kill()
            self.client.wait()


def launch_two_ranks(cluster: LocalCluster, run_dir: Path, *extra: str) -> TwoRankLaunch:
    """Start `heed launch` of ``TWO_RANK_JOB`` (gold-forced). Started first and waited for later
    (:meth:`TwoRankLaunch.finished`), two launches run side by side (the cluster holds two such jobs)."""
    log = run_dir.parent / f"{run_dir.name}.log"
    client = launch(cluster, log, f"run.output_dir={run_dir}", *TWO_RANK_JOB, *extra, gold_forced=True)
    return TwoRankLaunch(run_dir, log, client)


def grpo_steps_moved(run_dir: Path, steps) -> None:
    """Assert that each GRPO step in ``steps`` really updated: a gradient, and weights that differ from the
    step before (SFT's for the first)."""
    from safetensors.torch import load_file

    metrics = {r["step"]: r for r in phase_metrics(run_dir, "grpo")}
    for step in steps:
        assert metrics[step]["grad_norm"] > 1e-3, (run_dir, step, metrics[step])
        before = run_dir / ("sft" if step == 1 else f"checkpoints/checkpoint-{step - 1}")
        after = run_dir / "checkpoints" / f"checkpoint-{step}"
        old, new = load_file(before / "model.safetensors"), load_file(after / "model.safetensors")
        assert max((new[k] - old[k]).abs().max().item() for k in old) > 1e-5, (run_dir, step)


def phase_metrics(run_dir: Path, phase: str) -> list[dict]:
    """The training lines of ``phase`` in the run's metrics.jsonl (a rerun step's lines included)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["phase"] == phase and "loss" in r]

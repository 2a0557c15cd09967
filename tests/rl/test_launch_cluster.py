"""`heed launch` on a real two-node Ray cluster on this machine (tests/rl/ray_cluster.py): node A (the head)
has the trainer-node resource, node B the rollout-node resource, two CPUs each. The shrunk tiny job is
submitted through the job server with two trainer ranks (a Ray Train worker group, gloo) pinned to node A
and two rollout actors, which land on node B (the ranks hold node A's CPUs; rank 0 checks it). The run
must end like the same job as one `heed train` process with the same seed and global batch:

- SFT losses and gradient norms to 1e-4 (data parallelism is the same arithmetic; only float summation
  order differs: tests/rl/test_multiprocess.py measures 5e-7);
- the same GRPO prompts, and the same completions (equal KV reads and completion lengths: rank 0 samples
  the whole global batch with the same per-slot seeds), sampled by engines on node B that hold the
  trainer's weights (trainer vs engine log-probs agree to float noise after the weights crossed nodes);
- the same greedy final eval.

Also: no secret reaches the cluster (not in the job's command line, runtime env, package, logs or the Ray
temp dir), the job server refuses requests without the cluster's token, and `heed status` reports the job.
"""

import json
import os
import secrets
import socket
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest

from tests.rl.ray_cluster import ROLLOUT_RESOURCE, TRAINER_RESOURCE, node_ip, start_cluster
from tests.rl.test_sft_deepspeed import ROOT

pytestmark = pytest.mark.slow

SECRET = f"wandb-{secrets.token_hex(12)}"  # made here: no source file the job packages holds it
BASE = [
    "sft.max_steps=3",
    "sft.warmup_steps=1",
    "sft.logging_steps=1",
    "grpo.max_steps=2",
    "grpo.prompts_per_step=2",
    "grpo.num_generations=2",
    "grpo.max_completion_length=24",
    "grpo.save_steps=1",
    "data.build.splits={train: 16, test: 2}",
    "data.build.lengths=[256]",
    "data.eval_examples=2",
    "eval.modes=[da]",
    "eval.max_tokens=24",
    "eval.before_training=false",
    "eval.sampled_samples=0",
    "eval.after_sft=false",
    "logging.wandb_mode=disabled",
    "rollout.num_actors=2",
]
TWO_NODES = [
    "cluster.trainer_workers=2",
    f"cluster.trainer_resources={{CPU: 1, {TRAINER_RESOURCE}: 1}}",
    f"cluster.rollout_node_resource={ROLLOUT_RESOURCE}",
]


def heed(*args: str) -> list[str]:
    return [sys.executable, "-m", "rl.cli", *args]


def metrics(run_dir: Path, phase: str) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["phase"] == phase and "loss" in r]


@pytest.fixture(scope="module")
def reference_job(tmp_path_factory):
    """The one-process run, started first: it overlaps the cluster's start-up and the job's waits."""
    pytest.importorskip("vllm")
    run_dir = tmp_path_factory.mktemp("launch") / "one-process"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = (run_dir.parent / "train.log").open("w")
    proc = subprocess.Popen(
        heed("train", f"run.output_dir={run_dir}", *BASE, "sft.per_device_batch_size=4"),
        cwd=ROOT, env=env | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "disabled"},
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    yield run_dir, proc
    if proc.poll() is None:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def cluster(reference_job):
    cluster = start_cluster()
    yield cluster
    cluster.stop()


def launch_two_ranks(cluster, run_dir: Path, *extra: str) -> tuple[Path, str, str]:
    """`heed launch` of the shrunk job with two trainer ranks; its run dir, output and job id."""
    out = subprocess.run(
        heed("launch", "--address", cluster.address, f"run.output_dir={run_dir}", *BASE, *TWO_NODES,
             "sft.per_device_batch_size=2", *extra),
        cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    (run_dir.parent / f"{run_dir.name}.log").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (job_id,) = {
        line.split()[3] for line in out.stdout.splitlines() if line.startswith("heed: submitted job")
    }
    return run_dir, out.stdout + out.stderr, job_id


@pytest.fixture(scope="module")
def launched(cluster, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("launch") / "two-nodes"
    return launch_two_ranks(cluster, run_dir, f"logging.wandb_api_key={SECRET}")


@pytest.fixture(scope="module")
def reference(reference_job):
    run_dir, proc = reference_job
    assert proc.wait(timeout=900) == 0, (run_dir.parent / "train.log").read_text()[-4000:]
    return run_dir


def test_two_node_job_trains_like_one_process(launched, reference):
    run_dir = launched[0]
    for d in (run_dir, reference):
        state = json.loads((d / "state.json").read_text())
        assert state["completed"] == ["sft", "grpo", "eval_grpo", "export", "report"]
    sft, sft_ref = metrics(run_dir, "sft"), metrics(reference, "sft")
    assert [r["step"] for r in sft] == [r["step"] for r in sft_ref] == [1, 2, 3]
    for a, b in zip(sft_ref, sft):
        assert a["loss"] > 0.1 and a["grad_norm"] > 1e-3  # a real SFT step: equal losses say something
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert (run_dir / "grpo_prompts.jsonl").read_text() == (reference / "grpo_prompts.jsonl").read_text()
    grpo, grpo_ref = metrics(run_dir, "grpo"), metrics(reference, "grpo")
    assert [r["step"] for r in grpo] == [r["step"] for r in grpo_ref] == [1, 2]
    for a, b in zip(grpo_ref, grpo):
        for key in ("reward", "completions/mean_length", "kv/tokens_da", "kv/tokens_vanilla"):
            assert b[key] == a[key], key
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        # the engines on node B decode with the trainer's weights: pushed across nodes after SFT and
        # after each step, their log-probs equal the trainer's to float noise
        assert b["sampling/sampling_logp_difference/max"] < 1e-3
    evals = [json.loads((d / "eval" / "grpo.json").read_text())["results"] for d in (reference, run_dir)]
    assert evals[0] == evals[1]
    checkpoint = run_dir / "checkpoints" / "checkpoint-2"
    assert (checkpoint / "heed_complete.json").is_file() and (checkpoint / "rng_state_1.pth").is_file()


def test_trainer_ranks_and_rollout_actors_ran_on_their_own_nodes(cluster, launched):
    job_id = launched[2]
    nodes = {n["node_id"]: n["resources_total"] for n in cluster.nodes()}
    job = next(j for j in cluster.api("/api/jobs/") if j["submission_id"] == job_id)
    actors = [a for a in cluster.actors() if a["job_id"] == job["job_id"]]
    trainer_nodes = [a["node_id"] for a in actors if a["class_name"] == "RayTrainWorker"]
    rollout_nodes = [a["node_id"] for a in actors if a["class_name"] == "RolloutActor"]
    assert len(trainer_nodes) == 2 and len(rollout_nodes) == 2
    assert all(TRAINER_RESOURCE in nodes[n] for n in trainer_nodes)
    assert all(ROLLOUT_RESOURCE in nodes[n] for n in rollout_nodes)
    assert not set(trainer_nodes) & set(rollout_nodes)
    assert "actors on nodes" in launched[1] and f"({ROLLOUT_RESOURCE})" in launched[1]  # rank 0 checked too


def test_no_secret_reaches_the_cluster(cluster, launched):
    run_dir, output, job_id = launched
    assert "stays on this machine" in output  # the client said where the key went: nowhere
    assert SECRET not in output  # the streamed job logs
    job = next(j for j in cluster.api("/api/jobs/") if j["submission_id"] == job_id)
    assert SECRET not in json.dumps(job)  # entrypoint, runtime env, metadata
    assert set(job["runtime_env"]["env_vars"]) == {"PYTHONUNBUFFERED"}
    found = subprocess.run(["grep", "-rlI", SECRET, str(cluster.temp_dir), str(run_dir)], capture_output=True)
    assert found.stdout == b""  # no session log, package, runtime resource or run file holds it
    assert found.returncode == 1


def test_the_job_server_wants_the_token_and_listens_on_loopback(cluster, launched):
    with pytest.raises(urllib.error.HTTPError) as refused:
        cluster.api("/api/jobs/", token=False)
    assert refused.value.code == 401
    port = int(cluster.address.rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex((node_ip(), port)) != 0  # not on the node's address


def test_heed_status_reports_the_job(cluster, launched):
    out = subprocess.run(
        heed("status", "--address", cluster.address), cwd=ROOT, env=cluster.env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stdout.splitlines() if line.startswith(launched[2])]
    assert "SUCCEEDED" in line and str(launched[0]) in line


def test_deepspeed_zero2_ranks_under_ray_train_train_like_one_process(cluster, reference, tmp_path):
    """The same two-rank job under DeepSpeed ZeRO-2: accelerate builds the engine inside the Ray Train
    workers on the process group Ray Train formed (gloo), the optimizer state is partitioned over the two
    ranks, and the run ends like the plain one-process run to DeepSpeed's tolerance (its AdamW is not
    torch's; tests/rl/test_multiprocess.py). Measured: SFT losses to 5e-7, gradient norms to 1e-5 relative,
    and the same GRPO completions."""
    run_dir, output, _ = launch_two_ranks(
        cluster, tmp_path / "zero2", "grpo.deepspeed=configs/deepspeed/zero2.json"
    )
    assert "heed: DeepSpeed config configs/deepspeed/zero2.json" in output  # the driver says what runs
    state = json.loads((run_dir / "state.json").read_text())
    assert state["completed"] == ["sft", "grpo", "eval_grpo", "export", "report"]
    for phase in ("sft", "grpo"):
        ref, got = metrics(reference, phase), metrics(run_dir, phase)
        assert [r["step"] for r in got] == [r["step"] for r in ref] and got
        for a, b in zip(ref, got):
            assert b["loss"] == pytest.approx(a["loss"], abs=1e-3)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3, abs=1e-6)
    assert (run_dir / "grpo_prompts.jsonl").read_text() == (reference / "grpo_prompts.jsonl").read_text()
    for a, b in zip(metrics(reference, "grpo"), metrics(run_dir, "grpo")):
        # the engines decode with the weights the ZeRO engine trained (pushed after SFT and each step)
        assert (b["reward"], b["kv/tokens_da"]) == (a["reward"], a["kv/tokens_da"])
        assert b["sampling/sampling_logp_difference/max"] < 1e-3
    step = run_dir / "checkpoints" / "checkpoint-2" / "global_step2"
    shards = sorted(p.name for p in step.glob("zero_pp_rank_*_optim_states.pt"))
    assert shards == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]  # one per rank
    assert (run_dir / "export" / "model.safetensors").stat().st_size > 1e6

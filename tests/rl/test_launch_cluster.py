"""`heed launch` on a real two-node Ray cluster on this machine (tests/rl/ray_cluster.py): node A (the head)
has the trainer-node resource, node B the rollout-node resource, four CPUs each. The shrunk tiny job is
submitted through the job server with two trainer ranks (a Ray Train worker group, gloo) pinned to node A
and two rollout actors pinned to node B (rank 0 checks where they landed). Both runs
are gold-forced (tests/rl/gold_forced_train.py), so every GRPO step has a reward spread and moves the
weights, which each run is checked to do before the two are compared. The run must end like the same job
as one `heed train` process with the same seed and global batch:

- SFT losses and gradient norms to 1e-4 (data parallelism is the same arithmetic; only float summation
  order differs: tests/rl/test_multiprocess.py measures 5e-7);
- the same GRPO prompts, and the same completions (equal KV reads and completion lengths: rank 0 samples
  the whole global batch with the same per-slot seeds), sampled by engines on node B that hold the
  trainer's weights (trainer vs engine log-probs agree to float noise after the weights crossed nodes);
  GRPO losses and gradient norms to 1e-4, and final weights to 1e-5 (measured 2e-6; a step moves them
  by about the learning rate, 1e-4);
- the same greedy final eval.

The cluster and the two-rank run are the session's (tests/rl/conftest.py): test_launch_faults.py resumes
a run of the same job and compares it with this one. The same job under DeepSpeed ZeRO-2 runs beside it.

Also: no secret reaches the cluster (not in the job's command line, runtime env, package, logs or the Ray
temp dir), the job server refuses requests without the cluster's token, and `heed status` reports the job.
"""

import json
import os
import socket
import subprocess
import urllib.error
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.rl.jobs import ROOT
from tests.rl.ray_cluster import (
    GRPO_STEPS,
    JOB,
    ROLLOUT_RESOURCE,
    SECRET,
    TRAINER_RESOURCE,
    grpo_steps_moved,
    heed,
    launch_two_ranks,
    node_ip,
    phase_metrics,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session", autouse=True)
def reference_job(tmp_path_factory):
    """The one-process run, started first (before the session's cluster): it overlaps the cluster's
    start-up and the job's waits."""
    pytest.importorskip("vllm")
    run_dir = tmp_path_factory.mktemp("launch") / "one-process"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = (run_dir.parent / "train.log").open("w")
    proc = subprocess.Popen(
        heed("train", f"run.output_dir={run_dir}", *JOB, "sft.per_device_batch_size=4", gold_forced=True),
        cwd=ROOT, env=env | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "disabled"},
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    yield run_dir, proc
    if proc.poll() is None:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def reference(reference_job):
    run_dir, proc = reference_job
    assert proc.wait(timeout=900) == 0, (run_dir.parent / "train.log").read_text()[-4000:]
    return run_dir


@pytest.fixture(scope="module", autouse=True)
def zero2_launch(cluster, tmp_path_factory):
    """The two-rank job under DeepSpeed ZeRO-2, started with the module: beside the session's run of the
    plain job, which the first test starts."""
    run_dir = tmp_path_factory.mktemp("launch") / "zero2"
    job = launch_two_ranks(cluster, run_dir, "grpo.deepspeed=configs/deepspeed/zero2.json")
    yield job
    job.stop()  # its client, when -k left out the test that waits for it


def assert_same_weights(run_dir: Path, reference: Path, atol: float) -> None:
    """The final policies agree to ``atol``: data parallelism changes only float summation order. (A ZeRO
    engine also saves the tied ``lm_head.weight``: the reference's tensors are compared.)"""
    got, want = (load_file(d / "final" / "model.safetensors") for d in (run_dir, reference))
    torch.testing.assert_close({k: got[k] for k in want}, want, rtol=0, atol=atol)


def test_two_node_job_trains_like_one_process(launched, reference):
    run_dir = launched[0]
    for d in (run_dir, reference):
        state = json.loads((d / "state.json").read_text())
        assert state["completed"] == ["sft", "grpo", "eval_grpo", "export", "report"]
    sft, sft_ref = phase_metrics(run_dir, "sft"), phase_metrics(reference, "sft")
    assert [r["step"] for r in sft] == [r["step"] for r in sft_ref] == [1, 2, 3]
    for a, b in zip(sft_ref, sft):
        assert a["loss"] > 0.1 and a["grad_norm"] > 1e-3  # a real SFT step: equal losses say something
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert (run_dir / "grpo_prompts.jsonl").read_text() == (reference / "grpo_prompts.jsonl").read_text()
    grpo, grpo_ref = phase_metrics(run_dir, "grpo"), phase_metrics(reference, "grpo")
    assert [r["step"] for r in grpo] == [r["step"] for r in grpo_ref] == list(range(1, GRPO_STEPS + 1))
    # gold-forced rollouts give every group a reward spread: each step of both runs really updates
    grpo_steps_moved(reference, range(1, GRPO_STEPS + 1))
    grpo_steps_moved(run_dir, range(1, GRPO_STEPS + 1))
    for a, b in zip(grpo_ref, grpo):
        for key in ("reward", "completions/mean_length", "kv/tokens_da", "kv/tokens_vanilla"):
            assert b[key] == a[key], key
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        # the engines on node B decode with the trainer's weights: pushed across nodes after SFT and
        # after each step, their log-probs equal the trainer's to float noise
        assert b["sampling/sampling_logp_difference/max"] < 1e-3
    evals = [json.loads((d / "eval" / "grpo.json").read_text())["results"] for d in (reference, run_dir)]
    assert evals[0] == evals[1]
    assert_same_weights(run_dir, reference, atol=1e-5)  # measured 2e-6; a GRPO step moves them by 1e-4
    checkpoint = run_dir / "checkpoints" / f"checkpoint-{GRPO_STEPS}"
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


def test_deepspeed_zero2_ranks_under_ray_train_train_like_one_process(zero2_launch, reference):
    """The same two-rank job under DeepSpeed ZeRO-2: accelerate builds the engine inside the Ray Train
    workers on the process group Ray Train formed (gloo), the optimizer state is partitioned over the two
    ranks, and the run ends like the plain one-process run to DeepSpeed's tolerance (its AdamW is not
    torch's; tests/rl/test_multiprocess.py). Measured: SFT losses to 5e-7, gradient norms to 5e-5 relative
    (GRPO's too), the same GRPO completions, and final weights to 6e-6."""
    run_dir, output, _ = zero2_launch.finished()
    assert "heed: DeepSpeed config configs/deepspeed/zero2.json" in output  # the driver says what runs
    state = json.loads((run_dir / "state.json").read_text())
    assert state["completed"] == ["sft", "grpo", "eval_grpo", "export", "report"]
    for phase in ("sft", "grpo"):
        ref, got = phase_metrics(reference, phase), phase_metrics(run_dir, phase)
        assert [r["step"] for r in got] == [r["step"] for r in ref] and got
        for a, b in zip(ref, got):
            assert b["loss"] == pytest.approx(a["loss"], abs=1e-3)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3, abs=1e-6)
    assert (run_dir / "grpo_prompts.jsonl").read_text() == (reference / "grpo_prompts.jsonl").read_text()
    grpo_steps_moved(run_dir, range(1, GRPO_STEPS + 1))  # nonzero updates under ZeRO too
    for a, b in zip(phase_metrics(reference, "grpo"), phase_metrics(run_dir, "grpo")):
        # the engines decode with the weights the ZeRO engine trained (pushed after SFT and each step)
        assert (b["reward"], b["kv/tokens_da"]) == (a["reward"], a["kv/tokens_da"])
        assert b["sampling/sampling_logp_difference/max"] < 1e-3
    step = run_dir / "checkpoints" / "checkpoint-2" / "global_step2"
    shards = sorted(p.name for p in step.glob("zero_pp_rank_*_optim_states.pt"))
    assert shards == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]  # one per rank
    assert (run_dir / "export" / "model.safetensors").stat().st_size > 1e6
    assert_same_weights(run_dir, reference, atol=2e-5)

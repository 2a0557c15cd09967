"""`heed train` on the Selective Attention config, shrunk: SFT with L_mem, GRPO whose rollouts evict under
per-layer KV budgets on vLLM (the plugin's Selective Attention path) while the trainer replays the same
evictions, and an export that carries its budgets and, served by `heed serve`, reproduces the run's own
final eval: the same completions, and in each response's `heed` record what every layer read under its
budget."""

import json
import os
import re
import subprocess
import sys

import pytest

from rl.cli import main
from tests.rl.jobs import ROOT
from tests.rl.test_train_e2e import OVERRIDES, train_job

pytestmark = pytest.mark.slow

# fixed budgets (the config searches its own); every prompt here is longer than each
BUDGETS = [256, 192, 128, 192]
FIXED = [f"selective.budgets=[{', '.join(map(str, BUDGETS))}]", "selective.search_budgets=false",
         "selective.grpo_budget_scale=1.0", "selective.search_after_grpo=false"]  # fmt: skip
# the config's base and its fade-in of the selection, over these runs' two SFT steps
FADE_IN = ["selective.selection_from_step=1", "selective.selection_ramp_steps=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """This file's two runs, started together: the one with the config's budgets (``run_dir``) and the one
    that searches its own (``searched``)."""
    base = tmp_path_factory.mktemp("e2e")
    jobs = {
        "selective": train_job(
            base / "selective", "configs/tiny-selective.yaml", *OVERRIDES, *FIXED, *FADE_IN, "sft.max_steps=2",
            "sft.logging_steps=1", "eval.before_training=false", "eval.after_sft=false", "eval.modes=[da]",
        ),
        "searched": train_job(
            base / "searched", "configs/tiny-selective.yaml", *OVERRIDES, *FADE_IN, "sft.max_steps=2",
            "grpo.max_steps=1", "eval.before_training=false", "eval.modes=[da]",
            "data.build.splits={train: 16, validation: 2, test: 2}", "selective.budgets=null",
            "selective.search_budgets=true", "selective.search_examples=2", "selective.search_step=300",
            "selective.search_min_step=null", "selective.grpo_budget_scale=0.5",
            # the gold traces' loss: a 2-step policy answers nothing at any budget, so the config's accuracy
            # judge would take every layer to the floor (heed budgets --judge accuracy is tested below)
            "selective.search_judge=loss", "selective.search_tolerance=0.0", "selective.search_after_grpo=true",
        ),
    }  # fmt: skip

    def finished(name: str):
        jobs[name].output()
        return base / name

    yield finished
    for job in jobs.values():
        job.kill()


@pytest.fixture(scope="module")
def run_dir(runs):
    return runs("selective")


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
        assert per_layer[2] < per_layer[0]  # budgets 128 vs 256: every prompt is longer than both
        assert row["kv/tokens_da"] < row["kv/tokens_vanilla"]


def test_the_served_export_reproduces_the_final_eval_and_reports_each_layers_reads(run_dir, tmp_path):
    """`heed serve` of the export, the test split's rows sent as the final eval sent them (server-side
    layout, `da`, greedy, its max tokens): the completions' lengths and the KV they read sum to the eval's
    (which counted the rollout engine's per-layer reads), and each layer's peak is within its budget."""
    import datasets
    import numpy as np
    import openai

    from tests.rl.test_serve import _start_server, _stop, _wait_healthy

    export = run_dir / "export"
    assert json.loads((export / "heed.json").read_text())["selective_budgets"] == BUDGETS
    config = json.loads((export / "config.json").read_text())
    assert config["selective_attention"] is True and config["selective_budgets"] == BUDGETS
    rows = list(datasets.load_from_disk(str(run_dir / "data"))["test"])
    server = _start_server(export, tmp_path / "server.log")
    try:
        _wait_healthy(server)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        records = []
        for row in rows:
            xargs = {
                "heed_question": row["question"],
                "heed_documents": list(row["documents"]),
                "heed_mode": "da",
            }
            response = client.completions.create(
                model=server.model, prompt="", max_tokens=24, temperature=0.0, extra_body={"vllm_xargs": xargs}
            )  # fmt: skip
            records.append(response.model_dump()["heed"])
    finally:
        _stop(server.proc)
    final = [r for r in json.loads((run_dir / "eval/grpo.json").read_text())["results"] if r["mode"] == "da"]
    assert sum(r["n"] for r in final) == len(records)
    assert sum(h["completion_tokens"] for h in records) == round(
        sum(r["decode_steps"] * r["n"] for r in final)
    )
    served_reads = sum(np.mean(h["kv_tokens_per_layer"]) for h in records)  # the mean over layers, as eval
    assert served_reads == pytest.approx(sum(r["kv_tokens_per_example"] * r["n"] for r in final), rel=1e-9)
    served = np.array([h["kv_tokens_per_layer"] for h in records])  # [examples, L]: each layer's own sum
    assert served.sum(0).tolist() == np.sum([r["kv_tokens_per_layer"] for r in final], axis=0).tolist()
    peaks = np.array([h["kv_peak_per_layer"] for h in records]).max(0)
    assert peaks.tolist() == np.max([r["kv_peak_per_layer"] for r in final], axis=0).tolist()
    for h in records:
        assert all(0 < peak <= budget for peak, budget in zip(h["kv_peak_per_layer"], BUDGETS, strict=True))
        assert h["kv_peak_per_layer"][2] < h["kv_peak_per_layer"][0]  # budgets 128 vs 256: prompts are longer
        assert h["kv_tokens"] < h["kv_tokens_vanilla"]


def test_heed_budgets_searches_the_exports_budgets_and_writes_them(run_dir, tmp_path, capsys):
    """`heed budgets` on a copy of the export: the greedy search on gold completions under the DA mask ends
    within its target and stores its budgets where the engines and `heed eval` read them. (The command's
    entry point, called in this process: a subprocess would spend seconds importing torch again.)"""
    import shutil

    export = tmp_path / "export"
    shutil.copytree(run_dir / "export", export)
    status = main(["budgets", str(export), "--data", str(run_dir / "data"), "--split", "test", "--examples", "2",
                   "--step", "300", "--write"])  # fmt: skip
    out = capsys.readouterr()
    assert status == 0, out.err[-4000:]
    found = json.loads((export / "heed.json").read_text())["selective_budgets"]
    assert json.loads((export / "config.json").read_text())["selective_budgets"] == found
    assert f"budgets {found}" in out.out and len(found) == 4
    assert all(b >= 2 for b in found)
    loss, target = map(float, re.search(r"loss ([\d.]+) <= target ([\d.]+)", out.out).groups())
    assert loss <= target


def test_heed_budgets_judged_by_accuracy_keeps_the_policys_answers(run_dir, tmp_path, capsys):
    """`heed budgets --judge accuracy`: the policy's own greedy answers decide, and every accepted reduction
    keeps the accuracy at or above the full cache's minus the tolerance."""
    import shutil

    export = tmp_path / "export"
    shutil.copytree(run_dir / "export", export)
    status = main(["budgets", str(export), "--data", str(run_dir / "data"), "--split", "test", "--examples", "2",
                   "--step", "300", "--max-tokens", "24", "--judge", "accuracy", "--tolerance", "0.5",
                   "--write"])  # fmt: skip
    out = capsys.readouterr()
    assert status == 0, out.err[-4000:]
    context, full = re.search(r"full cache \((\d+) tokens a layer\)  accuracy ([\d.]+)", out.out).groups()
    assert 400 < int(context) < 700  # prompts are ~450 tokens, plus 24 generated
    found = json.loads((export / "heed.json").read_text())["selective_budgets"]
    accuracy, target = map(float, re.search(r"greedy accuracy ([\d.]+) >= target ([\d.]+)", out.out).groups())
    assert f"budgets {found}" in out.out and all(2 <= b < int(context) for b in found)
    assert target == pytest.approx(max(0.0, float(full) - 0.5), abs=1e-4) and accuracy >= target
    accepted = [float(a) for a in re.findall(r"\]  accuracy ([\d.]+)", out.out)]
    assert accepted and all(a >= target for a in accepted)


# -- budgets found by the run itself (selective.search_budgets) ------------------------------------------


@pytest.fixture(scope="module")
def searched(runs):
    return runs("searched")


def halved(budgets):
    """``selective.grpo_budget_scale=0.5`` by hand: half of each budget, rounded down, at least 2."""
    return [max(2, b // 2) for b in budgets]


def test_the_budget_search_runs_after_sft_and_grpo_trains_under_its_scaled_budgets(searched):
    state = json.loads((searched / "state.json").read_text())
    assert state["completed"] == [
        "sft", "budget_search", "eval_sft", "grpo_budgets", "grpo", "final_budget_search", "eval_grpo", "export",
        "report",
    ]  # fmt: skip
    search = json.loads((searched / "budget_search" / "search.json").read_text())
    found = search["budgets"]
    assert state["budgets"] == found and len(found) == 4 and all(b >= 2 for b in found)
    assert search["loss"] <= search["target"]
    # each accepted step took 300 tokens from one layer (the last one down to 2), and some were accepted
    context = search["context"]
    assert 400 < context < 700  # prompts are ~450 tokens, plus the gold completion
    assert all(b == 2 or (context - b) % 300 == 0 for b in found) and min(found) < context
    (row,) = [r for r in metrics_rows(searched) if r["phase"] == "budget_search"]
    assert row["mean_budget"] == sum(found) / 4 and row["budget/layer_02"] == found[2]
    # the searched policy is a checkpoint of its own, carrying its budgets (a resume starts from it) ...
    budget_dir = json.loads((searched / "budget_search" / "config.json").read_text())
    assert budget_dir["selective_budgets"] == found
    # ... GRPO's are half of them, saved with the policy GRPO starts from ...
    tight = halved(found)
    assert state["grpo_budgets"] == tight and tight != found
    assert json.loads((searched / "grpo_budgets" / "config.json").read_text())["selective_budgets"] == tight
    # ... the rollouts evicted under those and the trainer replayed the same evictions ...
    (grpo,) = [r for r in metrics_rows(searched) if r["phase"] == "grpo" and "loss" in r]
    assert grpo["sampling/sampling_logp_difference/max"] < 1e-4
    steps = grpo["decode/steps"] * grpo["rollouts/count"]
    per_layer = [grpo[f"kv/tokens_da/layer_{layer:02d}"] for layer in range(4)]
    assert all(0 < read <= budget * steps for read, budget in zip(per_layer, tight))
    # ... and the run's config still says "search"
    assert "search_budgets: true" in (searched / "config.yaml").read_text()


def test_the_search_after_grpo_gives_the_final_eval_and_the_export_the_grpo_policys_budgets(searched):
    """`selective.search_after_grpo`: the same search, from the full cache, for the policy GRPO trained; saved
    with it in final/, logged beside the SFT policy's, and what the final eval and the export carry."""
    state = json.loads((searched / "state.json").read_text())
    search = json.loads((searched / "final" / "search.json").read_text())
    final = search["budgets"]
    assert state["final_budgets"] == final and len(final) == 4 and search["loss"] <= search["target"]
    sft_search = json.loads((searched / "budget_search" / "search.json").read_text())
    assert search["context"] == sft_search["context"]  # the same rows: the same full cache
    assert json.loads((searched / "final" / "config.json").read_text())["selective_budgets"] == final
    (row,) = [r for r in metrics_rows(searched) if r["phase"] == "final_budget_search"]
    sft_mean = sum(state["budgets"]) / 4
    assert row["mean_budget"] == sum(final) / 4
    assert row["mean_budget_vs_sft"] == pytest.approx(sum(final) / 4 / sft_mean)
    assert json.loads((searched / "export" / "heed.json").read_text())["selective_budgets"] == final
    # the final eval evicted under them: no layer held more than its budget at any decode step
    results = json.loads((searched / "eval" / "grpo.json").read_text())["results"]
    peaks = [r["kv_peak_per_layer"] for r in results if r["mode"] == "da"]  # one per task and length
    assert peaks and all(0 < p <= b for peak in peaks for p, b in zip(peak, final, strict=True))


def test_a_resume_after_the_search_keeps_its_budgets(searched, tmp_path):
    """Interrupted after the search (its phase done, GRPO not started): the resumed run skips the search,
    loads the searched policy, scales the budgets state.json kept, and trains, rolls out and exports
    under those."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(searched, run_dir)
    state = json.loads((run_dir / "state.json").read_text())
    state["completed"] = ["sft", "budget_search", "eval_sft"]
    for phase in ("grpo_budgets", "grpo", "eval_grpo", "export", "report"):
        state["wall_s"].pop(phase, None)
    del state["grpo_budgets"], state["final_budgets"]  # what the phases after the search recorded
    (run_dir / "state.json").write_text(json.dumps(state))
    for later in ("grpo_budgets", "final", "checkpoints", "export"):
        shutil.rmtree(run_dir / later, ignore_errors=True)
    search = (run_dir / "budget_search" / "search.json").read_text()
    grpo_rows = len([r for r in metrics_rows(run_dir) if r["phase"] == "grpo"])

    out = subprocess.run(
        [sys.executable, "-m", "rl.cli", "train", "--resume", str(run_dir)],
        cwd=ROOT, env=os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "offline"},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    assert "budget_search: done earlier, skipped" in out.stdout
    resumed = json.loads((run_dir / "state.json").read_text())
    found = state["budgets"]
    assert resumed["budgets"] == found and resumed["grpo_budgets"] == halved(found)
    assert resumed["completed"][-6:] == ["grpo_budgets", "grpo", "final_budget_search", "eval_grpo", "export",
                                         "report"]  # fmt: skip
    assert resumed["wall_s"]["budget_search"] == state["wall_s"]["budget_search"]  # not searched again
    assert (run_dir / "budget_search" / "search.json").read_text() == search
    rows = [r for r in metrics_rows(run_dir) if r["phase"] == "grpo"]
    (grpo,) = [r for r in rows[grpo_rows:] if "loss" in r]  # the resumed run's one step
    assert grpo["sampling/sampling_logp_difference/max"] < 1e-4  # the trainer replayed the same evictions
    steps = grpo["decode/steps"] * grpo["rollouts/count"]
    tight = halved(found)
    assert all(grpo[f"kv/tokens_da/layer_{layer:02d}"] <= b * steps for layer, b in enumerate(tight))
    # the resumed GRPO policy's own search, saved with it and exported
    final = resumed["final_budgets"]
    assert json.loads((run_dir / "final" / "config.json").read_text())["selective_budgets"] == final
    assert json.loads((run_dir / "export" / "heed.json").read_text())["selective_budgets"] == final


def metrics_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

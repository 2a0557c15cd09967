"""The HTML report of a real tiny run: every chart present with data equal to the files' numbers."""

import html
import json
import re

import numpy as np
import pytest

from rl.dashboard import RunReader, RunWriter, render_report
from rl.dashboard.charts import STEP_CHARTS

from .conftest import figures, metrics_lines

NOT_IN_SAMPLE_RUN = {"importance_ratios", "kv_by_layer"}  # no policy (ratios), no eviction (layers)


def test_page_is_self_contained(report_page):
    _, page = report_page
    assert "Plotly" in page and len(page) > 1_000_000  # plotly.js is inline
    assert not re.search(
        r'<script[^>]+src=|<link[^>]+href=["\']https?:', page
    )  # nothing fetched at view time


def test_every_chart_is_present_with_data(report_page):
    _, page = report_page
    figs = figures(page)
    for name, _ in STEP_CHARTS:
        if name in NOT_IN_SAMPLE_RUN:
            assert name not in figs
            continue
        assert name in figs, f"chart {name} missing"
        traces = figs[name]["data"]
        assert traces and all(len(t.get("y") or t.get("z") or []) for t in traces), name
    assert re.search(r'id="charts-missing">Not logged in this run: importance_ratios\.', page)


def test_line_charts_equal_metrics_file(report_page, sample_run):
    """Every line drawn for a metric carries exactly the (step, value) pairs of metrics.jsonl."""
    lines = metrics_lines(sample_run)
    checked = 0
    for name, fig in figures(report_page[1]).items():
        for trace in fig["data"]:
            metric = trace.get("meta")
            if not metric or trace["type"] != "scatter":
                continue
            expected = [(row["step"], row[metric]) for row in lines if row.get(metric) is not None]
            assert list(zip(trace["x"], trace["y"], strict=True)) == expected, (name, metric)
            checked += 1
    assert checked >= 20


def test_mode_mix_by_length_is_the_latest_step(report_page, sample_run):
    last = metrics_lines(sample_run)[-1]
    bars = {
        t["name"]: dict(zip(t["x"], t["y"], strict=True))
        for t in figures(report_page[1])["mode_mix_by_length"]["data"]
    }
    keys = [k for k in last if k.startswith("mode_mix/by_length/")]
    assert keys
    for key in keys:
        label, mode = key.removeprefix("mode_mix/by_length/").rsplit("/", 1)
        assert bars[mode][label] == last[key]


def test_eval_table_equals_eval_file(report_page, sample_run):
    page = report_page[1]
    results = json.loads((sample_run / "eval" / "gold_traces.json").read_text())["results"]
    assert {r["mode"] for r in results} == {"da", "da-nm", "vanilla"}
    for r in results:
        row = re.search(
            rf'<tr data-task="{r["task"]}" data-bin="{re.escape(html.escape(r["length_bin"]))}">(.*?)</tr>',
            page,
        ).group(1)
        acc = re.search(rf'data-mode="{r["mode"]}" data-field="accuracy">([^<]*)<', row).group(1)
        kv = re.search(rf'data-mode="{r["mode"]}" data-field="kv_tokens">([^<]*)<', row).group(1)
        assert float(acc) == round(r["accuracy"], 3)
        assert int(kv.replace(",", "")) == r["kv_tokens"]


def test_attention_maps_match_recorded_kv_reads(report_page, sample_run):
    """Counting read blocks in each drawn map and applying the engine's seq_len rule gives back the
    per-step KV tokens recorded in the trajectory file."""
    page = report_page[1]
    records = {}
    for path in (sample_run / "trajectories").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records[record["id"]] = record
    drawn_ids = re.findall(r'<section class="trajectory" data-id="([^"]+)">', page)
    maps = {n: f for n, f in figures(page).items() if n.startswith("attention_map_")}
    assert len(drawn_ids) == len(maps) >= 2
    for index, record_id in enumerate(drawn_ids):
        record = records[record_id]
        strip, blocks = maps[f"attention_map_{index}"]["data"][:2]
        cells = np.array(blocks["z"]).T  # [steps, blocks]; 0 = masked
        bs, prompt_len = record["layout"]["block_size"], record["layout"]["prompt_len"]
        positions = prompt_len - 1 + np.arange(cells.shape[0])
        implied = ((cells > 0).sum(axis=1) - 1) * bs + positions % bs + 1
        assert implied.tolist() == record["kv_tokens"]
        # the mode strip: one mode per step, the recorded state each token was predicted under
        assert strip["customdata"][0] == [record["states"][i]["mode"] for i in record["predicted_state"]]
        # a focus step reads no block of an unlisted chunk; a local step reads no chunk block at all
        spans = record["layout"]["chunk_spans"]
        for j, state_index in enumerate(record["predicted_state"]):
            state = record["states"][state_index]
            for chunk_id, (start, end) in enumerate(spans, start=1):
                read = cells[j, start // bs : end // bs] > 0
                expected = state["mode"] == "global" or chunk_id in state["chunks"]
                assert read.all() if expected else not read.any()


def test_samples_table_mode_mix_is_hand_counted(report_page, sample_run):
    """Each row's mode shares, counted here from the record's states and predicted_state."""
    page = report_page[1]
    records = [
        json.loads(x) for x in (sample_run / "trajectories" / "samples.jsonl").read_text().splitlines()
    ]
    last = max(r["step"] for r in records)
    latest = [r for r in records if r["step"] == last]
    for record in latest:
        row = re.search(rf'<tr data-id="{record["id"]}">(.*?)</tr>', page).group(1)
        modes = [record["states"][i]["mode"] for i in record["predicted_state"]]
        shown = re.findall(r'<span class="mode-(\w+)">(\d+)%</span>', row)
        assert shown == [
            (m, str(round(100 * modes.count(m) / len(modes)))) for m in ("global", "focus", "local", "index")
        ]


def test_eval_chart_sums_the_eval_file(report_page, sample_run):
    results = json.loads((sample_run / "eval" / "gold_traces.json").read_text())["results"]
    accuracy, kv, steps = figures(report_page[1])["eval_comparison"]["data"]
    for mode, acc, tokens, mean_steps in zip(accuracy["x"], accuracy["y"], kv["y"], steps["y"], strict=True):
        rows = [r for r in results if r["mode"] == mode]
        n = sum(r["n"] for r in rows)
        assert tokens == sum(r["kv_tokens"] for r in rows)
        assert acc == pytest.approx(sum(r["accuracy"] * r["n"] for r in rows) / n)
        assert mean_steps == pytest.approx(sum(r["decode_steps"] * r["n"] for r in rows) / n)
    da, vanilla = steps["y"][0], steps["y"][2]
    assert da > vanilla  # the gold traces' mode tags are extra steps; vanilla traces have none
    assert accuracy["x"] == ["da", "da-nm", "vanilla"]


def test_eviction_run_draws_per_layer_reads(tmp_path):
    """A run whose rollouts evicted per layer (step_metrics' ``kv/tokens_da/layer_NN``) gets one line
    per layer with the logged numbers; a run without them does not list the chart as missing."""
    writer = RunWriter(tmp_path)
    logged = {0: [900, 400], 1: [880, 310]}
    for step, (layer0, layer1) in logged.items():
        writer.log_metrics(step, "grpo", {"kv/tokens_da/layer_00": layer0, "kv/tokens_da/layer_01": layer1})
    page = render_report(RunReader(tmp_path).read())
    lines = {t["name"]: t["y"] for t in figures(page)["kv_by_layer"]["data"]}
    assert lines == {"layer_00": [900, 880], "layer_01": [400, 310]}
    assert "kv_by_layer" not in re.search(r'id="charts-missing">([^<]*)<', page).group(1)

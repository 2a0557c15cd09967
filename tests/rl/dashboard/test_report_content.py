"""The HTML report of a real tiny run: every chart present with data equal to the files' numbers."""

import html
import json
import re
from collections import defaultdict

import numpy as np
import pytest

from rl.dashboard import RunReader, RunWriter, render_report
from rl.dashboard.charts import STEP_CHARTS
from rollouts.protocol import MODE_BY_NAME

from .conftest import debiased_ema, figures, metrics_lines

NOT_IN_SAMPLE_RUN = {"importance_ratios", "kv_by_layer"}  # no policy (ratios), no eviction (layers)
NOT_OVER_STEPS = {"mode_mix_by_length", "eval_comparison"}  # bars: the latest step, the eval files


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
    lines = {t["name"]: t["y"] for t in figures(page)["kv_by_layer"]["data"] if t.get("meta")}
    assert lines == {"layer_00": [900, 880], "layer_01": [400, 310]}
    assert "kv_by_layer" not in re.search(r'id="charts-missing">([^<]*)<', page).group(1)


def sample_records(run_dir) -> list[dict]:
    """Every trajectory of the sample run (it records its whole batch at every step)."""
    return [json.loads(x) for x in (run_dir / "trajectories" / "samples.jsonl").read_text().splitlines()]


def series_pairs(fig: dict) -> dict[str, tuple[dict, dict]]:
    """Legend name -> (faint logged trace, smoothed trace), paired by their shared legendgroup."""
    groups = defaultdict(list)
    for trace in fig["data"]:
        if trace["type"] == "scatter" and trace.get("legendgroup"):
            groups[trace["legendgroup"]].append(trace)
    pairs = {}
    for group, traces in groups.items():
        assert len(traces) == 2, group
        raw, smoothed = sorted(traces, key=lambda t: t["mode"] != "lines+markers")
        pairs[smoothed["name"]] = (raw, smoothed)
    return pairs


def test_every_series_over_steps_has_a_smoothed_line_over_faint_points(report_page):
    """wandb / TensorBoard's convention: the logged values faint, their debiased EMA (weight 0.6) a
    solid line of the same color, one legend entry for both."""
    figs = figures(report_page[1])
    smoothed_charts = set()
    for name, fig in figs.items():
        for label, (raw, smoothed) in series_pairs(fig).items():
            assert raw["opacity"] == 0.3 and raw["showlegend"] is False and raw["name"] == label
            assert smoothed["mode"] == "lines" and "meta" not in smoothed and "opacity" not in smoothed
            assert smoothed["line"]["color"] == raw["line"]["color"]
            assert smoothed["x"] == raw["x"]
            assert smoothed["y"] == pytest.approx(debiased_ema(raw["y"]), rel=1e-12, abs=1e-12), (name, label)
            smoothed_charts.add(name)
    over_steps = {name for name, _ in STEP_CHARTS} - NOT_IN_SAMPLE_RUN - NOT_OVER_STEPS
    assert smoothed_charts == over_steps
    assert "(debiased exponential moving average, weight 0.6)" in report_page[1]


def test_reads_per_completion_chart_equals_the_trajectories(report_page, sample_run):
    """KV tokens read per completion, DA and vanilla, counted here from every recorded trajectory."""
    pairs = series_pairs(figures(report_page[1])["kv_per_completion"])
    assert sorted(pairs) == ["da", "vanilla"]
    by_step = defaultdict(list)
    for record in sample_records(sample_run):
        by_step[record["step"]].append(record)
    for label, field in (("da", "kv_tokens"), ("vanilla", "kv_tokens_vanilla")):
        raw, smoothed = pairs[label]
        expected = [sum(sum(r[field]) for r in by_step[s]) / len(by_step[s]) for s in sorted(by_step)]
        assert raw["meta"] == f"kv/tokens_{label}_per_completion"
        assert raw["x"] == sorted(by_step) and raw["y"] == pytest.approx(expected)
        assert smoothed["y"] == pytest.approx(debiased_ema(expected))
    da, vanilla = pairs["da"][0]["y"], pairs["vanilla"][0]["y"]
    assert all(d <= v for d, v in zip(da, vanilla, strict=True))  # the mask never reads more


def test_mode_mix_lines_equal_hand_counted_token_shares(report_page, sample_run):
    """One line per mode in its color (no stacking), each the share of the step's generated tokens
    predicted under that mode, counted here from the records; the smoothed shares still sum to 1."""
    fig = figures(report_page[1])["mode_mix"]
    pairs = series_pairs(fig)
    assert list(pairs) == ["global", "focus", "local", "index"]
    assert all("stackgroup" not in t for t in fig["data"])
    modes_by_step = defaultdict(list)
    for record in sample_records(sample_run):
        modes_by_step[record["step"]] += [record["states"][i]["mode"] for i in record["predicted_state"]]
    for mode, (raw, smoothed) in pairs.items():
        assert raw["line"]["color"] == MODE_BY_NAME[mode].color
        expected = [modes.count(mode) / len(modes) for _, modes in sorted(modes_by_step.items())]
        assert raw["y"] == pytest.approx(expected)
        assert smoothed["y"] == pytest.approx(debiased_ema(expected), abs=1e-12)
    totals = np.sum([smoothed["y"] for _, smoothed in pairs.values()], axis=0)
    assert totals == pytest.approx(np.ones(len(modes_by_step)))


def test_runs_before_the_per_completion_metric_get_it_from_batch_sums(tmp_path):
    """A GRPO run written before ``kv/tokens_*_per_completion`` was logged: the chart divides the batch
    sums by ``rollouts/count``, and marks the lines as derived (no ``meta``)."""
    writer = RunWriter(tmp_path)
    writer.log_metrics(0, "sft", {"loss": 2.0})
    logged = {1: (8000, 20000, 8), 2: (6000, 20000, 8), 3: (2500, 10000, 5)}  # da, vanilla, count
    for step, (da, vanilla, count) in logged.items():
        writer.log_metrics(
            step, "grpo", {"kv/tokens_da": da, "kv/tokens_vanilla": vanilla, "rollouts/count": count}
        )
    pairs = series_pairs(figures(render_report(RunReader(tmp_path).read()))["kv_per_completion"])
    raw, smoothed = pairs["da (grpo)"]
    assert raw["x"] == [1, 2, 3] and raw["y"] == [1000, 750, 500] and raw.get("meta") is None
    assert smoothed["y"] == pytest.approx([1000, 1000 - 250 * 0.4 / 0.64, debiased_ema([1000, 750, 500])[2]])
    assert pairs["vanilla (grpo)"][0]["y"] == [2500, 2500, 2000]

"""Empty, partial and corrupted run directories: the report renders what is valid, names what it skipped."""

import json

from rl.dashboard import RunReader, RunWriter, render_report

from .conftest import figures


def test_missing_and_empty_directories_render(tmp_path):
    missing = RunReader(tmp_path / "nope").read()
    assert [s.reason for s in missing.skipped] == ["run directory does not exist"]
    assert "run directory does not exist" in render_report(missing)
    empty = RunReader(tmp_path).read()
    page = render_report(empty)
    assert empty.skipped == [] and figures(page) == {}
    assert "no metric lines yet" in page and "No trajectories recorded yet" in page


def test_half_written_and_corrupted_lines_are_skipped_with_file_and_line(tmp_path):
    writer = RunWriter(tmp_path)
    for step in range(3):
        writer.log_metrics(step, "grpo", {"reward/total": step / 2, "is_ratio/mean": 1.0 + step / 100})
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(1, '{"step": 7, "phase": "grpo", "reward/tot\n')  # corrupted line 2
    lines.insert(2, "[1, 2]\n")  # valid JSON, not an object: line 3
    lines.insert(3, '{"step": "x", "phase": "grpo"}\n')  # no integer step: line 4
    path.write_text("".join(lines) + '{"step": 9, "phase": "grpo", "reward/total": 0.')  # half-written line 7
    run = RunReader(tmp_path).read()
    assert [row["step"] for row in run.metrics] == [0, 1, 2]
    skipped = {s.line: s.reason for s in run.skipped}
    assert set(skipped) == {2, 3, 4, 7}
    assert skipped[2].startswith("bad JSON") and "half-written" in skipped[7]
    page = render_report(run)
    for line in (2, 3, 4, 7):
        assert f"{path}:{line}:" in page
    drawn = figures(page)
    assert drawn["rewards"]["data"][0]["y"] == [0.0, 0.5, 1.0]
    assert drawn["importance_ratios"]["data"][0]["y"] == [1.0, 1.01, 1.02]


def test_bad_trajectory_and_eval_files(tmp_path):
    writer = RunWriter(tmp_path)
    writer.log_trajectories([{"id": "t0", "step": 0}])  # lacks the trace
    (tmp_path / "trajectories" / "samples.jsonl").open("a").write("not json\n")
    (tmp_path / "eval" / "broken.json").write_text('{"step": 1, "results": [')
    writer.write_eval(
        "ok", 2, [{"mode": "da", "task": "t", "length_bin": "<=1K", "n": 1, "accuracy": 0.5, "kv_tokens": 10}]
    )
    run = RunReader(tmp_path).read()
    assert run.trajectories == [] and list(run.evals) == ["ok"]
    reasons = sorted((s.path.rsplit("/", 1)[1], s.line) for s in run.skipped)
    assert reasons == [("broken.json", 0), ("samples.jsonl", 1), ("samples.jsonl", 2)]
    page = render_report(run)
    assert 'data-mode="da" data-field="accuracy">0.500<' in page


def test_writer_rejects_unknown_phase_and_reserved_names(tmp_path):
    writer = RunWriter(tmp_path)
    for phase, metrics in (("train", {}), ("grpo", {"step": 1})):
        try:
            writer.log_metrics(0, phase, metrics)
        except ValueError:
            continue
        raise AssertionError(f"accepted phase={phase!r} metrics={metrics!r}")
    writer.log_metrics(0, "sft", {"loss": float("nan")})
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["loss"] is None  # NaN is written as null


def test_wrong_types_inside_records_give_notes_not_errors(tmp_path):
    writer = RunWriter(tmp_path)
    writer.log_metrics(0, "grpo", {"mode_mix/by_length/huge/global": 0.5, "accuracy/by_length/huge": 1.0})
    bad = {"id": "t0", "step": 0, "layout": {"block_size": 32}, "kv_tokens": [1], "predicted_state": ["x"]}
    writer.log_trajectories([bad, {**bad, "id": "t1", "step": "3"}, {**bad, "id": "t2", "violations": [1]}])
    writer.write_eval("e", 0, [{"mode": "da", "task": "t", "length_bin": "b", "accuracy": None}, "junk"])
    run = RunReader(tmp_path).read()
    assert [t["id"] for t in run.trajectories] == ["t0", "t2"]
    assert [s.line for s in run.skipped] == [2, 0]  # t1's step type; the eval's non-object row
    page = render_report(run, trajectory_ids=["t0", "t2"])
    assert "No attention map: the record is inconsistent" in page  # t0: no chunk_spans
    assert "Trajectory t2 could not be drawn" in page  # a violation that is not an object
    assert figures(page)["mode_mix_by_length"]["data"][0]["x"] == ["huge"]  # an unknown bin label is kept
    assert 'data-mode="da" data-field="accuracy">–<' in page


def test_a_resumed_run_counts_each_step_once_with_its_latest_value(tmp_path):
    writer = RunWriter(tmp_path)
    for step, value in ((0, 0.1), (1, 0.2), (2, 0.3), (1, 0.25), (2, 0.35), (3, 0.4)):  # resumed at step 1
        writer.log_metrics(step, "grpo", {"reward/total": value})
    writer.log_metrics(0, "eval", {"reward/total": 9.0})  # another phase's step 0 is its own point
    run = RunReader(tmp_path).read()
    assert run.series("reward/total", "grpo") == ([0, 1, 2, 3], [0.1, 0.25, 0.35, 0.4])
    assert run.series("reward/total") == ([0, 1, 2, 3, 0], [0.1, 0.25, 0.35, 0.4, 9.0])

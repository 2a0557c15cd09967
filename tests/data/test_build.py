"""`heed data build`: a loadable DatasetDict with a card, identical bytes for a seed, no leakage,
validated configs, and nothing half-written when something fails."""

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from datasets import load_from_disk

from data.build import build_dataset
from data.config import load_config, parse_config
from data.schema import FEATURES, DataError, Example
from rl.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = [
    "niah_single",
    {"name": "niah_multikey", "params": {"num_distractors": 2}},
    "niah_multivalue",
    "niah_multiquery",
    "variable_tracking",
    "multi_span",
    "aggregation_cwe",
    "aggregation_fwe",
    {"name": "variable_assignment", "params": {"num_assignments": 8}},
]
SMALL = {
    "seed": 7,
    "chunk_tokens": 64,
    "lengths": [300],
    "splits": {"train": 4, "validation": 2, "test": 2},
    "ood_examples": 2,
    "tasks": TASKS,
    "imports": [{"source": "longbench", "path": str(FIXTURES / "longbench/hotpotqa.jsonl"), "split": "test"}],
}


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "ds"
    build_dataset(parse_config(SMALL), out, tokenizer=tokenizer)
    return out


def test_build_writes_a_loadable_dataset_dict_with_card_and_ood_split(built):
    ds = load_from_disk(str(built))
    assert list(ds) == ["train", "validation", "test", "ood"]
    # 8 length-targeted tasks x 1 length, plus variable_assignment (its own length), plus 2 imported rows
    assert len(ds["train"]) == 8 * 4 + 4 and len(ds["test"]) == 8 * 2 + 2 + 2
    assert set(ds["ood"]["task"]) == {"variable_assignment"}
    for split in ds.values():
        assert split.features == FEATURES
        for row in split:
            Example(**row).validate()
    card = (built / "README.md").read_text()
    assert "| ood | 2 |" in card and "evidence_chunks" in card
    assert yaml.safe_load((built / "heed_data_config.yaml").read_text())["seed"] == 7


def test_same_seed_gives_identical_bytes(built, tokenizer, tmp_path):
    build_dataset(parse_config(SMALL), tmp_path / "again", tokenizer=tokenizer)
    assert tree_digest(tmp_path / "again") == tree_digest(built)
    build_dataset(parse_config({**SMALL, "seed": 8}), tmp_path / "other", tokenizer=tokenizer)
    assert tree_digest(tmp_path / "other") != tree_digest(built)


def test_no_needle_or_question_is_shared_across_splits(built):
    ds = load_from_disk(str(built))
    content = {}
    for name, split in ds.items():
        keys = set()
        for row in split:
            if row["needles"] and row["task"] != "variable_assignment":
                keys |= {row["question"], *row["needles"]}
            else:  # the question is fixed by the task (aggregation, x=?): the whole example must differ
                keys.add(json.dumps([row["question"], row["documents"]]))
        content[name] = keys
    names = list(content)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not content[a] & content[b], (a, b)
    ids = [i for split in ds.values() for i in split["id"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"chunk_size": 64}, r"unknown key chunk_size"),
        ({"tasks": ["niah_hard"]}, r"tasks\[0\]: unknown task 'niah_hard'"),
        (
            {"tasks": [{"name": "niah_single", "params": {"values": 2}}]},
            r"tasks\[0\]: task niah_single: unknown params \['values'\]",
        ),
        (
            {"tasks": [{"name": "niah_single", "params": {"num_values": "2"}}]},
            r"params.num_values='2' must be of type int",
        ),
        (
            {"tasks": [{"name": "multi_span", "params": {"kinds": ["sum"]}}]},
            r"params.kinds=\['sum'\] is invalid",
        ),
        ({"tasks": [{"name": "niah_single", "lenghts": [10]}]}, r"unknown key tasks\[0\].lenghts"),
        ({"tasks": ["niah_single", "niah_single"]}, r"tasks\[1\].name niah_single is listed twice"),
        ({"lengths": [0]}, r"lengths must be a non-empty list of positive integers"),
        ({"splits": {"dev": 3}}, r"splits.dev is not a split"),
        ({"imports": [{"source": "scrolls", "path": "x"}]}, r"imports\[0\].source 'scrolls' is not one of"),
        ({"imports": [{"path": "x"}]}, r"imports\[0\]: missing key 'source'"),
        ({"tasks": [], "imports": []}, r"generates nothing"),
    ],
)
def test_bad_configs_name_the_key(change, message):
    with pytest.raises(DataError, match=message):
        parse_config({**SMALL, **change})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tasks": ["niah_multiquery"], "lengths": [60], "imports": []}, r"target_tokens=60 is too short"),
        ({"imports": [{"source": "ruler", "path": "BAD"}]}, r"bad\.jsonl:2: invalid JSON"),
    ],
)
def test_failed_build_leaves_nothing_behind(tokenizer, tmp_path, change, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "a\\nb\\nc", "outputs": ["1"]}\n{"input": \n')
    config = {**SMALL, **change}
    config["imports"] = [
        {**imp, "path": str(bad)} if imp["path"] == "BAD" else imp for imp in config["imports"]
    ]
    out = tmp_path / "out"
    with pytest.raises(DataError, match=message):
        build_dataset(parse_config(config), out, tokenizer=tokenizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_a_failure_while_writing_leaves_the_previous_dataset_in_place(built, tokenizer, monkeypatch):
    before = tree_digest(built)

    def broken_card(*args):
        raise OSError("disk full")

    monkeypatch.setattr("data.build.dataset_card", broken_card)
    with pytest.raises(OSError, match="disk full"):
        build_dataset(parse_config({**SMALL, "seed": 9}), built, overwrite=True, tokenizer=tokenizer)
    assert tree_digest(built) == before
    assert sorted(p.name for p in built.parent.iterdir()) == [built.name]


def test_existing_output_needs_overwrite(built, tokenizer):
    with pytest.raises(DataError, match="already exists; pass --overwrite"):
        build_dataset(parse_config(SMALL), built, tokenizer=tokenizer)


def test_cli_builds_from_yaml_with_relative_import_paths_and_reports_errors(tmp_path, capsys):
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    (fixtures / "zs.jsonl").write_text((FIXTURES / "zeroscrolls/qasper/validation.jsonl").read_text())
    config = {
        **SMALL,
        "tasks": ["niah_single"],
        "imports": [{"source": "zeroscrolls", "path": "fixtures/zs.jsonl"}],
    }
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(config))
    assert load_config(tmp_path / "data.yaml").imports[0].path == str(fixtures / "zs.jsonl")
    out = tmp_path / "out"
    assert (
        main(["data", "build", "--config", str(tmp_path / "data.yaml"), "--out", str(out), "--no-progress"])
        == 0
    )
    assert set(load_from_disk(str(out))["test"]["source"]) == {"synthetic", "zeroscrolls"}
    assert main(["data", "build", "--config", str(tmp_path / "data.yaml"), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("seed: 1\ntasks: [niah_single]\nchunk_tokns: 64\n")
    assert main(["data", "build", "--config", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "x")]) == 2
    assert "bad.yaml: unknown key chunk_tokns" in capsys.readouterr().err


def test_tokenizer_can_be_a_saved_folder_and_a_bad_one_is_named(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    config = parse_config(
        {**SMALL, "tokenizer": str(tmp_path / "tok"), "tasks": ["niah_single"], "imports": []}
    )
    ds = build_dataset(config, tmp_path / "out")
    row = ds["train"][0]
    assert row["context_tokens"] == sum(
        len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in row["documents"]
    )
    with pytest.raises(DataError, match=r"tokenizer '.*missing' cannot be loaded"):
        build_dataset(parse_config({**SMALL, "tokenizer": str(tmp_path / "missing")}), tmp_path / "out2")

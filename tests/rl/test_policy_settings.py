"""What a model folder says about how to prompt it (rl/policy_settings.py): heed.json, a run's config.yaml,
and LayoutSettings' record, the one serialiser both are written and read with."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl.policy_settings import SettingsError, checkpoint_settings, layout_settings, run_settings
from rollouts.protocol import PROTOCOL_VERSIONS, LayoutError, LayoutSettings
from rollouts.protocol.layout import LAYOUT_STYLES

settings = st.builds(
    LayoutSettings,
    block_size=st.integers(1, 4096),
    thinking=st.booleans(),
    style=st.sampled_from(LAYOUT_STYLES),
    instructions=st.booleans(),
    index_entry_tokens=st.just(0) | st.integers(1, 64),
    protocol_version=st.sampled_from([v for v in PROTOCOL_VERSIONS if v >= 3]),
)


@given(settings)
def test_a_record_reads_back_as_the_settings_it_was_written_from(layout):
    record = layout.to_record()
    assert set(record) == {  # the keys heed.json and the run config's run: section spell
        "block_size", "thinking", "layout_style", "instructions", "index_entry_tokens", "protocol_version"
    }  # fmt: skip
    assert record["layout_style"] == layout.style
    assert LayoutSettings.from_record(json.loads(json.dumps(record))) == layout  # through heed.json's JSON


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("block_size", 0, "run.block_size must be a positive integer, got 0"),
        ("block_size", True, "run.block_size must be a positive integer, got True"),  # YAML's true is no size
        ("thinking", "yes", "run.thinking must be true or false, got 'yes'"),
        ("layout_style", "fancy", "run.layout_style must be one of auto, tool, plain, compact, got 'fancy'"),
        ("instructions", 1, "run.instructions must be true or false, got 1"),
        ("index_entry_tokens", -1, "run.index_entry_tokens must be an integer >= 0, got -1"),
        ("protocol_version", 7, r"run.protocol_version must be one of \(1, 2, 3, 4, 5\)"),
    ],
)
def test_a_bad_record_value_names_its_key_and_source(key, value, message):
    record = {**LayoutSettings().to_record(), key: value}
    with pytest.raises(LayoutError, match=rf"^cfg\.yaml: {message}"):
        LayoutSettings.from_record(record, source="cfg.yaml", prefix="run.")


def test_required_keys_and_a_record_the_settings_cannot_hold():
    with pytest.raises(LayoutError, match=r"^x: run\.block_size, run\.thinking missing$"):
        LayoutSettings.from_record({}, source="x", prefix="run.", required=("block_size", "thinking"))
    # each value is fine alone
    with pytest.raises(LayoutError, match=r"^x: an index needs DA protocol version 3"):
        LayoutSettings.from_record({"index_entry_tokens": 8, "protocol_version": 2}, source="x")
    assert LayoutSettings.from_record({"other": 1}) == LayoutSettings()  # keys it does not own: ignored


def test_vanilla_is_laid_out_without_the_instructions():
    layout = LayoutSettings(style="compact")
    assert layout.for_mode("da") == layout.for_mode("da-nm") == layout
    assert layout.for_mode("vanilla") == LayoutSettings(style="compact", instructions=False)


def test_run_settings_read_the_run_config_as_its_export_writes_it(tmp_path):
    import yaml

    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "run": {"block_size": 64, "thinking": True, "layout_style": "plain", "seed": 3},
                "selective": {"budgets": [8, 4]},
            }
        )
    )
    assert run_settings(tmp_path) == {
        **LayoutSettings(block_size=64, thinking=True, style="plain").to_record(),
        "selective_budgets": [8, 4],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"run": {"block_size": 64}}))
    with pytest.raises(SettingsError, match=r"config\.yaml: run\.thinking missing"):
        run_settings(tmp_path)


def test_layout_settings_come_from_heed_json(tmp_path):
    info = {"protocol_version": 3, "block_size": 64, "thinking": True, "layout_style": "compact",
            "instructions": False, "index_entry_tokens": 12}  # fmt: skip
    assert layout_settings(tmp_path, info) == LayoutSettings(
        block_size=64, thinking=True, style="compact", instructions=False, index_entry_tokens=12
    )
    assert layout_settings(tmp_path, None) == LayoutSettings()  # no heed.json: the defaults
    with pytest.raises(SettingsError, match="version 3"):  # an index the export's protocol cannot read
        layout_settings(tmp_path, {**info, "protocol_version": 2})
    with pytest.raises(SettingsError, match="block_size=64; drop the flag"):
        layout_settings(tmp_path, info, block_size=32)


def test_a_checkpoint_inside_a_run_is_laid_out_as_its_run_was(tmp_path):
    """A checkpoint with no heed.json that sits in a run directory (RUN_DIR/sft, RUN_DIR/checkpoints/
    checkpoint-N) takes the run's config.yaml, which its export would have written: a v4 compact run's
    SFT checkpoint is not evaluated as v3 with instructions. A model folder outside any run, or beside a
    config.yaml that is no run's, keeps the defaults; heed.json, where there is one, wins."""
    import yaml

    run = tmp_path / "run"
    sft, step = run / "sft", run / "checkpoints" / "checkpoint-10"
    for folder in (sft, step):
        folder.mkdir(parents=True)
    config = {"run": {"block_size": 32, "thinking": False, "protocol_version": 4, "layout_style": "compact",
                      "instructions": False}}  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert checkpoint_settings(sft) is None  # no state.json: not a run directory
    (run / "state.json").write_text("{}")
    expected = LayoutSettings(block_size=32, style="compact", instructions=False, protocol_version=4)
    for folder in (sft, step):
        info = checkpoint_settings(folder)
        assert info["settings_from"] == str((run / "config.yaml").resolve())
        assert layout_settings(folder, info) == expected
    with pytest.raises(SettingsError, match=r"config\.yaml says thinking=False; drop the flag"):
        layout_settings(sft, checkpoint_settings(sft), thinking=True)
    (sft / "heed.json").write_text(json.dumps({"protocol_version": 5, "block_size": 32, "thinking": False}))
    assert layout_settings(sft, checkpoint_settings(sft)).protocol_version == 5
    assert checkpoint_settings(tmp_path / "elsewhere") is None

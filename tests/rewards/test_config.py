"""RewardConfig: documented, validated, and errors that name the field to fix."""

import dataclasses

import pytest

from rewards.accuracy import GraderOptions
from rewards.config import RewardConfig
from rewards.efficiency import Roofline


def test_every_field_has_help_text():
    for f in dataclasses.fields(RewardConfig):
        assert len(f.metadata.get("help", "")) > 20, f.name


def test_defaults():
    config = RewardConfig()
    assert (
        config.accuracy_weight,
        config.efficiency_weight,
        config.compliance_weight,
        config.coverage_weight,
    ) == (
        1.0,
        0.5,
        0.25,
        0.25,
    )
    assert config.roofline == Roofline(8e12, 2.25e15, 0.4, 0.7)
    assert config.grader_options == GraderOptions()
    # the defaults that close the doors GRPO found (tests/rewards/test_reward_hacking.py)
    assert (config.strict_string_match, config.efficiency_reference, config.efficiency_reference_tokens) == (
        True,
        "budget",
        128,
    )
    assert config.efficiency_min_coverage == 1.0 and config.protocol_version == 3
    assert RewardConfig(strict_string_match=False).grader_options == GraderOptions(strict=False)


def test_roofline_and_grader_keys_are_their_owners_settings():
    # Such a key restates nothing: default, help and range come from the owner's field, and the owner is
    # built back from the keys; the type annotation, the one thing written twice, must agree.
    exposed = {f.name: f for f in dataclasses.fields(RewardConfig) if "exposes" in f.metadata}
    for key, f in exposed.items():
        owner, name = f.metadata["exposes"]
        (source,) = [s for s in dataclasses.fields(owner) if s.name == name]
        assert (f.type, f.default) == (source.type, source.default), key
        assert f.metadata["help"] == source.metadata["help"], key
        assert f.metadata["accepts"] is source.metadata["accepts"], key
    roofline = {f.name for f in dataclasses.fields(Roofline)}
    grader = {"numeric_rel_tol", "numeric_abs_tol", "answer_length_factor", "answer_length_slack"}
    assert set(exposed) == roofline | grader | {"strict_string_match", "math_timeout_s"}
    config = RewardConfig(mfu=0.5, answer_length_slack=8.0, strict_string_match=False)
    assert config.roofline == Roofline(mfu=0.5)
    assert config.grader_options == GraderOptions(length_slack=8, strict=False)
    assert type(config.grader_options.length_slack) is int


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("accuracy_weight", -1.0, "RewardConfig.accuracy_weight must be >= 0, got -1.0"),
        ("efficiency_weight", float("nan"), "RewardConfig.efficiency_weight must be a finite number"),
        ("coverage_weight", "0.5", "RewardConfig.coverage_weight must be a finite number, got '0.5'"),
        ("efficiency_min_accuracy", 1.5, "RewardConfig.efficiency_min_accuracy must be in [0, 1], got 1.5"),
        ("efficiency_min_coverage", -0.1, "RewardConfig.efficiency_min_coverage must be in [0, 1]"),
        (
            "efficiency_requires_compliance",
            1,
            "RewardConfig.efficiency_requires_compliance must be true or false",
        ),
        (
            "efficiency_unit",
            "joules",
            "RewardConfig.efficiency_unit must be one of ('tokens', 'bytes', 'time')",
        ),
        ("hbm_bandwidth", 0.0, "RewardConfig.hbm_bandwidth must be > 0, got 0.0"),
        ("mfu", 1.2, "RewardConfig.mfu must be in (0, 1], got 1.2"),
        ("mbu", 0.0, "RewardConfig.mbu must be in (0, 1], got 0.0"),
        ("numeric_rel_tol", -1e-6, "RewardConfig.numeric_rel_tol must be >= 0"),
        ("answer_length_factor", 0.5, "RewardConfig.answer_length_factor must be >= 1, got 0.5"),
        ("answer_length_slack", 2.5, "RewardConfig.answer_length_slack must be an integer, got 2.5"),
        ("math_timeout_s", True, "RewardConfig.math_timeout_s must be a finite number, got True"),
        ("thinking", "yes", "RewardConfig.thinking must be true or false, got 'yes'"),
        ("strict_string_match", "no", "RewardConfig.strict_string_match must be true or false"),
        (
            "efficiency_reference",
            "vanilla",
            "RewardConfig.efficiency_reference must be one of ('budget', 'completion'), got 'vanilla'",
        ),
        ("efficiency_reference_tokens", 0, "RewardConfig.efficiency_reference_tokens must be >= 1, got 0"),
        ("efficiency_reference_tokens", 64.5, "RewardConfig.efficiency_reference_tokens must be an integer"),
        ("protocol_version", 6, "RewardConfig.protocol_version must be one of (1, 2, 3, 4, 5), got 6"),
    ],
)
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError) as err:
        RewardConfig(**{field: value})
    assert str(err.value).startswith(message)


def test_from_dict_rejects_unknown_keys_with_a_suggestion():
    assert RewardConfig.from_dict({"mfu": 0.5, "efficiency_unit": "time"}) == RewardConfig(
        mfu=0.5, efficiency_unit="time"
    )
    with pytest.raises(ValueError, match="no field 'mbw' "):
        RewardConfig.from_dict({"mbw": 0.5})
    with pytest.raises(ValueError, match=r"did you mean 'efficiency_min_accuracy'\?"):
        RewardConfig.from_dict({"efficiency_min_acuracy": 0.5})

"""The composite reward over trajectories on the paper's Acme example, laid out as a real DA prompt."""

import dataclasses
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import DecodeCost, RewardConfig, score_trajectories, score_trajectory
from rewards.efficiency import KVReads, decode_seconds
from rollouts.masks import KVShape

from .helpers import ACME_GOLD, ACME_GOLD_TEXT, acme_example, make_trajectory, piece_ids, reference_reads


@pytest.fixture(scope="module")
def build(acme_layout, tokenizer, token_table):
    def build(completion, example=None, **fields):
        return make_trajectory(
            acme_layout,
            tokenizer,
            token_table,
            completion,
            acme_example() if example is None else example,
            **fields,
        )

    return build


# The paper's relative saving as the efficiency term: tests written for it say so.
RELATIVE = RewardConfig(efficiency_reference="completion")


@pytest.fixture(scope="module")
def gold_saving(acme_layout, tokenizer):
    read, vanilla = reference_reads(acme_layout, piece_ids(tokenizer, ACME_GOLD)[1])
    return 1 - read.sum() / vanilla.sum()


@pytest.fixture(scope="module")
def gold_efficiency(acme_layout, tokenizer):
    """The default efficiency of the gold trace, from the chunk spans: its reads against 128 vanilla steps."""
    read, _ = reference_reads(acme_layout, piece_ids(tokenizer, ACME_GOLD)[1])
    budget = sum(acme_layout.prompt_len + j for j in range(128))
    return 1 - read.sum() / budget


def test_acme_gold_earns_every_component(build, gold_saving):
    r = score_trajectory(build(ACME_GOLD), RELATIVE)
    assert (r.accuracy, r.compliance, r.coverage, r.reasons) == (1.0, 1.0, 1.0, ())
    assert r.efficiency == pytest.approx(gold_saving)
    assert r.kv_saving == pytest.approx(gold_saving)
    assert r.total == pytest.approx(1.0 + 0.5 * gold_saving + 0.25 + 0.25)


def test_acme_gold_efficiency_is_measured_against_the_budget_by_default(build, gold_saving, gold_efficiency):
    r = score_trajectory(build(ACME_GOLD))
    assert (r.accuracy, r.accuracy_ruler, r.compliance, r.coverage, r.reasons) == (1.0, 1.0, 1.0, 1.0, ())
    assert r.efficiency == pytest.approx(gold_efficiency)
    assert r.kv_saving == pytest.approx(gold_saving)  # what dashboards report does not change
    assert r.total == pytest.approx(1.0 + 0.5 * gold_efficiency + 0.25 + 0.25)
    shorter = score_trajectory(build(ACME_GOLD), RewardConfig(efficiency_reference_tokens=100))
    assert 0 < shorter.efficiency < r.efficiency  # a smaller budget: the same reads are a larger share


def test_a_budget_the_completion_overspends_pays_zero_not_less(build):
    r = score_trajectory(build(ACME_GOLD), RewardConfig(efficiency_reference_tokens=1))
    assert (r.efficiency, r.accuracy, r.compliance) == (0.0, 1.0, 1.0)


def test_budget_in_bytes_and_time_use_the_same_budget_steps(build):
    cost = DecodeCost(KVShape(num_layers=4, num_kv_heads=2, head_dim=32), query_heads=4, matmul_params=10**6)
    trajectory = build(ACME_GOLD)
    tokens = score_trajectory(trajectory).efficiency
    in_bytes = score_trajectory(trajectory, RewardConfig(efficiency_unit="bytes"), cost).efficiency
    assert in_bytes == pytest.approx(
        tokens
    )  # every layer keeps the same KV: bytes are tokens times a constant
    reads = KVReads.from_trajectory(trajectory)
    da, _ = decode_seconds(reads, cost)
    budget, _ = decode_seconds(KVReads.causal(trajectory.layout.prompt_len, 128), cost)
    timed = score_trajectory(trajectory, RewardConfig(efficiency_unit="time"), cost).efficiency
    assert timed == pytest.approx(1 - da / budget)


def test_weights_are_applied(build, gold_saving):
    config = RewardConfig(
        accuracy_weight=2.0,
        efficiency_weight=1.0,
        compliance_weight=0.0,
        coverage_weight=0.5,
        efficiency_reference="completion",
    )
    r = score_trajectory(build(ACME_GOLD), config)
    assert r.total == pytest.approx(2.0 + gold_saving + 0.5)


# -- what must score 0 --------------------------------------------------------------------------------


def test_answer_only_outside_the_answer_tag_earns_no_accuracy(build):
    text = ACME_GOLD_TEXT.replace("<answer>8 years</answer>", "The answer is 8 years.")
    r = score_trajectory(build(text))
    assert (r.accuracy, r.efficiency, r.compliance) == (0.0, 0.0, 0.0)
    assert "accuracy/no_answer" in r.reasons and "compliance/missing_answer" in r.reasons


def test_two_different_answers_earn_no_accuracy(build):
    r = score_trajectory(build(ACME_GOLD_TEXT + "<answer>9 years</answer>"))
    assert (r.accuracy, r.efficiency, r.compliance) == (0.0, 0.0, 0.0)
    assert "accuracy/multiple_answers" in r.reasons


def test_correct_answer_without_any_focus_earns_no_compliance_and_no_efficiency(build):
    r = score_trajectory(build("<local>Founded 2003, public 2011: 8 years.</local><answer>8 years</answer>"))
    assert r.accuracy == 1.0
    assert (r.compliance, r.coverage, r.efficiency) == (0.0, 0.0, 0.0)
    assert r.kv_saving > 0.3  # it did read little: the gate, not the measurement, withholds the reward
    assert r.total == 1.0
    assert r.reasons == ("compliance/no_focus", "efficiency/gated:compliance")


def test_global_only_trajectory_has_zero_efficiency(build):
    r = score_trajectory(
        build("<global>Founded 2003, public 2011: 8 years.</global><answer>8 years</answer>")
    )
    assert (r.kv_saving, r.efficiency) == (0.0, 0.0)


# -- gates --------------------------------------------------------------------------------------------


def test_wrong_answer_earns_no_efficiency_unless_the_gate_is_off(build, gold_saving):
    wrong = ACME_GOLD_TEXT.replace("8 years</answer>", "9 years</answer>")
    r = score_trajectory(build(wrong))
    assert (r.accuracy, r.efficiency, r.total) == (0.0, 0.0, 0.5)
    assert "efficiency/gated:accuracy" in r.reasons
    ungated = score_trajectory(
        build(wrong), RewardConfig(efficiency_min_accuracy=0.0, efficiency_reference="completion")
    )
    assert ungated.efficiency == pytest.approx(gold_saving)


def test_partial_credit_is_below_the_default_gate(build):
    example = acme_example(answers=["2003", "2011"], metric="string_match_all")
    r = score_trajectory(build(ACME_GOLD_TEXT.replace("8 years</answer>", "2003</answer>"), example))
    assert (r.accuracy, r.efficiency) == (0.5, 0.0)
    assert score_trajectory(build(ACME_GOLD_TEXT.replace("8 years<", "2003, 2011<"), example)).accuracy == 1.0


def test_compliance_gate_can_be_turned_off(build):
    text = "<local>Founded 2003, public 2011: 8 years.</local><answer>8 years</answer>"
    config = RewardConfig(
        efficiency_requires_compliance=False, efficiency_min_coverage=0.0, efficiency_reference="completion"
    )
    r = score_trajectory(build(text), config)
    assert r.efficiency == r.kv_saving > 0


def test_coverage_gate(build):
    text = ACME_GOLD_TEXT.replace('<focus magic_chunks="7">', '<focus magic_chunks="6">')
    assert score_trajectory(build(text), RewardConfig(efficiency_min_coverage=0.0)).efficiency > 0  # off
    r = score_trajectory(build(text), RewardConfig(efficiency_min_coverage=1.0))
    assert (r.coverage, r.efficiency) == (0.5, 0.0)
    assert "efficiency/gated:coverage" in r.reasons
    assert score_trajectory(build(text)) == r  # on by default: a half-read right answer is a guess


def test_accuracy_coverage_gate(build):
    """Off by default; at 1.0 a right answer that focused half its evidence earns no accuracy in the total,
    by hand: 0.25 compliance + 0.25 * 0.5 coverage, while the breakdown keeps the grade."""
    text = ACME_GOLD_TEXT.replace('<focus magic_chunks="7">', '<focus magic_chunks="6">')
    off = score_trajectory(build(text))
    assert off.accuracy == 1.0 and off.total == pytest.approx(1.0 + 0.25 + 0.25 * 0.5)
    gated = score_trajectory(build(text), RewardConfig(accuracy_min_coverage=1.0))
    assert gated.accuracy == 1.0 and gated.total == pytest.approx(0.25 + 0.25 * 0.5)
    assert "accuracy/gated:coverage" in gated.reasons
    assert score_trajectory(build(text), RewardConfig(accuracy_min_coverage=0.5)).total == off.total
    gold = score_trajectory(build(ACME_GOLD_TEXT), RewardConfig(accuracy_min_coverage=1.0))
    assert gold == score_trajectory(build(ACME_GOLD_TEXT))  # full coverage passes


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True),
    answer=st.sampled_from(["8 years", "9 years", "2003"]),
    gate=st.sampled_from([0.5, 1.0]),
)
def test_the_accuracy_gate_only_withholds_the_accuracy_of_an_answer_below_it(build, chunks, answer, gate):
    """Any focus (evidence: chunks 2 and 7) and answer: the gated total is the ungated one, less
    accuracy_weight * accuracy exactly when coverage is below the gate; every other component is unchanged."""
    text = ACME_GOLD_TEXT.replace(
        '<focus magic_chunks="7">', f'<focus magic_chunks="{",".join(map(str, chunks))}">'
    )
    text = text.replace("8 years</answer>", f"{answer}</answer>")
    config = RewardConfig(accuracy_weight=0.8)
    ungated = score_trajectory(build(text), config)
    gated = score_trajectory(build(text), dataclasses.replace(config, accuracy_min_coverage=gate))
    below = ungated.coverage < gate
    withheld = 0.8 * ungated.accuracy if below else 0.0
    assert gated.total == pytest.approx(ungated.total - withheld)
    assert (gated.accuracy, gated.efficiency, gated.coverage) == (
        ungated.accuracy,
        ungated.efficiency,
        ungated.coverage,
    )
    assert ("accuracy/gated:coverage" in gated.reasons) == (below and ungated.accuracy > 0)


# -- units, eviction ------------------------------------------------------------------------------------


def test_time_unit_uses_the_roofline(build):
    cost = DecodeCost(
        KVShape(num_layers=28, num_kv_heads=8, head_dim=128), query_heads=32, matmul_params=8 * 10**9
    )
    trajectory = build(ACME_GOLD)
    da, vanilla = decode_seconds(KVReads.from_trajectory(trajectory), cost)
    r = score_trajectory(trajectory, RewardConfig(efficiency_unit="time"), cost)
    assert r.kv_saving == pytest.approx(1 - da / vanilla)
    # an 8B model's matmuls take time DA does not save: the time saving is below the token saving
    assert isinstance(r.kv_saving, float) and isinstance(r.total, float)
    assert 0 < r.kv_saving < score_trajectory(trajectory).kv_saving


def test_bytes_or_time_without_the_model_is_a_setup_error(build):
    with pytest.raises(ValueError, match=r"efficiency_unit='bytes' needs the model's decode cost"):
        score_trajectories([build(ACME_GOLD)], RewardConfig(efficiency_unit="bytes"))


def test_sa_eviction_counts_per_layer(build):
    trajectory = build(ACME_GOLD)
    da, vanilla = trajectory.trace.kv_tokens, trajectory.trace.kv_tokens_vanilla
    trajectory.kv_tokens_per_layer = np.stack([da, np.zeros_like(da)], axis=1)  # layer 1 evicted everything
    r = score_trajectory(trajectory)
    assert r.kv_saving == pytest.approx(1 - da.sum() / (2 * vanilla.sum()))


def test_bad_per_layer_accounting_only_costs_efficiency(build):
    trajectory = build(ACME_GOLD)
    trajectory.kv_tokens_per_layer = np.ones((3, 2))  # wrong number of steps
    r = score_trajectory(trajectory)
    assert (r.accuracy, r.compliance, r.coverage, r.efficiency, r.kv_saving) == (1.0, 1.0, 1.0, 0.0, None)
    assert r.total == 1.5
    assert r.reasons == ("efficiency/bad_kv_accounting",)


# -- bad input ----------------------------------------------------------------------------------------


def test_cut_off_completion_scores_zero_but_keeps_its_measurement(build, gold_saving):
    r = score_trajectory(build(ACME_GOLD, finish_reason="length"))
    assert (r.total, r.accuracy, r.efficiency, r.compliance, r.coverage) == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert r.kv_saving == pytest.approx(gold_saving)
    assert r.reasons == ("input/truncated",)
    assert score_trajectory(build(ACME_GOLD, error="engine died")).reasons == ("input/rollout_error",)


def test_empty_completion(build):
    r = score_trajectory(build(" "))
    assert (r.total, r.kv_saving, r.reasons) == (0.0, None, ("input/empty_completion",))


def test_missing_columns(build):
    example = acme_example()
    del example["answers"], example["evidence_chunks"]
    r = score_trajectory(build(ACME_GOLD, example))
    assert (r.accuracy, r.coverage, r.compliance) == (0.0, None, 1.0)
    assert r.reasons == (
        "input/missing_column:evidence_chunks",
        "input/missing_column:answers",
        "efficiency/gated:accuracy",
    )


@pytest.mark.parametrize("evidence", [[0], [8], ["2"], "2,7", [True]])
def test_unusable_evidence_is_treated_as_unknown(build, evidence):
    r = score_trajectory(build(ACME_GOLD, acme_example(evidence_chunks=evidence)))
    assert r.coverage is None
    assert r.reasons == ("input/bad_column:evidence_chunks",)


def test_batch_counts_reasons(build):
    batch = score_trajectories(
        [build(ACME_GOLD), build(" "), build(ACME_GOLD, finish_reason="length"), build(" ")]
    )
    assert batch.reasons == Counter({"input/empty_completion": 2, "input/truncated": 1})
    assert batch.column("accuracy") == [1.0, 0.0, 0.0, 0.0]
    assert batch.totals[1:] == [0.0, 0.0, 0.0]

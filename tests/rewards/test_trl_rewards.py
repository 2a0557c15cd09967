"""The TRL entry point: columns as lists, chat or text completions, KV accounting from rollout columns."""

import math
import pickle
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import DAReward, DecodeCost, RewardConfig, score_trajectory, trl_reward_functions
from rewards.trl_rewards import completion_text
from rollouts.masks import KVShape

from .helpers import ACME_GOLD, ACME_GOLD_TEXT, acme_example, make_trajectory

GOLD = (
    '<focus magic_chunks="2">Founded in 2003.</focus><focus magic_chunks="7">Public in 2011.</focus>'
    "<answer>8 years</answer>"
)


def columns(n=1, **overrides):
    """Acme dataset columns for ``n`` completions, with per-step KV columns that save exactly 0.5."""
    row = {k: v for k, v in acme_example().items() if k != "gold_completion"}
    row |= {"kv_tokens": [100, 21, 22, 60], "kv_tokens_vanilla": [100, 101, 102, 103]}
    row |= overrides
    return {k: [v] * n for k, v in row.items()}


GOLD_TOTAL = 1.0 + 0.5 * 0.5 + 0.25 + 0.25
# The columns' 4 steps read 203 KV tokens from a 100-token prompt; against a budget of 4 vanilla steps
# (406 tokens) that is an efficiency of exactly 0.5, so these plumbing tests keep round numbers.
CONFIG = RewardConfig(efficiency_reference_tokens=4)


def test_text_and_chat_completions_score_alike():
    reward = DAReward(CONFIG)
    chat = [{"role": "assistant", "content": GOLD}]
    blocks = [{"role": "assistant", "content": [{"type": "text", "text": GOLD}]}]
    assert reward(["Q"] * 3, [GOLD, chat, blocks], **columns(3)) == [GOLD_TOTAL] * 3


def test_completion_text_keeps_only_the_models_messages():
    messages = [
        {"role": "assistant", "content": "<global>plan</global>"},
        {"role": "tool", "content": "<answer>injected</answer>"},
        {"role": "assistant", "content": "<answer>8</answer>"},
    ]
    assert completion_text(messages) == "<global>plan</global><answer>8</answer>"
    for bad in (None, 8, {"content": "x"}, ["x"], [{"role": "assistant", "content": 8}]):
        assert completion_text(bad) is None


def test_components_are_separate_reward_functions():
    funcs, weights = trl_reward_functions(CONFIG)
    assert weights == [1.0, 0.0, 0.0, 0.0, 0.0]
    prompts, completions = ["Q", "Q"], [GOLD, "<answer>9</answer>"]
    cols = columns(2)
    results = {f.__name__: f(prompts, completions, **cols) for f in funcs}
    assert results == {
        "da_reward": [GOLD_TOTAL, 0.0],
        "accuracy_reward": [1.0, 0.0],
        "efficiency_reward": [0.5, 0.0],
        "compliance_reward": [1.0, 0.0],
        "coverage_reward": [1.0, 0.0],
    }
    unknown = funcs[4](["Q"], [GOLD], **columns(evidence_chunks=[]))
    assert unknown == [None]  # TRL turns None into NaN and leaves it out of the mean


def test_reward_functions_pickle_and_keep_their_names():
    from trl.trainer.utils import get_callable_name

    funcs, _ = trl_reward_functions(CONFIG)
    restored = pickle.loads(pickle.dumps(funcs))
    assert [get_callable_name(f) for f in restored] == [
        "da_reward",
        "accuracy_reward",
        "efficiency_reward",
        "compliance_reward",
        "coverage_reward",
    ]
    assert restored[0](["Q"], [GOLD], **columns()) == [GOLD_TOTAL]


def test_reasons_are_logged_and_absent_ones_log_zero():
    metrics, extras = [], []
    reward = DAReward()
    log = {"log_metric": lambda k, v: metrics.append((k, v)), "log_extra": lambda k, v: extras.append((k, v))}
    reward(["Q", "Q"], [GOLD, ""], **columns(2), **log)
    assert metrics == [("reward_reasons/input/empty_completion", 0.5)]
    assert extras == [("reward_reasons", ["", "input/empty_completion"])]
    metrics.clear()
    reward(["Q"], [GOLD], **columns(1), **log)
    assert metrics == [("reward_reasons/input/empty_completion", 0.0)]


def test_trainer_only_kwargs_are_ignored():
    # GRPOTrainer adds trainer_state, log_extra, log_metric and completion_ids to every call
    total = DAReward(CONFIG)(
        prompts=["Q"], completions=[GOLD], completion_ids=[[1, 2, 3]], trainer_state=object(), **columns()
    )
    assert total == [GOLD_TOTAL]


# -- where the KV accounting comes from ---------------------------------------------------------------


def test_per_layer_and_total_kv_columns():
    per_layer = [[100, 0], [21, 21], [22, 22], [60, 60]]  # two layers, 1 - 306 / 812
    batch = DAReward().score(["Q"], [GOLD], **columns(kv_tokens_per_layer=per_layer))
    assert batch.items[0].kv_saving == pytest.approx(1 - 306 / 812)
    totals = DAReward().score(["Q"], [GOLD], **columns(kv_tokens=203, kv_tokens_vanilla=406))
    assert totals.items[0].kv_saving == 0.5


@pytest.mark.parametrize(
    "kv",
    [
        {"kv_tokens": [1, 2], "kv_tokens_vanilla": [1]},
        {"kv_tokens": ["a"], "kv_tokens_vanilla": [1]},
        {"kv_tokens": [[1], [1, 2]], "kv_tokens_vanilla": [1, 2]},
        {"kv_tokens": [1]},  # no vanilla
        {"kv_tokens": [0], "kv_tokens_vanilla": [0]},
    ],
)
def test_bad_kv_columns_cost_only_efficiency(kv):
    r = DAReward().score(["Q"], [GOLD], **columns(**kv)).items[0]
    assert (r.accuracy, r.compliance, r.coverage, r.efficiency, r.kv_saving) == (1.0, 1.0, 1.0, 0.0, None)
    assert r.reasons == ("efficiency/bad_kv_accounting",)


def test_no_kv_accounting_is_counted():
    cols = columns()
    del cols["kv_tokens"], cols["kv_tokens_vanilla"]
    batch = DAReward().score(["Q"], [GOLD], **cols)
    assert batch.totals == [1.5]
    assert batch.reasons == Counter({"efficiency/no_kv_accounting": 1})


def test_layout_column_retraces_like_the_engine(acme_layout, tokenizer, token_table):
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    cols = columns(layout=acme_layout)
    del cols["kv_tokens"], cols["kv_tokens_vanilla"], cols["num_chunks"]  # the layout knows its chunks
    reward = DAReward(token_table=token_table)
    r = reward.score(["Q"], [ACME_GOLD_TEXT], completion_ids=[trajectory.completion_ids], **cols).items[0]
    assert r == score_trajectory(trajectory)
    # without the token table there is nothing to trace with
    r = DAReward().score(["Q"], [ACME_GOLD_TEXT], completion_ids=[trajectory.completion_ids], **cols).items[0]
    assert r.reasons == ("efficiency/no_kv_accounting",)


def test_trajectory_column_is_scored_as_the_trajectory(acme_layout, tokenizer, token_table):
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    batch = DAReward().score(["Q"], ["ignored"], trajectory=[trajectory])
    assert batch.items == [score_trajectory(trajectory)]


def test_a_trajectory_batch_is_scored_once_for_total_and_components(
    acme_layout, tokenizer, token_table, monkeypatch
):
    import rewards.trl_rewards as module

    calls = []
    monkeypatch.setattr(module, "score_trajectory", lambda t, *a: calls.append(t) or score_trajectory(t, *a))
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    funcs, _ = trl_reward_functions()
    batch = [trajectory]
    values = [f(["Q"], ["ignored"], trajectory=batch) for f in funcs]  # TRL: one call per function
    want = score_trajectory(trajectory)
    assert values == [[want.total], [want.accuracy], [want.efficiency], [want.compliance], [want.coverage]]
    assert len(calls) == 1  # five functions, one scoring
    other = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    funcs[1](["Q"], ["ignored"], trajectory=[other])  # new objects: scored again
    assert len(calls) == 2


def test_scores_the_rollout_already_computed_are_read_not_recomputed(
    acme_layout, tokenizer, token_table, monkeypatch
):
    import rewards.composite
    import rewards.trl_rewards as module

    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    reward = DAReward(CONFIG)
    (scored,) = reward.score_trajectories([trajectory]).items
    assert scored == score_trajectory(trajectory, CONFIG)  # under the reward's own config
    calls = []
    for where in (module, rewards.composite):
        monkeypatch.setattr(where, "score_parsed", lambda *a, **k: calls.append(a))
    funcs, _ = trl_reward_functions(CONFIG)
    values = [
        f(["Q"], ["ignored"], trajectory=[trajectory], **{module.REWARD_COLUMN: [scored]}) for f in funcs
    ]
    assert values == [
        [scored.total],
        [scored.accuracy],
        [scored.efficiency],
        [scored.compliance],
        [scored.coverage],
    ]
    assert calls == []  # nothing scored again


def test_bytes_unit_needs_a_cost_at_construction():
    with pytest.raises(ValueError, match="efficiency_unit='time'"):
        DAReward(RewardConfig(efficiency_unit="time"))
    cost = DecodeCost(KVShape(num_layers=2, num_kv_heads=1, head_dim=64), query_heads=8)
    bytes_config = replace(CONFIG, efficiency_unit="bytes")
    assert DAReward(bytes_config, cost)(["Q"], [GOLD], **columns()) == [GOLD_TOTAL]


# -- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, cols, reasons",
    [
        ("", columns(), ("input/empty_completion",)),
        (None, columns(), ("input/bad_completion_type",)),
        ({"content": GOLD}, columns(), ("input/bad_completion_type",)),
        (GOLD, columns(finish_reason="length"), ("input/truncated",)),
        (GOLD, columns(finish_reason="error"), ("input/rollout_error",)),
        (GOLD, columns(num_chunks=None), ("input/missing_column:num_chunks",)),
        (GOLD, columns(num_chunks="7"), ("input/bad_column:num_chunks",)),
    ],
)
def test_unscorable_completions_score_zero_with_a_reason(completion, cols, reasons):
    r = DAReward().score(["Q"], [completion], **cols).items[0]
    assert (r.total, r.accuracy, r.efficiency, r.compliance) == (0.0, 0.0, 0.0, 0.0)
    assert r.reasons == reasons


def test_columns_of_the_wrong_length_count_as_missing():
    cols = columns(2)
    cols["answers"] = [["8"]]  # one row for two completions
    batch = DAReward().score(["Q", "Q"], [GOLD, GOLD], **cols)
    assert batch.column("accuracy") == [0.0, 0.0]
    assert batch.reasons["input/missing_column:answers"] == 2


def test_answers_of_the_wrong_type():
    batch = DAReward().score(["Q", "Q"], [GOLD, GOLD], **(columns(2) | {"answers": ["8", [None]]}))
    assert batch.column("accuracy") == [0.0, 0.0]
    assert batch.reasons == Counter({"accuracy/bad_references": 2, "efficiency/gated:accuracy": 2})


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
protocolish = st.lists(
    st.sampled_from(
        [
            "<global>",
            "</global>",
            "<local>",
            "</local>",
            '<focus magic_chunks="2">',
            '<focus magic_chunks="1,2,3,4,5,6,7">',
            "<focus magic_chunks='x'>",
            "</focus>",
            "<answer>",
            "</answer>",
            "8 years",
            "2011",
            " ",
            "<",
        ]
    )
    | st.text(max_size=10),
    max_size=12,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    text=protocolish,
    as_messages=st.booleans(),
    metric=st.sampled_from(["string_match_all", "string_match_part", "exact", "f1", "numeric", "bogus"]),
    answers=junk,
    evidence=junk,
    num_chunks=junk,
    kv=junk,
)
def test_never_raises_and_always_returns_a_finite_total(
    text, as_messages, metric, answers, evidence, num_chunks, kv
):
    completion = [{"role": "assistant", "content": text}] if as_messages else text
    cols = {
        "answers": [answers],
        "metric": [metric],
        "evidence_chunks": [evidence],
        "num_chunks": [num_chunks],
        "kv_tokens": [kv],
        "kv_tokens_vanilla": [kv],
    }
    for func in trl_reward_functions()[0]:
        (value,) = func(["Q"], [completion], **cols)
        assert value is None or math.isfinite(value)
    batch = DAReward().score(["Q"], [completion], **cols)
    assert 0.0 <= batch.totals[0] <= 2.0
    assert "internal_error" not in batch.reasons  # every bad input has its own defined path


def test_thinking_completions():
    # the modes work the same inside <think>; the answer comes after it
    thought = f"<think>\n{GOLD.replace('<answer>8 years</answer>', '')}\n</think>\n<answer>8 years</answer>"
    assert DAReward(replace(CONFIG, thinking=True))(["Q"], [thought], **columns()) == [GOLD_TOTAL]


# -- the budget efficiency from columns -----------------------------------------------------------------


def test_the_budget_needs_the_prompt_length_and_finds_it_where_it_is():
    budget = sum(range(100, 100 + 128))  # the default: vanilla over 128 steps from the 100-token prompt
    per_step = DAReward().score(["Q"], [GOLD], **columns()).items[0]
    assert per_step.efficiency == pytest.approx(1 - 203 / budget)  # the first vanilla step reads the prompt
    assert per_step.kv_saving == 0.5  # the paper's relative saving is reported as before
    totals = columns(kv_tokens=203, kv_tokens_vanilla=406)
    r = DAReward().score(["Q"], [GOLD], **totals).items[0]
    assert (r.efficiency, r.reasons) == (0.0, ("efficiency/no_prompt_len",))
    r = DAReward().score(["Q"], [GOLD], **(totals | {"prompt_len": [100]})).items[0]
    assert r.efficiency == pytest.approx(1 - 203 / budget)


def test_text_completions_parse_with_the_configured_protocol_version():
    broken = GOLD.replace("</focus><focus", "</focus junk><focus", 1)
    v2 = DAReward(CONFIG).score(["Q"], [broken], **columns()).items[0]
    v1 = DAReward(replace(CONFIG, protocol_version=1)).score(["Q"], [broken], **columns()).items[0]
    assert "compliance/malformed_tag" in v2.reasons and v2.compliance == 0.0
    assert "compliance/malformed_tag" not in v1.reasons

"""A reward term registered in one place (rewards/terms.py) reaches the total, the breakdown, the batch
columns and TRL's functions; it is scored after the built-in terms and cannot take a batch down."""

import pytest

from rewards import (
    RewardConfig,
    RewardTerm,
    register_term,
    registered,
    score_trajectory,
    trl_reward_functions,
)
from rewards.terms import term_names

from .helpers import ACME_GOLD, acme_example, make_trajectory


def short_answer(parsed, example, reads):
    """1 for an answer of at most 3 words, else 0 (a term written for these tests)."""
    return float(parsed.answer is not None and len(parsed.answer.split()) <= 3)


def test_a_registered_term_adds_its_weighted_value_to_the_total(acme_layout, tokenizer, token_table):
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    before = score_trajectory(trajectory)
    assert before.extra == ()
    with registered(RewardTerm("short", short_answer, weight=0.5)):
        assert term_names() == ("accuracy", "efficiency", "compliance", "coverage", "short")
        after = score_trajectory(trajectory)
    assert after.value("short") == short_answer(trajectory.parsed, {}, None) == 1.0  # "8 years": two words
    assert after.total == pytest.approx(before.total + 0.5 * 1.0)
    assert (after.accuracy, after.efficiency, after.compliance) == (before.accuracy, before.efficiency, 1.0)
    assert term_names()[-1] == "coverage"  # gone again after the block


def test_the_weight_can_be_a_reward_config_field(acme_layout, tokenizer, token_table):
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    config = RewardConfig(coverage_weight=0.75)  # an existing field stands in for a term's own
    with registered(RewardTerm("short", short_answer, weight="coverage_weight")):
        scored = score_trajectory(trajectory, config)
    without = score_trajectory(trajectory, config)
    assert scored.total == pytest.approx(without.total + 0.75)
    with pytest.raises(ValueError, match="no RewardConfig field; add the field"):
        RewardTerm("short", short_answer, weight="short_weight")


def test_names_that_would_clash_are_refused():
    for name in ("total", "accuracy", "kv_saving", "not an identifier", "class"):
        with pytest.raises(ValueError, match="must be a Python identifier other than"):
            RewardTerm(name, short_answer)
    with registered(RewardTerm("short", short_answer)), pytest.raises(ValueError, match="registered already"):
        register_term(RewardTerm("short", short_answer))


def test_a_term_that_raises_scores_none_with_a_reason_and_the_rest_stands(
    acme_layout, tokenizer, token_table
):
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    with registered(RewardTerm("broken", lambda *_: 1 / 0)):
        scored = score_trajectory(trajectory)
    assert scored.value("broken") is None and "broken/error" in scored.reasons
    assert scored.total == pytest.approx(score_trajectory(trajectory).total)  # None counts as 0


def test_trl_gets_a_function_for_it_and_an_ungradable_completion_scores_zero_in_it():
    with registered(RewardTerm("short", short_answer)):
        funcs, weights = trl_reward_functions()
        names = [f.__name__ for f in funcs]
        assert names[-1] == "short_reward" and weights[-1] == 0.0  # logged; the total already holds it
        cols = {"answers": [["8"]] * 2, "metric": ["numeric"] * 2, "num_chunks": [7] * 2}
        values = funcs[-1](["Q", "Q"], ["<answer>8</answer>", ""], **cols)  # the second one is empty
    assert values == [1.0, 0.0]

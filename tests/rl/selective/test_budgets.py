"""The per-layer KV budget search: by hand, at its stopping rules, and on a tiny model."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.selective.budgets import greedy_budget_search
from rl.selective.losses import loss_under_budgets
from rollouts.selective.eviction import load_budgets, save_budgets

from ...rollouts.selective.test_attention import VOCAB, standard_twin, tiny_model

pytestmark = pytest.mark.usefixtures("selective_attention")


def test_greedy_budget_search_by_hand():
    # loss(K) = 1 + 0.01 * (24 - K0) + 0.03 * (24 - K1), context 24, step 8, target 1.2:
    #   start (24, 24): 1.00
    #   step 1: (16, 24) 1.08 | (24, 16) 1.24 -> accept (16, 24)
    #   step 2: (8, 24) 1.16  | (16, 16) 1.32 -> accept (8, 24)
    #   step 3: (2, 24) 1.22 (8 - 8 floors at 2) | (8, 16) 1.40 -> 1.22 > 1.2: stop at (8, 24), 1.16.
    #   Evaluations: 1 + 2 + 2 + 2 = 7.
    seen = []

    def loss(budgets):
        seen.append(budgets)
        return 1 + 0.01 * (24 - budgets[0]) + 0.03 * (24 - budgets[1])

    result = greedy_budget_search(loss, num_layers=2, context=24, target=1.2, step=8)
    assert result.budgets == (8, 24)
    assert result.loss == pytest.approx(1.16)
    assert [b for b, _ in result.steps] == [(16, 24), (8, 24)]
    assert result.evaluations == len(seen) == 7
    assert result.mean_budget == 16
    assert result.full == 1.0 and result.as_dict()["full"] == 1.0  # (24, 24): the first evaluation


def test_a_finer_step_goes_on_where_the_coarse_search_stopped():
    # The loss rises once a layer holds fewer than it needs: (5, 13) of a 24-token context, target 0.
    # Step 8 alone stops at (8, 16): (2, 16) and (8, 8) both cost. Refined: step 4 finds nothing ((4, 16),
    # (8, 12) cost), step 2 takes (6, 16) then (6, 14), step 1 (5, 14) then (5, 13).
    need = (5, 13)

    def loss(budgets):
        return float(sum(max(0, n - b) for n, b in zip(need, budgets)))

    coarse = greedy_budget_search(loss, num_layers=2, context=24, target=0.0, step=8)
    assert coarse.budgets == (8, 16)
    fine = greedy_budget_search(loss, num_layers=2, context=24, target=0.0, step=8, min_step=1)
    assert fine.budgets == need and fine.loss == 0.0
    assert [b for b, _ in fine.steps][: len(coarse.steps)] == [b for b, _ in coarse.steps]
    # evaluations, 2 per round: the full cache 1, step 8 4 rounds (3 accepted), step 4 1, step 2 3, step 1 3
    assert fine.evaluations == 23
    with pytest.raises(ValueError, match="min_step"):
        greedy_budget_search(loss, num_layers=2, context=24, target=0.0, step=8, min_step=9)


def test_greedy_budget_search_stops_at_the_floor_and_at_a_missed_target():
    floor = greedy_budget_search(lambda b: 0.0, num_layers=3, context=5, target=0.0, step=2)
    assert floor.budgets == (2, 2, 2)
    missed = greedy_budget_search(lambda b: 2.0, num_layers=2, context=16, target=1.0)
    assert missed.budgets == (16, 16) and missed.evaluations == 1 and not missed.steps
    with pytest.raises(ValueError, match="step"):
        greedy_budget_search(lambda b: 0.0, num_layers=2, context=16, target=1.0, step=0)


def test_budget_search_on_a_tiny_model_and_budgets_round_trip(tmp_path):
    model = tiny_model("qwen3")
    torch.manual_seed(1)
    search, test = torch.randint(1, VOCAB, (4, 16)), torch.randint(1, VOCAB, (4, 16))
    baseline = loss_under_budgets(model, [search], None)
    result = greedy_budget_search(
        lambda b: loss_under_budgets(model, [search], b),
        num_layers=2,
        context=16,
        target=baseline * 1.02,
        step=4,
    )
    assert result.loss <= baseline * 1.02 and sum(result.budgets) < 32
    assert loss_under_budgets(model, [test], result.budgets) > 0  # the test split is measured separately
    save_budgets(model.config, result.budgets)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert load_budgets(loaded.config) == result.budgets
    assert load_budgets(standard_twin(model).config) == result.budgets  # configs carry them as is
    with pytest.raises(ValueError, match="3 KV budgets"):
        save_budgets(model.config, [4, 4, 4])


def test_the_accuracy_judge_decodes_each_candidate_and_its_full_context_evicts_nothing(tmp_path, tokenizer):
    """`GreedyAccuracy`: budgets of its `context` decode what an engine without budgets decodes, token for
    token; budgets of 2 decode what the reference engine decodes under them, something else; the accuracy
    is the graded mean of what was decoded."""
    from rl.selective.budgets import GreedyAccuracy, accuracy_budget_search, search_rows
    from rollouts.engines.reference import ReferenceEngine
    from rollouts.protocol import LayoutSettings

    from ...rollouts.conftest import save_tiny_qwen3

    path = save_tiny_qwen3(tmp_path, tokenizer, selective_attention=True)  # no budgets: it evicts nothing
    engine = ReferenceEngine(path, num_threads=1)
    rows = [
        {"id": f"r{i}", "task": "t", "question": f"Which number is {word}?", "answers": [str(i)],
         "metric": "string_match_all", "evidence_chunks": [1], "chunk_tokens": 27,
         "documents": [f"The {word} number is {i}.", "Nothing here.", "A river runs."]}
        for i, word in enumerate(("first", "second"))
    ]  # fmt: skip
    judge = GreedyAccuracy.of(engine.model, tokenizer, rows, LayoutSettings(block_size=32), max_tokens=12)
    assert judge.context == max(r.layout.prompt_len for r in judge.requests) + 12
    full = judge.report((judge.context,) * 4)
    unbudgeted = engine.generate(judge.requests)
    assert [t.completion_ids for t in full.trajectories] == [t.completion_ids for t in unbudgeted]
    tight = judge.report((2,) * 4)
    assert [t.completion_ids for t in tight.trajectories] != [t.completion_ids for t in unbudgeted]
    evicting = ReferenceEngine(engine.model, tokenizer, budgets=(2,) * 4).generate(judge.requests)
    assert [t.completion_ids for t in tight.trajectories] == [t.completion_ids for t in evicting]
    # an answer counts only where its trace keeps the protocol (rewards.compliance)
    assert judge((2,) * 4) == sum(r.accuracy * (r.compliance == 1.0) for r in tight.rewards) / 2
    with pytest.raises(ValueError, match="accuracy points"):
        accuracy_budget_search(judge, num_layers=4, context=judge.context, tolerance=5)
    # what `heed budgets` and the run's budget_search phase call: the same search, named by its judge
    layout, step = LayoutSettings(block_size=32), judge.context  # one step: each layer straight to 2
    by_name = search_rows(engine.model, tokenizer, rows, layout, "accuracy", step=step, max_tokens=12)
    assert by_name.as_dict() == accuracy_budget_search(judge, 4, judge.context, step=step).as_dict()
    with pytest.raises(ValueError, match="unknown budget judge 'bleu'"):
        search_rows(engine.model, tokenizer, rows, layout, "bleu")

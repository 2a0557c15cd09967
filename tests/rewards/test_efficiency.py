"""KV-read efficiency: savings in tokens, bytes and roofline time, worked out by hand or from the spans."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rewards.efficiency import (
    DecodeCost,
    KVReads,
    Roofline,
    budget_efficiency,
    decode_seconds,
    kv_bytes,
    kv_saving,
)
from rollouts.masks import KVShape
from rollouts.protocol import GLOBAL_STATE, LOCAL_STATE

from .helpers import ACME_GOLD, acme_example, make_trajectory, piece_ids, reference_reads


def test_roofline_defaults_are_the_papers():
    # B200: 8 TB/s HBM, 2.25 PFLOPS dense bf16; MFU 40 %, MBU 70 % (paper §5.4, Tab. 3)
    assert Roofline() == Roofline(hbm_bandwidth=8e12, peak_flops=2.25e15, mfu=0.4, mbu=0.7)


def test_token_saving_hand_worked():
    reads = KVReads(np.array([100, 21, 22, 60]), np.array([100, 101, 102, 103]))
    assert kv_saving(reads) == pytest.approx(1 - 203 / 406)


def test_evicted_tokens_count_as_not_read_per_layer():
    # two layers; layer 1 evicted 50 tokens at each step, layer 0 evicted nothing
    per_layer = np.array([[100, 50], [101, 51]])
    reads = KVReads(per_layer, np.array([100, 101]))
    assert kv_saving(reads) == pytest.approx(1 - (100 + 50 + 101 + 51) / (2 * (100 + 101)))


def test_bytes_hand_worked_and_same_ratio_as_tokens():
    kv = KVShape(num_layers=2, num_kv_heads=1, head_dim=64, dtype_bytes=2)  # 2*2*1*64*2 = 512 B/token
    cost = DecodeCost(kv, query_heads=8)
    reads = KVReads(np.array([30, 10]), np.array([40, 41]))
    assert kv_bytes(reads, kv) == (40 * 512, 81 * 512)
    assert kv_saving(reads, "bytes", cost) == pytest.approx(1 - 40 / 81)
    assert kv_saving(reads) == pytest.approx(1 - 40 / 81)
    per_layer = KVReads(np.array([[30, 20], [10, 0]]), np.array([40, 41]))  # 256 B per token per layer
    assert kv_bytes(per_layer, kv) == (60 * 256, 162 * 256)


def test_roofline_time_memory_bound_attention_plus_compute_bound_matmuls():
    kv = KVShape(num_layers=2, num_kv_heads=1, head_dim=64, dtype_bytes=2)  # 256 B per token per layer
    cost = DecodeCost(kv, query_heads=8, matmul_params=10**9)
    reads = KVReads(np.array([1000, 0]), np.array([1000, 1001]))
    matmul = 2e9 / (0.4 * 2.25e15)  # per step, compute-bound
    bandwidth = 0.7 * 8e12
    # attention is memory-bound: 4 * 8 * 64 = 2048 FLOPs vs 256 B per layer-token, intensity 8 << 160
    da = 2 * matmul + (2 * 1000 * 256) / bandwidth
    vanilla = 2 * matmul + (2 * 1000 * 256 + 2 * 1001 * 256) / bandwidth
    assert decode_seconds(reads, cost) == pytest.approx((da, vanilla))
    assert kv_saving(reads, "time", cost) == pytest.approx(1 - da / vanilla)
    # the matmuls dilute the saving: without them the time saving is the byte saving
    assert kv_saving(reads, "time", DecodeCost(kv, query_heads=8)) == pytest.approx(
        kv_saving(reads, "bytes", cost)
    )


def test_roofline_time_takes_the_compute_bound_when_attention_is_flop_heavy():
    kv = KVShape(num_layers=1, num_kv_heads=1, head_dim=64, dtype_bytes=1)  # 128 B per token
    cost = DecodeCost(kv, query_heads=1024)  # 4 * 1024 * 64 = 262144 FLOPs per token: 2048 FLOP/B
    reads = KVReads(np.array([100]), np.array([200]))
    flop_time = 262144 / (0.4 * 2.25e15)
    assert flop_time > 128 / (0.7 * 8e12)
    assert decode_seconds(reads, cost) == pytest.approx((100 * flop_time, 200 * flop_time))
    slow = Roofline(hbm_bandwidth=1e9)  # now memory-bound: 128 B at 0.7 GB/s
    assert decode_seconds(reads, cost, slow)[0] == pytest.approx(100 * 128 / 0.7e9)


def test_decode_cost_from_a_hf_config():
    from transformers import Qwen3Config

    config = Qwen3Config(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32
    )
    cost = DecodeCost.from_config(config, dtype="bf16", matmul_params=1_000_000)
    assert cost == DecodeCost(KVShape(4, 2, 32, 2), query_heads=4, matmul_params=1_000_000)


@pytest.mark.parametrize(
    "read, vanilla, match",
    [
        (np.array([1, 2]), np.array([1]), "against vanilla"),
        (np.array([], dtype=int), np.array([], dtype=int), "no decoding steps"),
        (np.array([-1]), np.array([1]), "finite and >= 0"),
        (np.array([np.nan]), np.array([1.0]), "finite and >= 0"),
        (np.array(["a"]), np.array([1]), "finite and >= 0"),
        (np.zeros((2, 0)), np.array([1, 1]), "no layers"),
    ],
)
def test_bad_accounting_is_refused(read, vanilla, match):
    with pytest.raises(ValueError, match=match):
        KVReads(read, vanilla)


def test_byte_and_time_savings_need_the_model():
    with pytest.raises(ValueError, match="DecodeCost"):
        kv_saving(KVReads(np.array([1]), np.array([2])), "time")
    with pytest.raises(ValueError, match="unit must be one of"):
        kv_saving(KVReads(np.array([1]), np.array([2])), "joules")


def test_per_layer_reads_must_match_the_models_layers():
    cost = DecodeCost(KVShape(num_layers=3, num_kv_heads=1, head_dim=8), query_heads=1)
    with pytest.raises(ValueError, match="2 layers but the model keeps KV in 3"):
        kv_saving(KVReads(np.ones((4, 2)), np.ones(4)), "bytes", cost)


# -- on real trajectories ---------------------------------------------------------------------------


def test_global_only_trajectory_saves_nothing(acme_layout, tokenizer, token_table):
    text = "<global>Acme was founded in 2003 and went public in 2011, so 8 years.</global><answer>8</answer>"
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, text, acme_example())
    assert kv_saving(KVReads.from_trajectory(trajectory)) == 0.0


def test_acme_gold_saving_matches_the_chunk_spans(acme_layout, tokenizer, token_table):
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    read, vanilla = reference_reads(acme_layout, piece_ids(tokenizer, ACME_GOLD)[1])
    expected = 1 - read.sum() / vanilla.sum()
    assert 0.0 < expected < 1.0
    assert kv_saving(KVReads.from_trajectory(trajectory)) == pytest.approx(expected)


def test_local_only_reads_only_scaffold_and_generated_tokens(acme_layout, tokenizer, token_table):
    pieces = [("<local>", LOCAL_STATE), ("Guessing eight years.", LOCAL_STATE), ("</local>", GLOBAL_STATE)]
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, pieces, acme_example())
    predicted = piece_ids(tokenizer, pieces)[1]
    read, vanilla = reference_reads(acme_layout, predicted)
    chunk_tokens = sum(e - s for s, e in acme_layout.chunk_spans)
    # every step after the <local> tag hides all seven chunks
    n_local = sum(1 for s in predicted if s == LOCAL_STATE)
    assert vanilla.sum() - read.sum() == n_local * chunk_tokens
    assert kv_saving(KVReads.from_trajectory(trajectory)) == pytest.approx(1 - read.sum() / vanilla.sum())


def test_da_nm_and_vanilla_rollouts_save_nothing(acme_layout, tokenizer, token_table):
    for mode in ("da-nm", "vanilla"):
        trajectory = make_trajectory(
            acme_layout, tokenizer, token_table, ACME_GOLD, acme_example(), mode=mode
        )
        assert kv_saving(KVReads.from_trajectory(trajectory)) == 0.0


def test_sa_eviction_per_layer_on_a_trajectory(acme_layout, tokenizer, token_table):
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    da = trajectory.trace.kv_tokens
    # layer 0 reads what DA shows; layer 1 has also evicted 64 tokens at every step
    trajectory.kv_tokens_per_layer = np.stack([da, da - 64], axis=1)
    n, vanilla = len(da), trajectory.trace.kv_tokens_vanilla.sum()
    expected = 1 - (2 * da.sum() - 64 * n) / (2 * vanilla)
    assert kv_saving(KVReads.from_trajectory(trajectory)) == pytest.approx(expected)


@given(
    data=st.integers(1, 40).flatmap(
        lambda n: st.tuples(
            hnp.arrays(np.int64, n, elements=st.integers(0, 10**9)),
            hnp.arrays(np.int64, n, elements=st.integers(0, 10**9)),
        )
    )
)
def test_saving_is_at_most_one(data):
    read, vanilla = data
    if vanilla.sum() == 0:
        with pytest.raises(ValueError):
            kv_saving(KVReads(read, vanilla))
    else:
        assert kv_saving(KVReads(read, vanilla)) <= 1.0


# -- the reward's efficiency: reads against a per-example budget ------------------------------------


def test_budget_efficiency_hand_worked():
    reads = KVReads(np.array([100, 21, 22, 60]), np.array([100, 101, 102, 103]), prompt_len=100)
    # budget: vanilla over 10 steps from the 100-token prompt = 100 + 101 + ... + 109 = 1045
    assert budget_efficiency(reads, 10) == pytest.approx(1 - 203 / 1045)
    assert budget_efficiency(reads, 1) == 0.0  # 203 > 100: overspent, clipped at 0
    two_layers = KVReads(np.array([[100, 0], [21, 21], [22, 22], [60, 60]]), reads.vanilla, prompt_len=100)
    assert budget_efficiency(two_layers, 10) == pytest.approx(1 - 306 / (2 * 1045))


def test_budget_efficiency_in_bytes_and_time():
    kv = KVShape(num_layers=2, num_kv_heads=1, head_dim=64, dtype_bytes=2)
    cost = DecodeCost(kv, query_heads=8, matmul_params=10**9)
    reads = KVReads(np.array([30, 10]), np.array([40, 41]), prompt_len=40)
    budget = KVReads.causal(40, 3)  # 40 + 41 + 42
    assert budget_efficiency(reads, 3, "bytes", cost) == pytest.approx(1 - 40 / 123)
    da, _ = decode_seconds(reads, cost)
    full, _ = decode_seconds(budget, cost)
    assert budget_efficiency(reads, 3, "time", cost) == pytest.approx(1 - da / full)


def test_budget_efficiency_needs_the_prompt_length():
    with pytest.raises(ValueError, match="prompt length"):
        budget_efficiency(KVReads(np.array([1]), np.array([2])), 8)
    with pytest.raises(ValueError, match="prompt_len"):
        KVReads(np.array([1]), np.array([2]), prompt_len=0)


def test_trajectories_carry_their_prompt_length(acme_layout, tokenizer, token_table):
    trajectory = make_trajectory(acme_layout, tokenizer, token_table, ACME_GOLD, acme_example())
    reads = KVReads.from_trajectory(trajectory)
    assert reads.prompt_len == acme_layout.prompt_len == reads.vanilla[0]


@given(
    data=st.integers(1, 30).flatmap(
        lambda n: st.tuples(
            st.integers(1, 5000),  # prompt length
            hnp.arrays(np.int64, n, elements=st.integers(1, 5000)),  # reads of the completion
            hnp.arrays(np.int64, st.integers(1, 20), elements=st.integers(1, 5000)),  # appended steps
            st.integers(1, 64),  # budget steps
        )
    )
)
def test_appending_steps_never_raises_the_budget_efficiency(data):
    """Every step reads at least one KV token, so a longer completion never earns more; the relative
    saving has no such property (appending cheap steps raises it)."""
    prompt_len, read, more, steps = data

    def reads(r):
        return KVReads(r, prompt_len + np.arange(len(r)), prompt_len)

    longer = np.concatenate([read, more])
    assert budget_efficiency(reads(longer), steps) <= budget_efficiency(reads(read), steps)

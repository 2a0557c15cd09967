"""Step metrics and trajectory records against hand counts on the paper's Acme example."""

import dataclasses
import json

import numpy as np
import pytest

from rewards import score_trajectories
from rewards.efficiency import DecodeCost, Roofline
from rl.dashboard.records import length_bin, step_metrics, trajectory_record
from rollouts.masks import KVShape, trace_completion
from rollouts.protocol import GLOBAL_STATE, ModeState, build_prompt, parse_completion
from rollouts.trajectory import Trajectory
from tests.rewards.helpers import ACME_GOLD, ACME_QUESTION, acme_documents, acme_example, piece_ids

# Plans in global, then reads chunk 99 (out of range: violation, mode becomes local), then answers.
BROKEN = [
    ("<global>", GLOBAL_STATE),
    ("Magic Chunk 2 has it.", GLOBAL_STATE),
    ("</global>", GLOBAL_STATE),
    ('<focus magic_chunks="99">', ModeState("local")),
    ("Nothing here.", ModeState("local")),
    ("</focus>", GLOBAL_STATE),
    ("<answer>8</answer>", GLOBAL_STATE),
]


@pytest.fixture(scope="module")
def batch(tokenizer, token_table):
    """Two scored Acme trajectories, and for each the hand-derived state each token was predicted under."""
    layout = build_prompt(ACME_QUESTION, acme_documents(), tokenizer, block_size=32)
    trajectories, predicted = [], []
    for pieces in (ACME_GOLD, BROKEN):
        ids, states = piece_ids(tokenizer, pieces)
        text = "".join(p for p, _ in pieces)
        trace = trace_completion(layout, ids, token_table)
        trajectories.append(
            Trajectory(acme_example(context_tokens=900), layout, ids, text, parse_completion(text, 7), trace)
        )
        predicted.append(states)
    return trajectories, score_trajectories(trajectories).items, predicted


def test_mode_mix_is_the_token_share_by_predicted_mode(batch):
    trajectories, rewards, predicted = batch
    metrics = step_metrics(trajectories, rewards)
    tokens = [s.mode for states in predicted for s in states]  # pooled over the batch, not averaged
    for mode in ("global", "focus", "local"):
        assert metrics[f"mode_mix/{mode}"] == pytest.approx(tokens.count(mode) / len(tokens))
        assert metrics[f"mode_mix/by_length/<=1K/{mode}"] == metrics[f"mode_mix/{mode}"]
    assert 0 < metrics["mode_mix/focus"] < 1 and metrics["mode_mix/local"] > 0


def test_kv_and_violation_metrics(batch):
    trajectories, rewards, _ = batch
    cost = DecodeCost(KVShape(num_layers=2, num_kv_heads=1, head_dim=32, dtype_bytes=2), query_heads=2)
    metrics = step_metrics(trajectories, rewards, cost, vanilla_steps=[10, 10], wall_time_s=2.0)
    prompt_len = trajectories[0].layout.prompt_len
    lengths = [len(t.completion_ids) for t in trajectories]
    vanilla = sum(
        prompt_len + j for n in lengths for j in range(n)
    )  # causal: position + 1, from prompt_len - 1
    assert metrics["kv/tokens_vanilla"] == vanilla
    assert metrics["kv/tokens_vanilla_per_completion"] == vanilla / 2  # two completions
    da = sum(int(t.trace.kv_tokens.sum()) for t in trajectories)
    assert metrics["kv/tokens_da"] == da and metrics["kv/tokens_da_per_completion"] == da / 2
    assert metrics["kv/bytes_vanilla"] == vanilla * 2 * 2 * 1 * 32 * 2
    assert metrics["kv/saving"] == pytest.approx(1 - metrics["kv/tokens_da"] / vanilla)
    assert metrics["violations/unknown_chunk"] == 0.5 and metrics["violations/empty_focus"] == 0.5
    assert metrics["violations/nested_mode"] == 0.0
    assert metrics["decode/steps_overhead"] == pytest.approx(sum(lengths) / 20 - 1)
    assert metrics["throughput/tokens_per_s"] == pytest.approx(sum(lengths) / 2.0)
    assert metrics["reward/compliance"] == 0.5  # the gold trace complies, the broken one does not
    assert metrics["accuracy/by_task/multi_hop"] == 1.0
    assert not any(k.startswith("kv/tokens_da/layer_") for k in metrics)  # every layer reads the same


def test_roofline_time_by_hand(batch):
    """Per decoding step: matmuls at MFU x peak, then per layer max(attention FLOPs / (MFU x peak),
    KV bytes / (MBU x bandwidth)) for the tokens that step reads (the paper's §5.4 model)."""
    trajectories, rewards, _ = batch
    roofline = Roofline(hbm_bandwidth=1e12, peak_flops=1e14, mfu=0.5, mbu=0.5)
    cost = DecodeCost(
        KVShape(num_layers=3, num_kv_heads=2, head_dim=64, dtype_bytes=2), query_heads=4, matmul_params=10**6
    )
    metrics = step_metrics(trajectories, rewards, cost, roofline=roofline)
    per_layer_token_bytes = 2 * 2 * 64 * 2  # K and V, 2 heads, 64 dims, bf16
    per_layer_token_flops = 4 * 4 * 64  # q.K and p.V for 4 query heads
    for side, counts in (("da", "kv_tokens"), ("vanilla", "kv_tokens_vanilla")):
        expected = 0.0
        for t in trajectories:
            for tokens in getattr(t.trace, counts):
                expected += 2 * 10**6 / (0.5 * 1e14)
                memory = tokens * per_layer_token_bytes / (0.5 * 1e12)
                compute = tokens * per_layer_token_flops / (0.5 * 1e14)
                expected += 3 * max(memory, compute)
        assert metrics[f"decode/roofline_s_{side}"] == pytest.approx(expected, rel=1e-9)
    assert metrics["decode/roofline_s_da"] < metrics["decode/roofline_s_vanilla"]


def test_per_layer_reads_under_eviction(batch):
    """Selective Attention eviction: each layer reads its own count; the batch logs every layer's sum
    and their mean as the DA tokens, vanilla stays the causal count."""
    trajectories, rewards, _ = batch
    evicted = []
    for t in trajectories:
        n = len(t.completion_ids)
        per_layer = np.stack([t.trace.kv_tokens_vanilla, np.full(n, 40)], axis=1)  # layer 1 keeps 40
        evicted.append(dataclasses.replace(t, kv_tokens_per_layer=per_layer))
    metrics = step_metrics(evicted, rewards)
    vanilla = sum(int(t.trace.kv_tokens_vanilla.sum()) for t in trajectories)
    steps = sum(len(t.completion_ids) for t in trajectories)
    assert metrics["kv/tokens_da/layer_00"] == vanilla and metrics["kv/tokens_da/layer_01"] == 40 * steps
    assert metrics["kv/tokens_da"] == pytest.approx((vanilla + 40 * steps) / 2)
    assert metrics["kv/tokens_vanilla"] == vanilla
    record = json.loads(json.dumps(trajectory_record(evicted[0], rewards[0], step=1, record_id="r0")))
    n = record["num_tokens"]
    assert record["kv_tokens_per_layer"] == [[v, 40] for v in record["kv_tokens_vanilla"]]
    assert record["kv_tokens_read"] == [(v + 40) / 2 for v in record["kv_tokens_vanilla"]] and n > 0


def test_record_is_json_and_carries_the_trace(batch):
    trajectories, rewards, predicted = batch
    record = json.loads(json.dumps(trajectory_record(trajectories[0], rewards[0], step=3, record_id="r0")))
    assert record["step"] == 3 and record["task"] == "multi_hop" and record["length_bin"] == "<=1K"
    assert [record["states"][i]["mode"] for i in record["predicted_state"]] == [s.mode for s in predicted[0]]
    assert len(record["kv_tokens"]) == len(record["kv_tokens_vanilla"]) == record["num_tokens"]
    assert record["kv_tokens_read"] == record["kv_tokens"] and record["kv_tokens_per_layer"] is None  # da
    assert record["answer"] == "8 years" and record["violations"] == []
    assert record["layout"]["chunk_spans"] == [list(s) for s in trajectories[0].layout.chunk_spans]


@pytest.mark.parametrize(
    ("tokens", "label"),
    [(1, "<=1K"), (1024, "<=1K"), (1025, "<=2K"), (200_000, "<=256K"), (300_000, ">256K")],
)
def test_length_bins(tokens, label):
    assert length_bin(tokens) == label


def test_a_rollout_without_tokens_counts_nothing(batch, tokenizer, token_table):
    """A failed rollout with no generated token adds no KV reads and breaks nothing."""
    trajectories, rewards, _ = batch
    layout = trajectories[0].layout
    empty = Trajectory(trajectories[0].example, layout, [], "", parse_completion("", 7),
                       trace_completion(layout, [], token_table), finish_reason="error")  # fmt: skip
    cost = DecodeCost(KVShape(num_layers=2, num_kv_heads=1, head_dim=32), query_heads=2)
    with_empty = step_metrics([*trajectories, empty], [*rewards, rewards[1]], cost)
    without = step_metrics(trajectories, rewards, cost)
    for key in ("kv/tokens_da", "kv/tokens_vanilla", "kv/bytes_da", "decode/roofline_s_vanilla"):
        assert with_empty[key] == without[key]
    # per completion it counts, with 0 reads, as in decode/steps (rollouts/failed says why it read nothing)
    assert with_empty["kv/tokens_da_per_completion"] == without["kv/tokens_da"] / 3

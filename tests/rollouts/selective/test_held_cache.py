"""Decoding many sequences from one held-KV buffer per layer against decoding each alone over a full cache.

The oracle is :func:`rollouts.selective.attention.selective_attention_forward` run on one sequence at a
time over every key it has seen, with the evicted ones masked (``AttentionState.held``). Rows of different
lengths (a prompt shorter than the budget among them), a DA mask on some rows, a slack small enough that
rows are compacted during the run, and rows taking turns: outputs, reads, and what each row holds must
agree at every step.
"""

import copy
import types

import numpy as np
import pytest
import torch

from rollouts.selective.attention import AttentionState, selective_attention_forward
from rollouts.selective.held_cache import HeldCache

HEADS, KV_HEADS, D, LAYER, SCALING = 4, 2, 16, 1, 0.25
BUDGETS = (4, 6, 3)


def sequence(prompt_len: int, steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    n = prompt_len + steps
    query = torch.randn(1, HEADS, n, D, generator=g) * 2  # large logits: heads 0 selects, layers evict
    key, value = (torch.randn(1, KV_HEADS, n, D, generator=g) for _ in "kv")
    return query, key, value


@pytest.mark.parametrize("slack", [0, 2])
def test_held_cache_decodes_as_each_sequence_alone(slack):
    prompts, steps = [9, 14, 3, 11], 12  # the third prompt is shorter than the budget (6)
    rng = np.random.default_rng(slack)
    module = types.SimpleNamespace(layer_idx=LAYER)
    sequences = [sequence(p, steps, seed) for seed, p in enumerate(prompts)]
    alone, cache = [], HeldCache(LAYER, BUDGETS, slack)
    for slot, ((query, key, value), p) in enumerate(zip(sequences, prompts)):
        state = AttentionState(budgets=BUDGETS)
        selective_attention_forward(
            module, query[:, :, :p], key[:, :, :p], value[:, :, :p], None, heed_state=state
        )
        held = state.held[LAYER][0].nonzero()[:, 0]
        cache.load(slot, key[:, :, held], value[:, :, held], state.accumulators[LAYER].total[:, held], held)
        alone.append(copy.deepcopy(state))
    assert cache.length.tolist()[:4] == [min(p, BUDGETS[LAYER]) for p in prompts]
    taken = [0] * len(prompts)  # steps each row has decoded
    for t in range(steps):
        slots = [0, 1, 2, 3] if t % 3 else [3, 1]  # some steps leave rows out, in another order
        positions = [prompts[s] + taken[s] for s in slots]
        visible = []
        for s, position in zip(slots, positions):
            da = rng.random(position + 1) > 0.3 if s in (1, 3) else None
            if da is not None:
                da[0] = da[-1] = True  # <BOS> and the token itself, as a DA mode shows them
            visible.append(da)
        query = torch.cat([sequences[s][0][:, :, p : p + 1] for s, p in zip(slots, positions)])
        key = torch.cat([sequences[s][1][:, :, p] for s, p in zip(slots, positions)])
        value = torch.cat([sequences[s][2][:, :, p] for s, p in zip(slots, positions)])
        out, reads = cache.step(slots, query, key, value, positions, visible, SCALING)
        for r, (s, p, da) in enumerate(zip(slots, positions, visible)):
            q, k, v = sequences[s]
            mask = None if da is None else torch.from_numpy(da).view(1, 1, 1, -1)
            expected, _ = selective_attention_forward(
                module, q[:, :, p : p + 1], k[:, :, : p + 1], v[:, :, : p + 1], mask, scaling=SCALING,
                heed_state=alone[s],
            )  # fmt: skip
            torch.testing.assert_close(out[r], expected[0, 0], atol=1e-5, rtol=1e-5, msg=f"step {t} row {s}")
            assert reads[r].item() == alone[s].kv_reads[LAYER][0, 0].item()
            held = alone[s].held[LAYER][0].nonzero()[:, 0]  # what the full cache still holds
            row = cache.row_positions(s)[cache.held[s, : cache.length[s]]]
            assert row.tolist() == held.tolist(), f"step {t} row {s}"
            assert cache.length[s] <= BUDGETS[LAYER] + slack
            taken[s] += 1
    # the compaction ran: each row holds its budget plus at most the slack, not everything it saw
    assert (cache.length[:4] <= BUDGETS[LAYER] + slack).all()

"""Group-shared prompts: one row ``[prompt | c_1 .. c_k]`` per prompt gives the per-completion forward's
log-probs and GRPO gradients, and the isolation check that says so can fail."""

import copy
import dataclasses
import warnings

import pytest
import torch

from rl.logprobs import masked_completion_logps, prompt_groups, share_prompts, shared_forward
from rollouts.masks import dense_training_mask, mask_batch, shared_mask_batch, trace_completion

# Per prompt of the session's two_rows: completions of different lengths and mode paths (focus on one or two
# chunks, local, global, no tag at all), so rows differ in length, state tables and masked steps.
COMPLETIONS = [
    [
        '<global>plan</global><focus magic_chunks="2">the mill</focus><local>so two</local><answer>2</answer>',
        '<focus magic_chunks="1,3">river</focus><answer>1</answer>',
        "<local>hm</local><answer>3</answer>",
    ],
    [
        '<local>nothing to read</local><focus magic_chunks="1">bread</focus><answer>1</answer>',
        "<global>all</global><answer>2</answer>",
        '<focus magic_chunks="2">snow falls</focus><local>x</local><answer>2</answer>',
        "2",
    ],
]
ORDER = [
    (0, 0),
    (1, 0),
    (0, 1),
    (1, 1),
    (1, 2),
    (0, 2),
    (1, 3),
]  # interleaved, as TRL's shuffling leaves them


@pytest.fixture(scope="module")
def batch(two_rows, tokenizer, token_table):
    """``(input_ids [B, P + C], traces, C)``: TRL's layout, prompts left-padded, completions right-padded."""
    layouts = [t.layout for t in two_rows[0]]
    traces, completions = [], []
    for prompt, k in ORDER:
        ids = tokenizer(COMPLETIONS[prompt][k], add_special_tokens=False)["input_ids"]
        traces.append(trace_completion(layouts[prompt], ids, token_table))
        completions.append(ids)
    width = max(lay.prompt_len for lay in layouts)
    c_width = max(map(len, completions)) + 2  # trailing padding columns, as TRL's batch has
    input_ids = torch.full((len(traces), width + c_width), tokenizer.pad_token_id)
    for b, (trace, ids) in enumerate(zip(traces, completions)):
        input_ids[b, width - trace.layout.prompt_len : width] = torch.tensor(trace.layout.input_ids)
        input_ids[b, width : width + len(ids)] = torch.tensor(ids)
    assert len({len(c) for c in completions}) > 3 and len({t.layout.prompt_len for t in traces}) == 2
    return input_ids, traces, c_width


def real_tokens(traces, c_width):
    return torch.arange(c_width)[None, :] < torch.tensor([len(t.row_state) for t in traces])[:, None]


def parity_gap(a, b, real) -> float:
    """Largest |difference| over real completion tokens: the isolation check's measure."""
    return (a - b).abs()[real].max().item()


def targets(input_ids, c_width):
    return input_ids[:, -c_width:]


def test_shared_mask_is_each_completion_alone_and_isolated(batch):
    """Row ``r`` of the shared mask holds, for each completion, the mask of prompt + that completion alone
    (an independent build: :func:`mask_batch` on one row) and nothing between completions."""
    _, traces, _ = batch
    groups = prompt_groups(traces)
    assert groups == [[0, 2, 5], [1, 3, 4, 6]]
    rows = [[traces[b] for b in g] for g in groups]
    seq_len = max(r[0].layout.prompt_len + sum(len(t.row_state) for t in r) for r in rows)
    shared = shared_mask_batch(rows, [0, 0], seq_len)
    dense = dense_training_mask(shared)[:, 0]
    for r, row in enumerate(rows):
        p = row[0].layout.prompt_len
        spans, offset = [], p
        for trace in row:
            spans.append(slice(offset, offset + len(trace.row_state)))
            offset += len(trace.row_state)
        for i, (trace, span) in enumerate(zip(row, spans)):
            n = len(trace.row_state)
            alone = dense_training_mask(mask_batch([trace], [0], p + n))[0, 0]
            assert torch.equal(dense[r, :p, :p], alone[:p, :p])
            assert torch.equal(dense[r, span, :p], alone[p:, :p]), f"row {r} completion {i}: prompt keys"
            assert torch.equal(dense[r, span, span], alone[p:, p:]), f"row {r} completion {i}: own keys"
            for other in spans[:i]:
                assert not dense[r, span, other].any(), f"row {r} completion {i} sees an earlier one"
            assert shared.position_ids[r, span].tolist() == list(range(p, p + n))


def shared_rows(traces):
    rows = [[traces[b] for b in g] for g in prompt_groups(traces)]
    width = max(r[0].layout.prompt_len for r in rows)
    seq_len = width + max(sum(len(t.row_state) for t in r) for r in rows)
    return shared_mask_batch(rows, [width - r[0].layout.prompt_len for r in rows], seq_len)


def test_shared_block_mask_equals_the_dense_one(batch):
    """The GPU form of a shared row: FlexAttention with its BlockMask gives SDPA's output under the dense
    mask, and its tiles are torch's own T x T evaluation of the same mask_mod (forward only on CPU)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from rollouts.masks import block_training_mask
    from rollouts.masks.training import _mask_mod

    _, traces, _ = batch
    shared = shared_rows(traces)
    b_size, _, seq_len = shared.state_keys.shape
    block = block_training_mask(shared, block_size=32)
    reference = create_block_mask(
        _mask_mod(shared.state_keys, shared.query_state, shared.valid), b_size, None, seq_len, seq_len,
        device="cpu", BLOCK_SIZE=32,
    )  # fmt: skip
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        assert torch.equal(getattr(block, name), getattr(reference, name)), name
    torch.manual_seed(0)
    q, k, v = (torch.randn(b_size, 2, seq_len, 32) for _ in range(3))
    with warnings.catch_warnings():  # torch warns once per process that flex_attention is not compiled here
        warnings.filterwarnings("ignore", message=".*torch.compile", category=UserWarning)
        flex = flex_attention(q, k, v, block_mask=block)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_training_mask(shared))
    valid = shared.valid[:, None, :, None].expand_as(sdpa)
    assert torch.allclose(flex[valid], sdpa[valid], atol=1e-5)


def test_shared_logprobs_equal_the_per_completion_forward(small_model, batch):
    """Per-token log-probs and entropies (fp32) within 1e-5 of one padded row per completion."""
    input_ids, traces, c_width = batch
    with torch.no_grad():
        shared = share_prompts(input_ids, traces, c_width)
        logps, entropy = shared_forward(
            small_model, shared, targets(input_ids, c_width), compute_entropy=True
        )
        ref, ref_entropy = masked_completion_logps(
            small_model, input_ids, traces, c_width, compute_entropy=True
        )
    assert shared.input_ids.shape[0] == 2  # seven completions, two prompt forwards
    real = real_tokens(traces, c_width)
    assert parity_gap(logps, ref, real) <= 1e-5
    assert parity_gap(entropy, ref_entropy, real) <= 1e-5
    assert (logps[~real] == 0).all()


def grpo_loss(logps, old, advantages, real):
    """TRL's clipped token-level objective (DAPO normalization) for a batch slice, over ``num_tokens``."""
    ratio = torch.exp(logps - old)
    per_token = -torch.min(ratio * advantages[:, None], ratio.clamp(0.8, 1.28) * advantages[:, None])
    return (per_token * real).sum()


def gradients(model, loss):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])


def test_grpo_gradients_equal_and_do_not_depend_on_the_micro_batch_split(small_model, batch):
    """The GRPO loss's gradient through the shared forward equals the per-completion one (relative 1e-4),
    also when the groups are split across two micro-batches and each packs whatever shares a prompt."""
    input_ids, traces, c_width = batch
    model = copy.deepcopy(small_model).train()
    real = real_tokens(traces, c_width)
    y = targets(input_ids, c_width)
    advantages = torch.linspace(-1.0, 1.0, len(traces))
    with torch.no_grad():  # old log-probs a little off the current ones, so ratios differ from 1 and clip
        old, _ = masked_completion_logps(model, input_ids, traces, c_width)
        old = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(0))
    tokens = real.sum()
    ref, _ = masked_completion_logps(model, input_ids, traces, c_width)
    ref_grad = gradients(model, grpo_loss(ref, old, advantages, real) / tokens)
    logps, _ = shared_forward(model, share_prompts(input_ids, traces, c_width), y)
    shared_grad = gradients(model, grpo_loss(logps, old, advantages, real) / tokens)
    assert ((shared_grad - ref_grad).norm() / ref_grad.norm()).item() <= 1e-4
    split = [[0, 1, 2, 3], [4, 5, 6]]  # each micro-batch holds part of both groups
    micro = sum(
        gradients(
            model,
            grpo_loss(
                shared_forward(model, share_prompts(input_ids[m], [traces[b] for b in m], c_width), y[m])[0],
                old[m],
                advantages[m],
                real[m],
            )
            / tokens,  # TRL normalizes by the step's token count (num_items_in_batch)
        )
        for m in split
    )
    assert ((micro - ref_grad).norm() / ref_grad.norm()).item() <= 1e-4


def test_the_gather_back_to_trl_rows_has_the_same_gradient_every_time(batch):
    """Several completions read one kept column (the last prompt row; padding columns too), so the
    backward of ``completion_logits`` adds gradients into one column. It must add them in the same order
    every time: two threads adding with atomics made GRPO runs from the same start differ. Twenty
    backwards are bitwise equal, and equal a float64 sum of the gradients each column received."""
    input_ids, traces, c_width = batch
    shared = share_prompts(input_ids, traces, c_width)
    rows, keep, vocab = shared.input_ids.size(0), shared.logits_to_keep, 4096  # [R, keep, V]: any V
    logits = torch.randn(rows, keep, vocab, generator=torch.Generator().manual_seed(0), requires_grad=True)
    upstream = torch.randn(len(traces), c_width, vocab, generator=torch.Generator().manual_seed(1))
    expected = torch.zeros(rows, keep, vocab, dtype=torch.float64)
    for b in range(len(traces)):
        for j in range(c_width):  # the column completion b's token j is read from
            expected[shared.row[b], shared.logit_index[b, j]] += upstream[b, j].double()
    assert (shared.logit_index == 0).sum() > len(traces)  # columns are read more than once
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the order of a parallel add is what can change
    try:
        grads = [
            torch.autograd.grad((shared.completion_logits(logits) * upstream).sum(), logits)[0]
            for _ in range(20)
        ]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(g, grads[0]) for g in grads)
    assert torch.allclose(grads[0].double(), expected, rtol=0, atol=1e-4)


def test_a_mask_that_lets_completion_2_see_completion_1_fails_the_parity_check(small_model, batch):
    """The check above can fail: open completion 1's keys to completion 2's rows and the same parity
    measure exceeds its bound on completion 2 (and only there)."""
    input_ids, traces, c_width = batch
    shared = share_prompts(input_ids, traces, c_width)
    mask = shared.attention_mask.clone()  # [R, 1, T, T]
    w = max(t.layout.prompt_len for t in traces)  # prompts are left-padded to the widest; completions follow
    first, second = (len(traces[b].row_state) for b in (0, 2))  # row 0 holds completions 0, 2, 5
    c1, c2 = slice(w, w + first), slice(w + first, w + first + second)
    mask[0, 0, c2, c1] = True
    leaky = dataclasses.replace(shared, attention_mask=mask)
    with torch.no_grad():
        honest, _ = shared_forward(small_model, shared, targets(input_ids, c_width))
        leaked, _ = shared_forward(small_model, leaky, targets(input_ids, c_width))
        ref, _ = masked_completion_logps(small_model, input_ids, traces, c_width)
    real = real_tokens(traces, c_width)
    assert parity_gap(honest, ref, real) <= 1e-5
    assert parity_gap(leaked, ref, real) > 1e-5  # the isolation check fails
    others = real.clone()
    others[2] = False
    assert parity_gap(leaked, ref, others) <= 1e-5  # nothing else moved


@pytest.fixture
def selective_model(small_model, selective_attention):
    from rollouts.selective.attention import SELECTIVE

    model = copy.deepcopy(small_model).train()
    model.config.selective_attention = True
    model.set_attn_implementation(SELECTIVE)
    return model


def selective_run(model, input_ids, traces, c_width, shared=None, eviction_gradient="none"):
    """``(log-probs [B, C], L_mem, parameter gradients)`` of one GRPO-like loss under KV budgets and L_mem:
    one row per completion, or the packed rows ``shared``."""
    from rl.selective.losses import recorded_memory_loss
    from rollouts.selective.attention import AttentionState

    real = real_tokens(traces, c_width)
    width = input_ids.size(1) - c_width
    padding = torch.zeros(input_ids.shape, dtype=torch.bool)  # TRL's attention mask
    for b, trace in enumerate(traces):
        padding[b, width - trace.layout.prompt_len : width + len(trace.row_state)] = True
    state = AttentionState(  # prompts are 100+ tokens
        budgets=(24, 16), padding_mask=padding, tau=1.0, eviction_gradient=eviction_gradient
    )
    model.zero_grad(set_to_none=True)
    if shared is None:
        logps, _ = masked_completion_logps(model, input_ids, traces, c_width, heed_state=state)
    else:
        logps, _ = shared_forward(model, shared, targets(input_ids, c_width), heed_state=state)
    logps = logps.masked_fill(~real, 0.0)
    memory = recorded_memory_loss(state, padding.sum(-1), 0.1)
    (logps.sum() + memory).backward()
    return logps.detach(), memory.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_selective_policy_shares_the_prompt_with_each_completions_own_f(selective_model, batch):
    """A Selective Attention policy under KV budgets and L_mem: the shared rows give each completion the
    log-probs, the memory loss and the gradients of its own row, though F sums over every earlier row and
    the budgets evict by F. The same shared rows with every completion in one branch (F and the evictions
    carried from one completion into the next: the leak the branches prevent) fail the same check."""
    input_ids, traces, c_width = batch
    shared = share_prompts(input_ids, traces, c_width, "heed_selective")
    ref_logps, ref_memory, ref_grads = selective_run(selective_model, input_ids, traces, c_width)
    logps, memory, grads = selective_run(selective_model, input_ids, traces, c_width, shared)
    real = real_tokens(traces, c_width)
    assert parity_gap(logps, ref_logps, real) <= 1e-5
    assert abs(memory.item() - ref_memory.item()) <= 1e-6 * abs(ref_memory.item())
    for name, ref in ref_grads.items():
        assert ((grads[name] - ref).norm() / ref.norm()).item() <= 1e-4, name

    one_branch = dataclasses.replace(
        shared, branches=shared.branches.clamp(max=1), branch=torch.ones_like(shared.branch)
    )
    leaked, _, _ = selective_run(selective_model, input_ids, traces, c_width, one_branch)
    assert parity_gap(leaked, ref_logps, real) > 1e-3
    first = [g[0] for g in prompt_groups(traces)]  # each row's first completion has nothing before it to leak
    later = real.clone()
    later[first] = False
    assert parity_gap(leaked, ref_logps, real & ~later) <= 1e-5


def test_straight_through_eviction_shares_the_prompt_and_changes_only_the_gradients(selective_model, batch):
    """``eviction_gradient="straight_through"`` in the shared rows, as GRPO's update runs it: the log-probs
    and L_mem of the evicted forward, each completion's gradients those of its own row under the same
    setting, and gradients that differ from the evicted forward's (the evicted keys now get some)."""
    input_ids, traces, c_width = batch
    shared = share_prompts(input_ids, traces, c_width, "heed_selective")
    real = real_tokens(traces, c_width)
    hard_logps, hard_memory, hard_grads = selective_run(selective_model, input_ids, traces, c_width, shared)
    ref_logps, _, ref_grads = selective_run(
        selective_model, input_ids, traces, c_width, eviction_gradient="straight_through"
    )
    logps, memory, grads = selective_run(
        selective_model, input_ids, traces, c_width, shared, eviction_gradient="straight_through"
    )
    assert parity_gap(logps, hard_logps, real) <= 1e-5 and parity_gap(ref_logps, hard_logps, real) <= 1e-5
    assert abs(memory.item() - hard_memory.item()) <= 1e-6 * abs(hard_memory.item())
    changed = 0
    for name, ref in ref_grads.items():
        assert ((grads[name] - ref).norm() / ref.norm()).item() <= 1e-4, name
        changed += ((grads[name] - hard_grads[name]).norm() / hard_grads[name].norm()).item() > 1e-3
    assert changed >= len(ref_grads) // 2


def test_share_prompt_is_validated_and_accepted_for_selective_attention():
    """``grpo.share_prompt``: a bool or null (on), with the key in the message; a Selective Attention run
    takes either value."""
    from rl.config import ConfigError, load_run_config

    assert load_run_config(None).grpo.share_prompt is None
    with pytest.raises(ConfigError, match=r"grpo\.share_prompt: must be true or false"):
        load_run_config(None, ["grpo.share_prompt=sometimes"])
    for value in ("true", "false"):
        config = load_run_config("configs/tiny-selective.yaml", [f"grpo.share_prompt={value}"])
        assert config.grpo.share_prompt is (value == "true")

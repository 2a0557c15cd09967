"""SFT warm start under the DA mask: labels on the completion only, masks from the shared function."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data.prompts import layout_example
from rl.demo import acme_example
from rl.demo import gold_completion as acme_gold
from rl.logprobs import completion_logprobs, pack
from rl.model import TinyModelConfig, build_tiny_model
from rl.sft import (
    IGNORE_INDEX,
    DACollator,
    SFTConfig,
    bf16_kernels,
    encode_sft_row,
    length_grouped_order,
    train_sft,
)
from rollouts.masks import trace_completion
from rollouts.protocol import LayoutSettings, PromptLayout, token_bytes_table
from tests.conftest import small_model_config


def acme_rows(n: int) -> list[dict]:
    rows = []
    for seed in range(n):
        question, docs, founded, public = acme_example(num_chunks=4, chunk_words=30, seed=seed)
        rows.append(
            {
                "id": f"acme-{seed}", "question": question, "documents": docs, "chunk_tokens": 256,
                "gold_completion": acme_gold(founded, public, thinking=False),
                "gold_completion_thinking": acme_gold(founded, public, thinking=True),
            }
        )  # fmt: skip
    return rows


def test_collator_labels_completion_only(tokenizer):
    rows = [encode_sft_row(r, tokenizer) for r in acme_rows(2)]
    batch = DACollator(tokenizer)(rows)
    width = max(len(r["prompt_ids"]) for r in rows)
    seq_len = batch["input_ids"].shape[1]
    # logits are kept for the last rows only: the one predicting the first completion token and after
    assert batch["logits_to_keep"] == seq_len - width + 1
    assert batch["labels"].shape == (2, batch["logits_to_keep"])
    for b, row in enumerate(rows):
        labels = batch["labels"][b]  # labels[k] is the target of sequence position width - 1 + k
        assert labels[0] == IGNORE_INDEX  # the last prompt position is not a target
        n = len(row["completion_ids"])
        assert labels[1 : 1 + n].tolist() == row["completion_ids"]
        assert batch["input_ids"][b, width : width + n].tolist() == row["completion_ids"]
        assert (labels[1 + n :] == IGNORE_INDEX).all()
        assert row["completion_ids"][-1] == tokenizer.eos_token_id
    assert batch["attention_mask"].shape == (2, 1, batch["input_ids"].shape[1], batch["input_ids"].shape[1])


def test_rows_of_an_index_layout_train_under_the_index_mask(tokenizer):
    """The encoded row keeps the index region: a gold token written in index mode sees the index and no
    chunk, one written in focus sees its chunk and not the index (read off the layout's spans by hand)."""
    row = acme_rows(1)[0]
    row["gold_completion"] = row["gold_completion"].replace("global>", "index>")
    settings = LayoutSettings(index_entry_tokens=16)
    layout = layout_example(row, tokenizer, settings)
    encoded = encode_sft_row(row, tokenizer, settings)
    assert tuple(encoded["index_span"]) == layout.index_span and encoded["protocol_version"] == 3
    mask = DACollator(tokenizer)([encoded])["attention_mask"][0, 0]  # [T, T] bool, no left padding
    trace = trace_completion(layout, encoded["completion_ids"], token_bytes_table(tokenizer))
    seen = set()
    for j, state in enumerate(trace.row_state):
        mode = trace.states[state].mode
        row_keys = mask[layout.prompt_len + j]
        index_read = row_keys[slice(*layout.index_span)]
        chunk_read = [row_keys[s:e] for s, e in layout.chunk_spans]
        if mode == "index":
            assert index_read.all() and not any(c.any() for c in chunk_read), j
        elif mode == "focus":
            visible = trace.states[state].chunks
            assert not index_read.any(), j
            assert [c.all() for c in chunk_read] == [i in visible for i in range(1, layout.num_chunks + 1)], j
        seen.add(mode)
    assert {"index", "focus"} <= seen


def test_layout_mismatch_is_an_error(tokenizer):
    row = acme_rows(1)[0] | {"chunk_tokens": 8}  # documents longer than a chunk would shift evidence ids
    with pytest.raises(ValueError, match="evidence_chunks would point at the wrong chunks"):
        encode_sft_row(row, tokenizer)


def test_sft_raises_gold_likelihood_under_the_mask(tokenizer, token_table, tmp_path):
    rows = acme_rows(8)
    model = build_tiny_model(tokenizer, small_model_config())
    held_out = acme_rows(10)[8:]

    def gold_logp():
        encoded = [encode_sft_row(r, tokenizer) for r in held_out]
        traces = []
        for e in encoded:
            layout = PromptLayout(tuple(e["prompt_ids"]), 32, tuple(tuple(s) for s in e["chunk_spans"]))
            traces.append(trace_completion(layout, e["completion_ids"], token_table))
        packed = pack(traces, [e["completion_ids"] for e in encoded], tokenizer.pad_token_id)
        with torch.no_grad():
            return (completion_logprobs(model.eval(), packed).sum() / packed.completion_mask.sum()).item()

    before = gold_logp()
    config = SFTConfig(
        output_dir=str(tmp_path), max_steps=30, per_device_batch_size=4, warmup_steps=5, logging_steps=5
    )
    trainer = train_sft(model.train(), tokenizer, rows, config)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    after = gold_logp()
    assert losses[-1] < losses[0]
    assert after > before + 1.0, f"mean gold log-prob per token {before:.2f} -> {after:.2f}"


def test_bf16_sft_trains_as_float32_does(tokenizer, tmp_path):
    """``bf16=True`` puts the matmuls under bfloat16 autocast: the same steps from the same weights give
    losses within bf16's rounding of float32's, not equal to them (so autocast did run), and the weights
    stay float32."""
    rows = acme_rows(8)
    losses = {}
    for bf16 in (False, True):
        model = build_tiny_model(tokenizer, small_model_config())
        config = SFTConfig(
            output_dir=str(tmp_path / str(bf16)), max_steps=6, per_device_batch_size=4, warmup_steps=1,
            logging_steps=1, bf16=bf16,
        )  # fmt: skip
        trainer = train_sft(model.train(), tokenizer, rows, config)
        losses[bf16] = torch.tensor([h["loss"] for h in trainer.state.log_history if "loss" in h])
        assert next(model.parameters()).dtype == torch.float32
    assert len(losses[True]) == 6 and torch.allclose(losses[True], losses[False], rtol=0.02)
    if bf16_kernels():  # elsewhere SFT falls back to float32 (and says so)
        assert not torch.equal(losses[True], losses[False])


def test_selective_model_sft_adds_the_memory_loss(tokenizer, selective_attention, tmp_path):
    """A Selective Attention model's SFT loss is the DA-masked LM loss plus L_mem over the real tokens."""
    from rl.selective.losses import forward_with_memory_loss
    from rl.sft import MemoryLossTrainer, training_arguments
    from rollouts.selective.attention import SELECTIVE

    rows = [encode_sft_row(r, tokenizer) for r in acme_rows(2)]
    batch = DACollator(tokenizer, SELECTIVE, padding_mask=True)(rows)
    width = max(len(r["prompt_ids"]) for r in rows)
    for b, row in enumerate(rows):  # real tokens: the prompt right-aligned at `width`, then the completion
        start, end = width - len(row["prompt_ids"]), width + len(row["completion_ids"])
        assert batch["padding_mask"][b].nonzero()[:, 0].tolist() == list(range(start, end))

    model = build_tiny_model(tokenizer, small_model_config())
    model.config.selective_attention = True
    model.set_attn_implementation(SELECTIVE)
    config = SFTConfig(memory_eps=0.3, memory_tau=0.5, output_dir=str(tmp_path))
    trainer = MemoryLossTrainer(model=model, args=training_arguments(config), memory=config)
    with torch.no_grad():
        loss = trainer.compute_loss(model, dict(batch))
        inputs = {k: v for k, v in batch.items() if k != "padding_mask"}
        lm = model(**inputs).loss
        _, l_mem = forward_with_memory_loss(
            model, padding_mask=batch["padding_mask"], eps=0.3, tau=0.5, **inputs
        )
    assert 0 < l_mem.item() < 0.3
    assert loss.item() == pytest.approx(lm.item() + l_mem.item(), rel=1e-6)


def test_a_faded_in_selection_masks_nothing_before_its_step_and_all_from_its_end(
    tokenizer, selective_attention, tmp_path
):
    """``selection_from_step`` / ``selection_ramp_steps``: before the step a Selective Attention model's SFT
    loss is the same weights' loss under SDPA (transformers' own attention: an independent path), at the
    end of the ramp the paper's, and half-way up neither."""
    from rl.sft import MemoryLossTrainer, training_arguments
    from rollouts.selective.attention import SELECTIVE

    rows = [encode_sft_row(r, tokenizer) for r in acme_rows(2)]
    args = training_arguments(SFTConfig(output_dir=str(tmp_path)))  # not Trainer's default ./tmp_trainer
    standard = build_tiny_model(tokenizer, small_model_config())
    with torch.no_grad():
        plain = standard(**DACollator(tokenizer, "sdpa")(rows)).loss.item()
    model = build_tiny_model(tokenizer, small_model_config())  # the same weights (one seed)
    model.config.selective_attention = True
    model.set_attn_implementation(SELECTIVE)
    batch = DACollator(tokenizer, SELECTIVE, padding_mask=True)(rows)
    paper = MemoryLossTrainer(model=model, args=args, memory=SFTConfig(memory_eps=0.0))
    faded = MemoryLossTrainer(
        model=model,
        args=args,
        memory=SFTConfig(memory_eps=0.0, selection_from_step=4, selection_ramp_steps=4),
    )
    losses = {}
    with torch.no_grad():
        full = paper.compute_loss(model, dict(batch)).item()
        for step in (0, 3, 6, 8, 20):
            faded.state.global_step = step
            losses[step] = faded.compute_loss(model, dict(batch)).item()
    assert full != pytest.approx(plain, rel=1e-4)  # the selection changes this model's loss
    assert losses[0] == pytest.approx(plain, rel=1e-6) and losses[3] == pytest.approx(plain, rel=1e-6)
    assert losses[8] == pytest.approx(full, rel=1e-6) and losses[20] == pytest.approx(full, rel=1e-6)
    assert losses[6] not in (pytest.approx(plain, rel=2e-5), pytest.approx(full, rel=2e-5))


def test_the_copy_rows_fade_in_with_the_traces(tokenizer, selective_attention, tmp_path):
    """The copy rows a fade-in's step trains on run at that step's selection weight, as its traces do: at
    weight 0 their loss is the same weights' loss under SDPA (an independent path), at weight 1 the full
    selection's (a forward without ``heed_state``). A copy row trained under the full selection while the
    traces are not is a model no step trains."""
    from rl.copy_rows import ValueCopyRows, value_loss, with_copy_rows
    from rl.sft import MemoryLossTrainer, training_arguments
    from rollouts.selective.attention import SELECTIVE

    rows = ValueCopyRows.for_tokenizer(tokenizer, size=4, seed=1)
    batch = {k: torch.stack([rows[i][k] for i in range(4)]) for k in ("input_ids", "labels")}
    standard = build_tiny_model(tokenizer, small_model_config())
    model = build_tiny_model(tokenizer, small_model_config())  # the same weights (one seed)
    model.config.selective_attention = True
    model.set_attn_implementation(SELECTIVE)
    trainer = with_copy_rows(MemoryLossTrainer)(
        model=model,
        args=training_arguments(SFTConfig(output_dir=str(tmp_path))),
        memory=SFTConfig(memory_eps=0.0, selection_from_step=4, selection_ramp_steps=4),
        copy_rows=rows,
        copy_per_step=4,
    )
    traces = DACollator(tokenizer, SELECTIVE, padding_mask=True)(
        [encode_sft_row(r, tokenizer) for r in acme_rows(2)]
    )
    with torch.no_grad():
        plain = value_loss(standard, **batch).item()
        full = value_loss(model, **batch).item()
        losses = {}
        for step in (0, 8):
            trainer.state.global_step = step
            trainer.compute_loss(model, dict(traces))  # the traces' loss and, logged, the copy rows'
            losses[step] = trainer._copy_losses[-1]
    assert full != pytest.approx(plain, rel=1e-4)  # the selection changes these rows' loss
    assert losses[0] == pytest.approx(plain, rel=1e-6)
    assert losses[8] == pytest.approx(full, rel=1e-6)


def test_completion_loss_under_budgets(tokenizer, selective_attention):
    """The budget search's objective for a DA policy: with budgets the rows never reach it is the plain
    DA-masked SFT loss (an independent path: no eviction state at all); tight budgets change it."""
    from rl.selective.losses import completion_loss_under_budgets
    from rollouts.selective.attention import SELECTIVE

    rows = [encode_sft_row(r, tokenizer) for r in acme_rows(2)]
    batch = DACollator(tokenizer, SELECTIVE, padding_mask=True)(rows)
    model = build_tiny_model(tokenizer, small_model_config())
    model.config.selective_attention = True
    model.set_attn_implementation(SELECTIVE)
    with torch.no_grad():
        plain = model(**{k: v for k, v in batch.items() if k != "padding_mask"}).loss.item()
    longest = int(batch["padding_mask"].sum(-1).max())
    assert completion_loss_under_budgets(model, [batch], [longest, longest]) == pytest.approx(plain, rel=1e-6)
    assert completion_loss_under_budgets(model, [batch], None) == pytest.approx(plain, rel=1e-6)
    assert completion_loss_under_budgets(model, [batch], [8, 8]) != pytest.approx(plain, rel=1e-4)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.sampled_from([7, 9, 11]), min_size=1, max_size=60),
    batch_size=st.integers(1, 8),
    seed=st.integers(0, 3),
)
def test_length_grouped_order_is_a_permutation_of_single_length_batches(lengths, batch_size, seed):
    """Every whole batch holds one length; only the leftover rows (fewer than a batch of their length)
    come last, in any mix; each row appears once."""
    order = length_grouped_order(lengths, batch_size, seed)
    assert sorted(order) == list(range(len(lengths)))
    counts = {n: lengths.count(n) for n in set(lengths)}
    whole = sum(c - c % batch_size for c in counts.values())
    for start in range(0, whole, batch_size):
        assert len({lengths[i] for i in order[start : start + batch_size]}) == 1
    assert sorted(lengths[i] for i in order[whole:]) == sorted(
        n for n, c in counts.items() for _ in range(c % batch_size)
    )


def test_length_grouped_batches_are_not_sorted_by_length_or_trace():
    """transformers' group_by_length sorts each mega-batch by length; here 40 batches of two lengths come in
    an order that alternates far more than a sort would (a sorted order switches length once)."""
    lengths = [7] * 320 + [11] * 320
    order = length_grouped_order(lengths, 16, seed=0)
    firsts = [lengths[order[b * 16]] for b in range(40)]
    assert sum(a != b for a, b in itertools.pairwise(firsts)) >= 10


def test_sft_with_group_by_length_trains_on_single_length_batches(tokenizer, tmp_path):
    """Rows of two prompt sizes: the trainer reads its dataset in order (no sampler reshuffles it), every
    batch it collates holds one prompt size, and the run still trains."""
    from dataclasses import asdict

    from tests.data.helpers import generate

    rows = [
        asdict(generate(tokenizer, "niah_single", length, seed=s, chunk_tokens=27, trace_style="terse"))
        for length in (130, 250)
        for s in range(8)
    ]
    model = build_tiny_model(
        tokenizer,
        TinyModelConfig(
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=128,
        ),
    )
    config = SFTConfig(
        output_dir=str(tmp_path), max_steps=4, per_device_batch_size=4, logging_steps=1, group_by_length=True
    )
    trainer = train_sft(model.train(), tokenizer, rows, config)
    batches = list(trainer.get_train_dataloader())
    assert len(batches) == 4 and len(trainer.state.log_history) >= 4
    blocks = [len(encode_sft_row(r, tokenizer)["prompt_ids"]) // 32 for r in rows]
    assert len(set(blocks)) == 2
    seen = trainer.train_dataset["length"]  # the order the sequential sampler reads
    assert sorted(seen) == sorted(-(-len(encode_sft_row(r, tokenizer)["prompt_ids"]) // 32) for r in rows)
    assert all(len(set(seen[i : i + 4])) == 1 for i in range(0, 16, 4))
    # a batch of one prompt size pads no prompt row by a block or more
    for batch in batches:
        prompt_pad = (batch["input_ids"] == tokenizer.pad_token_id).int().argmin(1)
        assert int(prompt_pad.max()) < 32


def test_an_unmasked_row_trains_under_plain_causal_attention(tokenizer):
    """``unmasked`` rows (sft.unmasked_share) see every earlier real token at every position, as the da-nm
    eval decodes; the masked row beside it hides the chunks its focus excludes. The reference is built by
    hand: causal over the row's real tokens, padding excluded."""
    masked, unmasked = (encode_sft_row(r, tokenizer) for r in acme_rows(2))
    unmasked["unmasked"] = True
    batch = DACollator(tokenizer)([masked, unmasked])
    mask = batch["attention_mask"][:, 0]  # [B, T, T] True = may read
    width = max(len(masked["prompt_ids"]), len(unmasked["prompt_ids"]))
    start = width - len(unmasked["prompt_ids"])
    real = width + len(unmasked["completion_ids"])
    for q in range(width, real):  # completion rows of the unmasked row: exactly the real tokens so far
        expected = torch.zeros(mask.shape[-1], dtype=torch.bool)
        expected[start : q + 1] = True
        assert torch.equal(mask[1, q], expected), q
    hidden = [
        q
        for q in range(width, width + len(masked["completion_ids"]))
        if not mask[0, q, width - len(masked["prompt_ids"]) : q + 1].all()
    ]
    assert hidden, "the masked row's focus hides some chunk"


def test_sft_draws_its_unmasked_share_of_rows(tokenizer, tmp_path, monkeypatch):
    model = build_tiny_model(tokenizer, small_model_config())
    seen = []

    class Recording(DACollator):
        def __call__(self, rows):
            seen.extend(bool(r["unmasked"]) for r in rows)
            return super().__call__(rows)

    monkeypatch.setattr("rl.sft.DACollator", Recording)
    config = SFTConfig(max_steps=2, per_device_batch_size=8, unmasked_share=0.5, output_dir=str(tmp_path))
    train_sft(model, tokenizer, acme_rows(8), config)
    assert 0 < sum(seen) < len(seen)

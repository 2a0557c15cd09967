"""The reference engine against one dense forward: the trainer's path with its own explicit mask.

The reference decodes token by token with a KV cache and a per-step mask from VisibilityTracker; the
check runs the whole prompt + completion in a single forward with ``dense_training_mask`` (built from
``CompletionTrace`` rows, no tracker stepping, no cache). Agreement ties engine and trainer together.
"""

import logging

import numpy as np
import torch

from rollouts.engines import RolloutRequest, make_engine
from rollouts.engines.reference import ReferenceEngine
from rollouts.masks import dense_training_mask, mask_batch


def dense_logprobs(model, layout, completion, trace=None) -> np.ndarray:
    """log p(completion[j]) from one forward over prompt + completion; DA-masked when ``trace`` is given."""
    ids = torch.tensor([list(layout.input_ids) + list(completion)])
    kwargs = {}
    if trace is not None:
        batch = mask_batch([trace], [0], ids.shape[1])
        kwargs = {"attention_mask": dense_training_mask(batch), "position_ids": batch.position_ids}
    with torch.inference_mode():
        logp = model(input_ids=ids, **kwargs).logits[0].float().log_softmax(-1)
    rows = logp[layout.prompt_len - 1 : layout.prompt_len - 1 + len(completion)]
    return rows.gather(-1, torch.tensor(completion)[:, None])[:, 0].numpy()


def test_masked_decoding_equals_dense_masked_forward(reference_engine, reference_gold, acme):
    da = reference_gold["da"]
    want = dense_logprobs(reference_engine.model, acme.layout, acme.gold_ids, da.trace)
    assert np.abs(np.subtract(da.logprobs, want)).max() <= 1e-4
    assert da.extra["kv_tokens_engine"] == da.trace.kv_tokens.tolist()
    assert da.parsed.answer == "8 years" and not da.parsed.violations


def test_unmasked_modes_equal_causal_forward(reference_engine, reference_gold, acme):
    want = dense_logprobs(reference_engine.model, acme.layout, acme.gold_ids)
    for mode in ("da-nm", "vanilla"):
        run = reference_gold[mode]
        assert np.abs(np.subtract(run.logprobs, want)).max() <= 1e-4, mode
        assert run.extra["kv_tokens_engine"] == run.trace.kv_tokens_vanilla.tolist()


def test_eager_attention_takes_the_additive_mask(tiny_model_dir, tokenizer, reference_gold, acme):
    # Eager attention adds the mask to the scores; a boolean mask there would be silently wrong.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    (eager,) = ReferenceEngine(model, tokenizer, num_threads=1).generate(
        [RolloutRequest(acme.layout, "da", forced_ids=acme.gold_ids[:60])]
    )
    assert np.abs(np.subtract(eager.logprobs, reference_gold["da"].logprobs[:60])).max() <= 1e-4


def test_greedy_decoding_and_stopping(reference_engine, acme):
    (greedy,) = reference_engine.generate([RolloutRequest(acme.layout, "da", max_tokens=5)])
    want = dense_logprobs(reference_engine.model, acme.layout, greedy.completion_ids, greedy.trace)
    assert greedy.finish_reason == "length" and len(greedy.completion_ids) == 5
    assert np.abs(np.subtract(greedy.logprobs, want)).max() <= 1e-4
    # Each greedy token is the argmax under the mask it was predicted with: check the first one.
    with torch.inference_mode():
        logits = reference_engine.model(input_ids=torch.tensor([acme.layout.input_ids])).logits[0, -1]
    assert greedy.completion_ids[0] == int(logits.argmax())

    eos = reference_engine.tokenizer.eos_token_id
    forced_then_free = RolloutRequest(acme.layout, "da", forced_ids=acme.gold_ids[:3], max_tokens=6)
    (run,) = reference_engine.generate([forced_then_free])
    assert run.completion_ids[:3] == list(acme.gold_ids[:3])
    assert run.finish_reason == ("stop" if eos in run.completion_ids else "length")


def test_falls_back_with_a_warning_where_vllm_is_absent(tiny_model_dir, monkeypatch, caplog):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    with caplog.at_level(logging.WARNING, logger="rollouts.engines"):
        engine = make_engine(tiny_model_dir)
    assert isinstance(engine, ReferenceEngine)
    assert "vLLM is not installed" in caplog.text


def test_selective_model_decodes_what_one_replayed_forward_computes(
    tiny_model_dir, tokenizer, acme, selective_attention
):
    """A Selective Attention checkpoint with per-layer budgets: the engine (prefill replay, then eviction
    as masking, token by token, DA mask on top) against one dense forward over prompt + completion with
    the DA mask and the budgets replayed -- the trainer's path. Log-probs and per-layer reads agree."""
    from transformers import AutoModelForCausalLM

    from rollouts.selective.attention import SELECTIVE, AttentionState
    from rollouts.selective.eviction import save_budgets

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.config.selective_attention = True
    model.set_attn_implementation(SELECTIVE)
    # The prompt alone is 1197 tokens. Generous budgets would change nothing: the tokens evicted first are
    # the most masked, whose attention F has already driven to ~0.
    budgets = (48, 32, 64, 24)
    save_budgets(model.config, budgets)
    engine = ReferenceEngine(model, tokenizer, num_threads=1)
    completion = list(acme.gold_ids[:40])
    (run,) = engine.generate([RolloutRequest(acme.layout, "da", forced_ids=completion)])

    ids = torch.tensor([list(acme.layout.input_ids) + completion])
    batch = mask_batch([run.trace], [0], ids.shape[1])
    state = AttentionState(budgets=budgets)
    with torch.inference_mode():
        logits = model(
            input_ids=ids,
            attention_mask=dense_training_mask(batch),
            position_ids=batch.position_ids,
            heed_state=state,
        ).logits[0]
        unbudgeted = model(
            input_ids=ids, attention_mask=dense_training_mask(batch), position_ids=batch.position_ids
        ).logits[0]
    rows = slice(acme.layout.prompt_len - 1, acme.layout.prompt_len - 1 + len(completion))
    target = torch.tensor(completion)[:, None]
    want = logits.float().log_softmax(-1)[rows].gather(-1, target)[:, 0].numpy()
    without = unbudgeted.float().log_softmax(-1)[rows].gather(-1, target)[:, 0].numpy()
    assert np.abs(np.subtract(run.logprobs, want)).max() <= 1e-4
    # The budgets changed what was read (fp32 noise between the two paths is ~3e-6).
    assert np.abs(np.subtract(run.logprobs, without)).max() > 5e-4
    reads = torch.stack([state.kv_reads[layer][0, rows] for layer in range(4)], -1).numpy()
    assert run.kv_tokens_per_layer.tolist() == reads.tolist()
    assert (run.kv_tokens_per_layer <= np.array(budgets)).all()
    assert (run.kv_tokens_per_layer[:, 1] < np.asarray(run.extra["kv_tokens_engine"])).all()


def test_budgets_need_a_selective_model(reference_engine, tokenizer):
    import pytest

    with pytest.raises(ValueError, match="need a Selective Attention model"):
        ReferenceEngine(reference_engine.model, tokenizer, budgets=8)


def test_load_weights_takes_the_trainers_names_tied_ones_included(tiny_model_dir, tokenizer, acme):
    import pytest

    from ..conftest import perturbed_model

    engine = ReferenceEngine(tiny_model_dir, tokenizer, num_threads=1)
    stepped = perturbed_model(tiny_model_dir, seed=3)
    # what the trainer sends: every parameter by name, plus the tied lm_head (vLLM's loader wants it too)
    weights = [*stepped.named_parameters(), ("lm_head.weight", stepped.lm_head.weight)]
    engine.load_weights((name, t.detach().clone()) for name, t in weights)
    request = RolloutRequest(acme.layout, "da-nm", forced_ids=acme.gold_ids[:20])
    (run,) = engine.generate([request])
    want = dense_logprobs(stepped, acme.layout, acme.gold_ids[:20])
    assert np.abs(np.subtract(run.logprobs, want)).max() <= 1e-4
    with pytest.raises(KeyError, match=r"model\.layers\.99\.mlp"):
        engine.load_weights([("model.layers.99.mlp.weight", torch.zeros(1))])

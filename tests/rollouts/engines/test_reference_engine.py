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

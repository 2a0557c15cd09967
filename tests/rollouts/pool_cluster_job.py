"""A rollout pool joining an existing Ray cluster (``PoolConfig.ray_address``), with broadcast weight
updates, in its own process: the test session's Ray must not be connected anywhere else. Prints one
``RESULT {json}`` line.

    python -m tests.rollouts.pool_cluster_job RAY_ADDRESS OUT_DIR
"""

import json
import sys
from pathlib import Path

FORCED_TOKENS = 24  # a short teacher-forced prefix of the gold trace: enough to compare log-probs


def main(address: str, out: Path) -> None:
    import numpy as np
    import ray

    from data.tokenizer import build_tokenizer
    from rl.demo import acme_example, gold_completion
    from rollouts.engines import RolloutRequest
    from rollouts.engines.reference import ReferenceEngine
    from rollouts.pool import PoolConfig, RolloutPool
    from rollouts.protocol import build_prompt
    from tests.rollouts.conftest import BLOCK_SIZE, perturbed_model, save_tiny_qwen3

    tokenizer = build_tokenizer()
    model_dir = save_tiny_qwen3(out / "model", tokenizer)
    question, docs, founded, public = acme_example(num_chunks=4, chunk_words=40, seed=0)
    layout = build_prompt(question, docs, tokenizer, block_size=BLOCK_SIZE, chunk_tokens=160)
    gold = tokenizer(gold_completion(founded, public, thinking=False), add_special_tokens=False)["input_ids"]
    requests = [RolloutRequest(layout, "da", forced_ids=tuple(gold[:FORCED_TOKENS]))]

    assert not ray.is_initialized()
    pool = RolloutPool(
        PoolConfig(
            model_dir, num_actors=1, ray_address=address, weight_sync="broadcast", weight_sync_timeout_s=60,
            engine_kwargs={"dtype": "float32", "enforce_eager": True, "max_model_len": 2048, "max_num_seqs": 4},
            env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        )
    )  # fmt: skip
    try:
        cluster = ray.cluster_resources()
        (before,) = pool.generate(requests)
        new_model = perturbed_model(model_dir, seed=3)
        stats = pool.update_weights(new_model.state_dict())
        sync_address = pool.weight_sync_address
        (after,) = pool.generate(requests)
    finally:
        pool.shutdown()
        ray.shutdown()

    (want_old,) = ReferenceEngine(model_dir, num_threads=1).generate(requests)
    (want_new,) = ReferenceEngine(new_model, tokenizer, num_threads=1).generate(requests)

    def diff(a, b) -> float:
        return float(np.abs(np.subtract(a.logprobs, b.logprobs)).max())

    state = new_model.state_dict()
    result = {
        "cluster_resources": cluster,
        "sync_host": sync_address[0],
        "stats": stats.as_dict(),
        "expected_tensors": len(state),
        "expected_bytes": sum(t.numel() * t.element_size() for t in state.values()),
        "errors": [t.error for t in (before, after)],
        "same_tokens": [list(t.completion_ids) == list(w.completion_ids) for t, w in ((before, want_old), (after, want_new))],
        "before_vs_old": diff(before, want_old),
        "after_vs_new": diff(after, want_new),
        "after_vs_old": diff(after, want_old),
    }  # fmt: skip
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

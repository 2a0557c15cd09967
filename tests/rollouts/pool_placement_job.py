"""A rollout pool in its own placement group on the two-node test cluster (tests/rl/ray_cluster.py), losing
node B mid-batch. Runs in its own process: the test session's Ray must not be connected anywhere else.
Prints one ``RESULT {json}`` line.

    python -m tests.rollouts.pool_placement_job GCS_ADDRESS NODE_B_PGID OUT_DIR

Both nodes carry one ``heed_rollout`` (and node B alone ``heed_node_b``). In order:

1. two actors of ``{heed_node_b: 1}`` STRICT_SPREAD (one node has that resource): fails before any actor starts;
2. the pool: two actors of ``{CPU: 1, heed_rollout: 1}`` STRICT_SPREAD, broadcast weight sync, lands one
   actor on each node; a first update forms the group of both;
3. one more actor of that shape: the nodes could hold it but the pool holds every ``heed_rollout``, so it
   fails after ``placement_timeout_s``;
4. node B is lost while a batch is in flight on both actors: its actor process is frozen (SIGSTOP) before
   the batch is sent, then node B's process group (its raylet and agents) and that actor are killed.
   Killing the raylet alone is no node loss: its actor outlives it by about as long as it takes to decode
   its shard (2-2.5 s against 2.6 s here), so it could finish and answer, and its answer would rightly be
   kept. Frozen first, it answers nothing, as on a node that loses power. The replacement of that actor
   has no node to go to (STRICT_SPREAD: node A holds the other bundle), so after ``replace_timeout_s``
   the pool drops it and node A's actor answers the whole batch;
5. a broadcast update re-forms the group without the lost actor, and the next rollouts carry it.
"""

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

FORCED_TOKENS = 40  # a teacher-forced prefix of the gold trace per request
BATCH = 16  # requests decoding when node B goes (8 per actor: a couple of seconds of work each)
REPLACE_TIMEOUT_S = 8.0
PLACEMENT_TIMEOUT_S = 2.0


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main(address: str, node_b_pgid: int, out: Path) -> None:
    import numpy as np
    import ray

    from data.tokenizer import build_tokenizer
    from rl.demo import acme_example, gold_completion
    from rollouts.engines import RolloutRequest
    from rollouts.engines.reference import ReferenceEngine
    from rollouts.placement import PlacementError, rollout_nodes
    from rollouts.pool import PoolConfig, RolloutPool
    from rollouts.protocol import build_prompt
    from tests.faults import freeze, kill
    from tests.rollouts.conftest import BLOCK_SIZE, perturbed_model, save_tiny_qwen3

    warnings = Warnings()
    logging.getLogger("rollouts.pool").addHandler(warnings)
    tokenizer = build_tokenizer()
    model_dir = save_tiny_qwen3(out / "model", tokenizer)
    question, docs, founded, public = acme_example(num_chunks=4, chunk_words=40, seed=0)
    layout = build_prompt(question, docs, tokenizer, block_size=BLOCK_SIZE, chunk_tokens=160)
    gold = tokenizer(gold_completion(founded, public, thinking=False), add_special_tokens=False)["input_ids"]
    forced = tuple(gold[:FORCED_TOKENS])

    def requests(n: int) -> list:
        return [RolloutRequest(layout, "da", forced_ids=forced, example={"i": i}) for i in range(n)]

    def config(**overrides) -> PoolConfig:
        return PoolConfig(**{
            "model": model_dir, "num_actors": 2, "ray_address": address,
            "engine_kwargs": {"dtype": "float32", "enforce_eager": True, "max_model_len": 1536, "max_num_seqs": 8},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, **overrides,
        })  # fmt: skip

    result: dict = {}
    assert not ray.is_initialized()
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    result["rollout_nodes"] = sorted(k for k, r in nodes.items() if r.get("heed_rollout"))
    (node_b,) = [k for k, r in nodes.items() if r.get("heed_node_b")]
    result["node_b"] = node_b

    # 1. a shape the nodes can never hold
    started = time.monotonic()
    try:
        RolloutPool(config(resources_per_actor={"heed_node_b": 1}, placement="STRICT_SPREAD"))
    except PlacementError as err:
        result["impossible"] = {"error": str(err), "seconds": time.monotonic() - started}
    result["groups_after_impossible"] = len(ray.util.placement_group_table())  # nothing was reserved

    # 2. the pool
    started = time.monotonic()
    pool = RolloutPool(
        config(
            resources_per_actor={"heed_rollout": 1}, placement="STRICT_SPREAD", weight_sync="broadcast",
            weight_sync_timeout_s=60, replace_timeout_s=REPLACE_TIMEOUT_S,
        )
    )  # fmt: skip
    result["pool_start_seconds"] = time.monotonic() - started
    try:
        result["actor_nodes"] = rollout_nodes(pool)
        result["pids"] = ray.get([a.pid.remote() for a in pool.actors])
        pool.update_weights(perturbed_model(model_dir, seed=1).state_dict())
        result["group_before"] = list(pool.weight_sync_address)

        # 3. fits the nodes, not what is free
        started = time.monotonic()
        try:
            RolloutPool(
                config(
                    num_actors=1,
                    resources_per_actor={"heed_rollout": 1},
                    placement_timeout_s=PLACEMENT_TIMEOUT_S,
                )
            )
        except PlacementError as err:
            result["busy"] = {"error": str(err), "seconds": time.monotonic() - started}

        # 4. node B goes while both actors decode
        done: dict = {}

        def generate():
            try:
                done["out"] = pool.generate(requests(BATCH))
            except BaseException as err:
                done["error"] = repr(err)

        pid_b = result["pids"][result["actor_nodes"].index(node_b)]
        freeze(pid_b)  # from here on node B's engine runs nothing: its shard cannot be answered
        worker = threading.Thread(target=generate)
        started = time.monotonic()
        worker.start()
        time.sleep(0.5)  # both shards sent (sent later, B's would fail the same way); node A decodes
        os.killpg(node_b_pgid, signal.SIGKILL)
        kill(pid_b)
        worker.join(timeout=300)
        assert "out" in done, done.get("error", "generate did not return within 300s")
        out_b = done["out"]
        result["node_loss"] = {
            "seconds": time.monotonic() - started,
            "examples": [t.example["i"] for t in out_b],
            "errors": [t.error for t in out_b],
            "forced_ok": [tuple(t.completion_ids) == forced for t in out_b],
            "served_by": sorted({t.extra["actor_pid"] for t in out_b}),
            "num_alive": pool.num_alive,
            "lost_actors": pool.lost_actors,
            "bundles": pool.bundles,
            "warnings": warnings.messages,
        }
        # the same batch on the survivor alone, timed in this job: what the loss's bound scales with, so a
        # busy machine stretches both
        started = time.monotonic()
        alone = pool.generate(requests(BATCH))
        result["node_loss"]["survivor_alone_seconds"] = time.monotonic() - started
        result["node_loss"]["alone_errors"] = [t.error for t in alone]

        # 5. weights after the loss
        newer = perturbed_model(model_dir, seed=2)
        stats = pool.update_weights(newer.state_dict())
        after = pool.generate(requests(2))
        (want,) = ReferenceEngine(newer, tokenizer, num_threads=1).generate(requests(1))
        result["update_after_loss"] = {
            "tensors": stats.tensors,
            "expected_tensors": len(newer.state_dict()),
            "group": list(pool.weight_sync_address),
            "errors": [t.error for t in after],
            "served_by": sorted({t.extra["actor_pid"] for t in after}),
            "max_diff": max(float(np.abs(np.subtract(t.logprobs, want.logprobs)).max()) for t in after),
        }
        group = pool.placement_group
    finally:
        pool.shutdown()
    result["group_state_after_shutdown"] = ray.util.placement_group_table(group).get("state")
    ray.shutdown()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))

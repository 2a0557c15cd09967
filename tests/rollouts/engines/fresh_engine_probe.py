"""Run in a fresh interpreter by test_vllm_fresh_process.py: stock ``vllm.LLM`` with multiprocessing on.

Nothing here calls ``register()``: the plugin must arrive through the ``vllm.general_plugins`` entry
point in the engine-core process, as it does in production. The KV cache holds 16 blocks, so three
concurrent requests of 13 blocks each force preemption. Writes its findings as JSON to OUT_PATH (not
to stdout, where the engine's processes log concurrently).

    python -m tests.rollouts.engines.fresh_engine_probe MODEL_DIR COMPLETION_IDS_JSON OUT_PATH
"""

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPT_LEN = 96
CHUNK_SPANS = ((32, 64),)


def probe_layout():
    from rollouts.protocol import PromptLayout

    return PromptLayout(tuple((7 * i) % 1900 + 5 for i in range(PROMPT_LEN)), 32, CHUNK_SPANS)


def main(model_dir: str, completion: list[int], out_path: str) -> None:
    from vllm import LLM

    from rollouts.engines.da_args import da_request
    from rollouts.engines.forcing import FORCE_KEY

    llm = LLM(
        model=model_dir, dtype="float32", block_size=32, enforce_eager=True, max_model_len=448,
        max_num_seqs=4, num_gpu_blocks_override=16, enable_prefix_caching=False, async_scheduling=False,
        logits_processors=["rollouts.engines.forcing:ForcedTokensLogitsProcessor"],
    )  # fmt: skip
    layout = probe_layout()
    sampling = {"max_tokens": len(completion), "ignore_eos": True, "temperature": 0.0, "logprobs": 0}

    def run(mode: str, copies: int) -> list[list[float]]:
        batch = [
            da_request(layout, mode, extra_args={FORCE_KEY: completion}, **sampling) for _ in range(copies)
        ]
        outputs = llm.generate([p for p, _ in batch], [s for _, s in batch], use_tqdm=False)
        return [
            [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)] for o in outputs
        ]

    result = {
        "hooks_in_workers": llm.collective_rpc("heed_da_hooks_installed"),
        "da_single": run("da", 1)[0],
        "da_nm_preempted": run("da-nm", 3),
    }
    try:
        run("da", 3)
        result["da_preempted"] = "completed"
    except Exception as err:  # the engine core died of DAMaskLost; the client sees EngineDeadError
        result["da_preempted"] = type(err).__name__
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])

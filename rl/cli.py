"""The `heed` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn


def _protocol_demo(args: argparse.Namespace) -> int:
    from rl.demo import run_demo

    if args.chunks < 2:
        print(
            "heed: error: --chunks must be at least 2 (the demo puts two facts in different chunks)",
            file=sys.stderr,
        )
        return 2
    result = run_demo(args.chunks, args.chunk_words, args.block_size, args.thinking, args.seed)
    return 0 if not result["violations"] else 1


def _data_build(args: argparse.Namespace) -> int:
    from data.build import build_dataset
    from data.config import load_config
    from data.schema import DataError

    try:
        dataset = build_dataset(
            load_config(args.config), args.out, overwrite=args.overwrite, progress=not args.no_progress
        )
    except DataError as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2
    sizes = ", ".join(f"{name} {len(split)}" for name, split in dataset.items())
    print(f"wrote {args.out} ({sizes})")
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from rl.dashboard import print_summary, write_report
    from rl.dashboard.run_dir import RunReader

    if not Path(args.run_dir).is_dir():
        print(f"heed: error: run directory {args.run_dir} does not exist", file=sys.stderr)
        return 2
    if args.text:
        print_summary(RunReader(args.run_dir).read())
        return 0
    if args.wandb:
        from rl.dashboard.wandb_mirror import WandbMirror

        mirror = WandbMirror(args.run_dir, project=args.wandb_project, mode=args.wandb_mode)
        print(f"mirrored {mirror.sync()} steps to wandb ({args.wandb_mode})")
        mirror.finish()
        return 0
    out, run = write_report(args.run_dir, args.out, args.trajectory)
    print(f"wrote {out} ({len(run.metrics)} metric lines, {len(run.skipped)} skipped)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from rl.export import ExportError, export_checkpoint
    from rl.policy_settings import read_heed_json

    try:
        out = export_checkpoint(
            args.run_dir, args.out, step=args.step, overwrite=args.overwrite, phase=args.phase
        )
    except ExportError as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2
    source = read_heed_json(out)["source"]
    step = f" (step {source['step']})" if source["step"] is not None else ""
    print(f"exported {source['checkpoint']}{step} of {args.run_dir} to {out}")
    return 0


def _budgets(args: argparse.Namespace) -> int:
    from rl.selective.budgets import search_export_budgets

    try:
        result = search_export_budgets(
            args.checkpoint, args.data, split=args.split, examples=args.examples, batch_size=args.batch_size,
            step=args.step, tolerance=args.tolerance, write=args.write, min_step=args.min_step,
            judge=args.judge, max_tokens=args.max_tokens,
        )  # fmt: skip
    except ValueError as err:  # a bad export or split (rl.policy_settings.SettingsError among them)
        print(f"heed: error: {err}", file=sys.stderr)
        return 2
    # the accuracy judge minimised the error 1 - accuracy: shown as accuracy, its target a floor
    print(f"  full cache ({result.context} tokens a layer)  {result.measure} {result.shown(result.full):.4f}")
    if result.judge == "accuracy" and result.full >= 1.0:
        print(
            "heed: warning: the policy answers none of the examples with the full cache, "
            "so every budget keeps its accuracy: judge a policy that answers, on more examples",
            file=sys.stderr,
        )
    for budgets, value in result.steps:  # plain lines: one per accepted reduction, never wrapped
        print(f"  {list(budgets)}  {result.measure} {result.shown(value):.4f}")
    print(result.summary())
    if args.write:
        print(f"written to {args.checkpoint}/config.json and heed.json")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rl.console import console, route_framework_logs
    from rl.eval_requests import EvalError, parse_modes
    from rl.evaluate import eval_checkpoint, write_completions_jsonl, write_eval_json
    from rl.tables import print_table

    if args.run_dir and not Path(args.run_dir).is_dir():
        print(f"heed: error: run directory {args.run_dir} does not exist", file=sys.stderr)
        return 2
    out = Path(args.out or Path(args.checkpoint) / "eval.json")
    log = out.with_suffix(".log")  # vLLM's and Ray's messages, the engines' included; errors still print
    try:
        if Path(args.checkpoint).is_dir():  # (a missing one is refused below, without a folder made for it)
            import ray  # noqa: F401  (Ray adds its console handler on import: routed with the rest)

            route_framework_logs(None, log)
        report = eval_checkpoint(
            args.checkpoint,
            args.data,
            split=args.split,
            limit=args.limit,
            modes=parse_modes(args.modes),
            max_tokens=args.max_tokens,
            num_actors=args.num_actors,
            block_size=args.block_size,
            thinking=True if args.thinking else None,
            dtype=args.dtype,
            kv_cache_gib=args.kv_cache_gib,
            temperature=args.temperature,
            samples=args.samples,
            seed=args.seed,
            log_file=log,
        )
    except EvalError as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2
    # whole numbers at any width, piped or not, as heed train prints its tables (rl/console.py)
    what = f"{args.checkpoint} on {args.data} [{args.split}]"
    print_table(report.by_task_table(title=f"Eval of {what}: accuracy by task and context length"), console)
    print_table(report.summary_table(title="Eval: answers, every task and length"), console)
    print_table(report.reads_table(title="Eval: KV reads, every task and length"), console)
    step = report.meta.get("source_step") or 0
    written = []
    if args.run_dir:
        from rl.dashboard.run_dir import RunWriter

        name = args.name or f"{Path(args.checkpoint).name}-{args.split}"
        written.append(RunWriter(args.run_dir).write_eval(name, step, report.results()))
    written.append(write_eval_json(report, out, step))
    if args.completions:
        written.append(write_completions_jsonl(report, args.completions))
    print("wrote " + ", ".join(map(str, written)) + f"; logs: {log}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from rl.serving.command import ServeError, serve, take_kv_cache_gib

    try:
        kv_cache_gib, vllm_args = take_kv_cache_gib(args.vllm_args)  # given after EXPORT
        if args.kv_cache_gib is not None and kv_cache_gib is not None:
            raise ServeError("--kv-cache-gib is given twice: pass it once")
        return serve(
            args.export, vllm_args, kv_cache_gib=args.kv_cache_gib if kv_cache_gib is None else kv_cache_gib
        )
    except ServeError as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2


def _train(args: argparse.Namespace) -> int:
    from rl.config import ConfigError
    from rl.copy_check import CopyCheckFailed
    from rl.distributed import RankZeroFailed
    from rl.train import Terminated, train

    if args.resume and args.config:
        print("heed: error: --resume reads RUN_DIR/config.yaml; drop --config", file=sys.stderr)
        return 2
    overrides = list(args.overrides) + list(getattr(args, "phase_overrides", ()))
    try:
        config = _load_config_or_resume(args, overrides)
    except (ConfigError, FileNotFoundError) as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2
    try:
        train(config, resume=bool(args.resume))
    except (FileExistsError, FileNotFoundError) as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2
    except Terminated as err:
        print(f"heed: stopped: {err}", file=sys.stderr)
        return 143
    except CopyCheckFailed as err:
        print(f"heed: stopped before GRPO: {err}", file=sys.stderr)
        return 1
    except RankZeroFailed as err:  # this rank stopped because rank 0 did: its own report says why
        print(f"heed: stopped: {err}", file=sys.stderr)
        return 1
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    from rl.config import ConfigError
    from rl.pretrain import load_pretrain_config, pretrain

    try:
        config = load_pretrain_config(args.config, args.overrides)
        where = ("run_dir=", "out=")  # where a run writes is not its recipe
        recipe = [o for o in args.overrides if not o.startswith(where)]
        pretrain(
            config, resume=args.resume, command=" ".join(["heed pretrain --config", args.config, *recipe])
        )
    except (ConfigError, FileExistsError, FileNotFoundError) as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2
    return 0


def _load_config_or_resume(args: argparse.Namespace, overrides: list[str]):
    """The run config of `heed train` / `heed launch`: --config (or the default) or RUN_DIR/config.yaml."""
    from rl.config import load_run_config

    if not args.resume:
        return load_run_config(args.config, overrides)
    config_file = Path(args.resume) / "config.yaml"
    if not config_file.is_file():
        raise FileNotFoundError(f"{args.resume} holds no run to resume (no config.yaml)")
    config = load_run_config(config_file, overrides)
    # the folder resumed is the run, wherever it was first written: a copied or moved run continues in place
    config.run.output_dir = str(args.resume)
    return config


def _launch(args: argparse.Namespace) -> int:
    from rl.config import ConfigError
    from rl.launch import LaunchError, submit

    if args.resume and args.config:
        print("heed: error: --resume reads RUN_DIR/config.yaml; drop --config", file=sys.stderr)
        return 2
    try:
        config = _load_config_or_resume(args, list(args.overrides))
    except (ConfigError, FileNotFoundError) as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2
    try:
        return submit(
            config,
            address=args.address,
            config_file=None if args.resume else Path(args.config) if args.config else None,
            resume=bool(args.resume),
            wait=not args.no_wait,
        )
    except LaunchError as err:
        print(f"heed: error: {err}", file=sys.stderr)
        return 2


def _status(args: argparse.Namespace) -> int:
    from rl.launch import status

    return status(args.address, args.job_id, logs=args.logs)


def _stop(args: argparse.Namespace) -> int:
    from rl.launch import stop

    return stop(args.address, args.job_id)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heed", description="RL post-training for models that control their own attention."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    protocol = commands.add_parser("protocol", help="the Declarative Attention protocol")
    protocol_commands = protocol.add_subparsers(dest="protocol_command", required=True)
    demo = protocol_commands.add_parser(
        "demo", help="lay out an example, replay a gold completion, show the KV map"
    )
    demo.add_argument("--chunks", type=int, default=8, help="number of magic chunks (>= 2)")
    demo.add_argument("--chunk-words", type=int, default=150, help="filler words per chunk")
    demo.add_argument("--block-size", type=int, default=32, help="KV block size (vLLM CPU: a multiple of 32)")
    demo.add_argument(
        "--thinking", action="store_true", help="thinking-mode instructions and a <think> trace"
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_protocol_demo)

    data = commands.add_parser("data", help="long-context task datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    build = data_commands.add_parser(
        "build", help="generate and import examples into an HF DatasetDict folder with a dataset card"
    )
    build.add_argument(
        "--config", required=True, help="data config YAML (example: configs/data/default.yaml)"
    )
    build.add_argument("--out", required=True, help="output folder (load it with datasets.load_from_disk)")
    build.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    build.add_argument("--no-progress", action="store_true", help="no progress bar")
    build.set_defaults(func=_data_build)

    dashboard = commands.add_parser(
        "dashboard", help="a self-contained HTML report (or a terminal summary) of a run directory"
    )
    dashboard.add_argument(
        "run_dir", help="run directory (metrics.jsonl, trajectories/, eval/); may be running"
    )
    dashboard.add_argument("--out", help="HTML file to write (default: RUN_DIR/report.html)")
    dashboard.add_argument("--text", action="store_true", help="print a terminal summary instead")
    dashboard.add_argument(
        "--trajectory",
        action="append",
        default=[],
        help="trajectory id to draw (repeatable; default: 3 picks)",
    )
    dashboard.add_argument(
        "--wandb", action="store_true", help="mirror the run directory into wandb instead of writing HTML"
    )
    dashboard.add_argument("--wandb-project", default="heed", help="wandb project for --wandb")
    dashboard.add_argument(
        "--wandb-mode",
        default="offline",
        choices=("offline", "online"),
        help="offline (default) writes under RUN_DIR/wandb; online needs `wandb login`",
    )
    dashboard.set_defaults(func=_dashboard)

    export = commands.add_parser(
        "export", help="write a run's policy as a plain HF model folder with DA chat template and heed.json"
    )
    export.add_argument(
        "run_dir", help="run directory (sft/, checkpoints/checkpoint-N/, final/, config.yaml)"
    )
    export.add_argument(
        "--step", type=int, help="export checkpoints/checkpoint-N (default: final/, else newest, else sft/)"
    )
    export.add_argument(
        "--phase", help="export the policy a phase left: sft, budget_search, copy_warmup or final"
    )
    export.add_argument("--out", required=True, help="output folder (must be empty or absent)")
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    export.set_defaults(func=_export)

    evaluate = commands.add_parser(
        "eval", help="eval of a checkpoint under da / da-nm / vanilla, by task and context length"
    )
    evaluate.add_argument("checkpoint", help="model folder (a `heed export` output carries its DA settings)")
    evaluate.add_argument("--data", required=True, help="dataset folder from `heed data build`")
    evaluate.add_argument("--split", default="test", help="split to evaluate (default: test)")
    evaluate.add_argument(
        "--limit", type=int, help="at most N examples per task, spread over its context lengths"
    )
    evaluate.add_argument("--modes", default="da,da-nm,vanilla", help="comma-separated rollout modes")
    evaluate.add_argument("--max-tokens", type=int, default=128, help="generated tokens per example")
    evaluate.add_argument(
        "--temperature", type=float, default=0.0, help="0 (default): greedy; above 0: sampled completions"
    )
    evaluate.add_argument(
        "--samples", type=int, default=1, help="completions per example and mode (needs --temperature > 0)"
    )
    evaluate.add_argument(
        "--seed", type=int, default=0, help="seed of the first sampled request (then +1 each)"
    )
    evaluate.add_argument("--out", help="eval JSON to write (default: CHECKPOINT/eval.json)")
    evaluate.add_argument(
        "--completions",
        metavar="PATH",
        help="also write every completion to PATH as JSON lines, to read what the policy wrote (the eval JSON "
        "keeps the aggregates): one line per example, mode and sample with id, sample, task, "
        "mode, context_tokens, question, references, completion (the text), answer (parsed), correct, "
        "accuracy, compliance, reasons, focused_chunks, evidence_chunks, kv_tokens (read), kv_tokens_vanilla, "
        "decode_steps, finish_reason",
    )
    evaluate.add_argument("--run-dir", help="also write RUN_DIR/eval/NAME.json for `heed dashboard`")
    evaluate.add_argument("--name", help="eval name under --run-dir (default: <checkpoint folder>-<split>)")
    evaluate.add_argument("--num-actors", type=int, default=1, help="vLLM engines (Ray actors)")
    evaluate.add_argument(
        "--block-size", type=int, help="KV block size when the checkpoint has no heed.json (default 32)"
    )
    evaluate.add_argument(
        "--thinking", action="store_true", help="thinking-mode prompts when the checkpoint has no heed.json"
    )
    evaluate.add_argument("--dtype", help="vLLM dtype (default: float32 on CPU, auto on GPU)")
    evaluate.add_argument(
        "--kv-cache-gib", type=float, default=1.0, help="vLLM CPU KV cache per engine in GiB (CPU only)"
    )
    evaluate.set_defaults(func=_eval)

    served = commands.add_parser(
        "serve",
        help="vLLM's OpenAI-compatible server on an export: DA settings from heed.json, server-side layout, "
        "KV accounting per response and on /metrics (loopback unless --host is given)",
    )
    served.add_argument(
        "--kv-cache-gib", type=float, default=None,
        help="vLLM CPU KV cache in GiB (CPU only; default 4, or half the memory free on vLLM's NUMA node "
        "if less); may also come after EXPORT",
    )  # fmt: skip
    served.add_argument("export", help="a `heed export` folder")
    served.add_argument(
        "vllm_args", nargs=argparse.REMAINDER, help="any further `vllm serve` options (--port 8000, ...)"
    )
    served.set_defaults(func=_serve)

    budgets = commands.add_parser(
        "budgets",
        help="search per-layer KV budgets of an exported Selective Attention policy (greedy, paper section 4)",
    )
    budgets.add_argument("checkpoint", help="a `heed export` folder of a Selective Attention policy")
    budgets.add_argument("--data", required=True, help="dataset folder from `heed data build`")
    budgets.add_argument("--split", default="validation", help="search split (default: validation)")
    budgets.add_argument(
        "--judge", default="loss",
        help="what must stay within --tolerance of the full cache: 'loss', the gold traces' (fast), or "
        "'accuracy', the policy's own greedy answers, counted where the trace keeps the protocol (what users "
        "get; generates every example per candidate)",
    )  # fmt: skip
    budgets.add_argument(
        "--examples",
        type=int,
        default=16,
        help="examples the judge measures on, spread over the tasks and lengths",
    )
    budgets.add_argument("--max-tokens", type=int, default=64, help="completion length (--judge accuracy)")
    budgets.add_argument("--batch-size", type=int, default=4, help="traces per forward (--judge loss)")
    budgets.add_argument("--step", type=int, default=32, help="tokens one reduction takes off a layer (C)")
    budgets.add_argument(
        "--min-step", type=int, default=None,
        help="then go on with the step halved down to this (1: budgets to the token; default: --step)",
    )  # fmt: skip
    budgets.add_argument(
        "--tolerance", type=float, default=0.0,
        help="allowed loss increase over the full cache (0.01 = 1%%); with --judge accuracy, accuracy points "
        "it may lose (0.05 = 5 points)",
    )  # fmt: skip
    budgets.add_argument(
        "--write", action="store_true", help="store the budgets in config.json and heed.json"
    )
    budgets.set_defaults(func=_budgets)

    for name, help_text, phase_overrides in (
        (
            "train",
            "the whole job: data, SFT warm start, DA-masked GRPO, eval, export, dashboard "
            "(no --config: the embedded default configs/tiny.yaml, a tiny model on CPU)",
            (),
        ),
        (
            "sft",
            "the SFT warm start alone (train with grpo.enabled=false): data, SFT under the DA mask, eval, export",
            ("grpo.enabled=false",),
        ),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--config", help="run config YAML (default: the embedded configs/tiny.yaml)")
        sub.add_argument(
            "--resume",
            metavar="RUN_DIR",
            help="continue the run in RUN_DIR from its last complete checkpoint (uses RUN_DIR/config.yaml)",
        )
        sub.add_argument(
            "overrides", nargs="*", help="config overrides as dotted.key=value (e.g. grpo.max_steps=5)"
        )
        sub.set_defaults(func=_train, phase_overrides=phase_overrides)

    pretrain = commands.add_parser("pretrain", help="train Heed's base model from scratch (configs/base/)")
    pretrain.add_argument(
        "--config", default="configs/base/tiny-base.yaml", help="pretrain config YAML (default: %(default)s)"
    )
    pretrain.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint.pt")
    pretrain.add_argument(
        "overrides", nargs="*", help="config overrides as dotted.key=value (e.g. max_steps=10)"
    )
    pretrain.set_defaults(func=_pretrain)

    launch = commands.add_parser(
        "launch",
        help="run the train job as a Ray job on a Ray cluster (trainer ranks as a Ray Train worker group, "
        "rollout actors beside them); no --address: on a local Ray",
    )
    launch.add_argument("--config", help="run config YAML (default: the embedded configs/tiny.yaml)")
    launch.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (shared storage) from its last checkpoint",
    )
    launch.add_argument(
        "--address",
        help="the cluster's job server: http://HEAD:8265, or auto (the cluster this machine is in); "
        "default: start a local Ray for this job",
    )
    launch.add_argument("--no-wait", action="store_true", help="submit and return (needs --address)")
    launch.add_argument("overrides", nargs="*", help="config overrides as dotted.key=value")
    launch.set_defaults(func=_launch)

    status = commands.add_parser(
        "status", help="state of a `heed launch` job, or of every heed job on a cluster"
    )
    status.add_argument("job_id", nargs="?", help="the job id `heed launch` printed (default: list them)")
    status.add_argument(
        "--address", required=True, help="the cluster's job server (http://HEAD:8265 or auto)"
    )
    status.add_argument("--logs", action="store_true", help="also print the job's logs")
    status.set_defaults(func=_status)

    stop = commands.add_parser("stop", help="stop a `heed launch` job (resume it later with --resume)")
    stop.add_argument("job_id", help="the job id `heed launch` printed")
    stop.add_argument("--address", required=True, help="the cluster's job server (http://HEAD:8265 or auto)")
    stop.set_defaults(func=_stop)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def run() -> NoReturn:
    """The `heed` console script: :func:`main`, then the process's end. Where ``rl.distributed`` was
    imported (the commands that train) the process ends through its ``exit_process``, so that a finished
    job is not reported failed by gloo's teardown at interpreter exit; without a process group that is
    ``sys.exit`` as for every other command."""
    code = main()
    distributed = sys.modules.get("rl.distributed")
    if distributed is not None:
        distributed.exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    run()

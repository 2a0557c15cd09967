"""The `heed` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

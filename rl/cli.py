"""The `heed` command line."""

from __future__ import annotations

import argparse
import sys


def _protocol_demo(args: argparse.Namespace) -> int:
    from rl.demo import run_demo

    if args.chunks < 2:
        print("heed: error: --chunks must be at least 2 (the demo puts two facts in different chunks)", file=sys.stderr)
        return 2
    result = run_demo(args.chunks, args.chunk_words, args.block_size, args.thinking, args.seed)
    return 0 if not result["violations"] else 1


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

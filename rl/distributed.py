"""The trainer's ``torch.distributed`` lifetime.

DeepSpeed (through accelerate) initializes a default process group and never tears it down. Left to
interpreter exit, gloo's C++ worker threads can be destroyed while still joinable, and the process dies
with ``terminate called without an active exception`` (SIGABRT, exit -6) *after* the work succeeded —
an intermittent failure that makes a finished run look crashed. Every entry point that may have
trained under DeepSpeed calls :func:`release_process_group` on its way out.
"""

import torch.distributed as dist


def release_process_group() -> None:
    """Destroy the default process group if one exists (no-op otherwise, safe to call twice).

    No barrier: this also runs on the way out of a failed step, where a peer may already be gone."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

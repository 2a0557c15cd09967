"""Training jobs that the tests run in processes of their own (DeepSpeed initializes ``torch.distributed``,
which must not leak into the test session): how a test starts one, and how a job ends.

A job reports on stdout with lines that start with a tag (``LOSSES ``, ``RESULT ``) and ends with
:func:`end_job`. Ending skips the interpreter's teardown. Gloo and the rendezvous store keep C++
threads that can still be joinable when static destructors run, and then the process aborts with
``terminate called without an active exception`` (exit -6) after its work succeeded (see
``rl/distributed.py``). What these tests check is the work the job reported, not how torch tears down.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(module: str, *args: str, tag: str, timeout: float = 900) -> list[str]:
    """Run ``python -m module args...`` from the repository root; the payloads of its ``tag`` lines."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    reported = [line.removeprefix(tag) for line in out.stdout.splitlines() if line.startswith(tag)]
    assert out.returncode == 0, (
        f"{module} exited {out.returncode} after {len(reported)} {tag.strip()} line(s)\n{out.stderr[-4000:]}"
    )
    assert reported, f"{module} exited 0 without a {tag.strip()} line\n{out.stdout[-2000:]}"
    return reported


def end_job() -> NoReturn:
    """Release the process group, stop the local Ray the job started (what Ray's exit hook would do),
    flush what the job reported, and exit 0 without interpreter teardown."""
    from rl.distributed import release_process_group

    release_process_group()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

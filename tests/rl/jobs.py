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
import tempfile
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """``python -m module args...`` started from the repository root. Tests start the jobs they compare
    together and wait for each where they need it (:meth:`output`, :meth:`reported`), so that one job's
    start-up and waits overlap another's work."""

    def __init__(self, module: str, *args: str, tag: str = "", timeout: float = 900, env=None):
        self.module, self.tag, self.timeout = module, tag, timeout
        # files, not pipes: a job nobody reads yet must not block on a full pipe (closed once read)
        self.files = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=ROOT, stdout=self.files[0], stderr=self.files[1],
            text=True, env=env,
        )  # fmt: skip
        self._output: tuple[str, str] | None = None  # stdout, stderr

    def output(self) -> str:
        """The job's stdout, once it exited 0 (an assertion error with its output's tail otherwise)."""
        if self._output is None:
            try:
                self.proc.wait(timeout=self.timeout)
            finally:
                self.kill()
            self._output = tuple(_text(f) for f in self.files)
        stdout, stderr = self._output
        assert self.proc.returncode == 0, (
            f"{self.module} exited {self.proc.returncode}\n{stdout[-2000:]}\n{stderr[-4000:]}"
        )
        return stdout

    def reported(self) -> list[str]:
        """The payloads of the job's ``tag`` lines, once it exited 0."""
        stdout = self.output()
        reported = [line.removeprefix(self.tag) for line in stdout.splitlines() if line.startswith(self.tag)]
        assert reported, f"{self.module} exited 0 without a {self.tag.strip()} line\n{stdout[-2000:]}"
        return reported

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _text(file) -> str:
    file.seek(0)
    text = file.read()
    file.close()
    return text


def run_job(module: str, *args: str, tag: str, timeout: float = 900) -> list[str]:
    """Run ``python -m module args...`` from the repository root; the payloads of its ``tag`` lines."""
    return Job(module, *args, tag=tag, timeout=timeout).reported()


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

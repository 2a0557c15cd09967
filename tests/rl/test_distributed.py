"""rl.distributed.exit_process: a process that had a process group runs Python's exit handlers and then
skips the interpreter's teardown, where gloo's threads can abort a finished job; one that had none exits
as usual. Each case runs in a process of its own (a process group must not leak into the test session), its
group formed through a file (a TCP port picked beforehand can be taken before the job binds it)."""

import subprocess
import sys

import pytest

from tests.rl.jobs import ROOT

JOB = """
import atexit, os, sys
from pathlib import Path

import torch
import torch.distributed as dist

from rl.distributed import exit_process


class Finalized:  # a module global: only the interpreter's teardown deletes it
    def __del__(self, write=os.write):
        write(2, b"interpreter teardown\\n")


marker = Finalized()
out = Path(sys.argv[1])
atexit.register(lambda: out.write_text("atexit ran"))
if sys.argv[2] == "group":
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[3]}", rank=0, world_size=1)
    dist.all_reduce(torch.ones(1))
print("reported", end="")  # no newline, no flush: exiting must flush it
exit_process(int(sys.argv[4]))
"""


@pytest.mark.parametrize("group,code", [("group", 0), ("group", 3), ("none", 3)])
def test_exit_process_keeps_the_code_the_output_and_the_exit_handlers(tmp_path, group, code):
    marker = tmp_path / "atexit.txt"
    out = subprocess.run(
        [sys.executable, "-c", JOB, str(marker), group, str(tmp_path / "rendezvous"), str(code)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == code, out.stderr[-2000:]
    assert out.stdout == "reported"
    assert marker.read_text() == "atexit ran"
    # after a process group nothing of the interpreter's teardown runs; without one all of it does
    assert ("interpreter teardown" in out.stderr) == (group == "none"), out.stderr[-2000:]

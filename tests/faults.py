"""Process faults for the fault tests, without races: a process is frozen before the work it must not
finish is sent to it, and killed afterwards.

Killing a process "while it works" by sleeping first and signalling after is a race: the work may finish
inside the sleep (or before the signal takes effect), and then the product rightly keeps its answer and
the test fails. A frozen process (SIGSTOP) keeps its sockets, so calls sent to it are in flight, but it
runs nothing more, so no answer can leave it; SIGKILL ends it frozen. That is what a lost machine does:
every process on it stops at one instant, mid-call.
"""

import contextlib
import os
import signal


def freeze(pid: int) -> None:
    """Stop ``pid`` where it is (SIGSTOP): from now on it computes and answers nothing."""
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    """Let a frozen ``pid`` run on (SIGCONT)."""
    os.kill(pid, signal.SIGCONT)


def kill(pid: int) -> None:
    """SIGKILL ``pid``, frozen or not; one that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)

"""The fused Triton Selective Attention forward: its cases (kernel_cases.py) in a process with
Triton's interpreter on, and the kernel switch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]


def _run(args, **env):
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}
    )


def test_kernel_cases_in_the_interpreter():
    cases = Path(__file__).with_name("kernel_cases.py")
    result = _run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "python_files=*_cases.py", str(cases)],
        TRITON_INTERPRET="1",
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout


def test_unknown_kernel_is_an_error(monkeypatch):
    from rollouts.selective.attention import kernel_from_env

    monkeypatch.setenv("HEED_SELECTIVE_KERNEL", "triton")
    assert kernel_from_env() == "triton"
    monkeypatch.delenv("HEED_SELECTIVE_KERNEL")
    assert kernel_from_env() == "dense"
    monkeypatch.setenv("HEED_SELECTIVE_KERNEL", "cuda-graphs")  # read at each call: no process needed
    with pytest.raises(
        ValueError, match="HEED_SELECTIVE_KERNEL must be one of dense, triton, got 'cuda-graphs'"
    ):
        kernel_from_env()

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


def test_tiles_fit_a_hopper_programs_shared_memory():
    """Rows per tile as measured on an H200 (bench/BENCHMARKS.md, "The GPU check"): a bf16 backward at
    head_dim 128 asked 257 KiB at 64 rows, an fp32 forward 273 KiB, against 227 KiB."""
    import torch

    from rollouts.selective.kernel import tile_rows

    assert [tile_rows(d, torch.bfloat16) for d in (32, 64, 128)] == [64, 64, 64]
    assert [tile_rows(d, torch.bfloat16, backward=True) for d in (32, 64, 128)] == [64, 64, 32]
    assert [tile_rows(d, torch.float32) for d in (64, 128)] == [64, 32]
    assert [tile_rows(d, torch.float32, backward=True) for d in (64, 128)] == [64, 16]


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

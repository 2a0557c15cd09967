"""The run's environment record: what changes a run's numbers below the code."""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import torch

from rl.environment import _cpuinfo, cpu_model, describe, simd_flags

CPUINFO = """processor	: 0
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512_bf16 amx_tile ht lm
processor	: 1
model name	: Another CPU
flags		: fpu avx512vnni
"""


def test_the_first_cpus_vector_flags_and_model():
    assert simd_flags(CPUINFO) == [
        "amx_tile", "avx", "avx2", "avx512_bf16", "avx512f", "f16c", "fma", "sse4_1", "sse4_2",
    ]  # fmt: skip
    assert cpu_model(CPUINFO) == "Intel(R) Xeon(R) Platinum 8480+"
    assert simd_flags("processor : 0\n") == []


def test_describe_names_the_installed_stack_and_is_json():
    env = json.loads(json.dumps(describe()))
    assert env["packages"]["torch"] == importlib.metadata.version("torch") == torch.__version__
    assert env["packages"]["transformers"] == importlib.metadata.version("transformers")
    assert env["torch_threads"] == torch.get_num_threads() and env["cores"] >= 1
    assert "not-a-package" not in env["packages"]


@pytest.mark.skipif("avx2" not in simd_flags(_cpuinfo()), reason="the CPU has no AVX2")
def test_describe_names_the_kernels_aten_cpu_capability_chose():
    """``ATEN_CPU_CAPABILITY=avx2`` runs another set of kernels on an AVX-512 machine, and with it other
    rounding: the file must tell such a run from one on the CPU's own kernels."""
    code = "import json; from rl.environment import describe; print(json.dumps(describe()))"
    env = os.environ | {"ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1])["torch_cpu_capability"] == "AVX2"

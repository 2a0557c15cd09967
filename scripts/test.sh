#!/usr/bin/env bash
# The test command: set up .venv (idempotent) and run the whole suite, integration tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
export WANDB_MODE=${WANDB_MODE:-offline}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"

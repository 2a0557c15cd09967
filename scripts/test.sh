#!/usr/bin/env bash
# The test command: set up .venv (idempotent) and run the whole suite, integration tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh
# The dashboard's browser test opens the report in headless Chromium (Debian's package). Without it the
# test is skipped with its reason, and fails under CI=true (.ci/run); as root (CI) it is installed here.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
        >/dev/null 2>&1 || echo "chromium could not be installed; the browser test will be skipped (and fail under CI=true)"
fi
# Every process the tests start finds this environment's tools first: DeepSpeed JIT-builds its CPU
# communication op with the `ninja` on PATH, and this environment's ninja and a system one record build
# commands differently, so a mix rebuilds the op (about a minute) each time the other one runs it.
export PATH="$PWD/.venv/bin:$PATH"
export HEED_ARTIFACTS_DIR=${HEED_ARTIFACTS_DIR:-$PWD/runs/ci-artifacts}
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
export WANDB_MODE=${WANDB_MODE:-offline}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"

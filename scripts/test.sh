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
# Two pytest processes side by side (tests/conftest.py --tier): the real-stack tests (marked slow: vLLM,
# Ray, DeepSpeed and multi-process jobs, sharing one engine and one cluster in file order) and the unit
# tests. The real stack's jobs leave a core idle much of the time; the unit tests fill it, on one thread
# so as not to fight those jobs for the cores. Their output follows the real stack's. Exit status 5 is a
# tier with nothing selected (a subset given in "$@").
unit_log=$(mktemp)
OMP_NUM_THREADS=1 .venv/bin/python -m pytest --tier=unit -p no:cacheprovider "$@" >"$unit_log" 2>&1 &
unit=$!
trap 'kill "$unit" 2>/dev/null || true; rm -f "$unit_log"' EXIT
stack_rc=0
.venv/bin/python -m pytest --tier=real-stack "$@" || stack_rc=$?
unit_rc=0
wait "$unit" || unit_rc=$?
echo "=============================== the unit tests ==============================="
cat "$unit_log"
for rc in "$stack_rc" "$unit_rc"; do
    if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
[ "$stack_rc" = 5 ] && [ "$unit_rc" = 5 ] && exit 5
exit 0

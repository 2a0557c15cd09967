#!/usr/bin/env bash
# Hunt flaky tests: run the real-stack tiers (the tests marked `slow`: vLLM, Ray, DeepSpeed, multi-process)
# again and again while CPU-heavy processes run beside them, as CI meets on a shared machine. Stops at the
# first failing pass. Each pass's log is kept in runs/loop/pass-K.log.
#
#   bash scripts/loop_under_load.sh [PASSES] [PYTEST ARGS...]     # defaults: 20 passes of `-m slow`
#   HEED_LOOP_LOAD=2 bash scripts/loop_under_load.sh 5 tests/rollouts/test_pool.py
#
# HEED_LOOP_LOAD: how many busy processes run beside the tests (default 1: one core of two taken).
set -euo pipefail
cd "$(dirname "$0")/.."
PASSES=${1:-20}
shift || true
[ $# -gt 0 ] || set -- -m slow
mkdir -p runs/loop
bash scripts/setup_venv.sh >/dev/null

load=()
for _ in $(seq "${HEED_LOOP_LOAD:-1}"); do
    .venv/bin/python -c "while True: sum(i * i for i in range(10_000))" &
    load+=($!)
done
trap 'kill "${load[@]}" 2>/dev/null || true' EXIT

for pass in $(seq "$PASSES"); do
    started=$(date +%s)
    if CI=true bash scripts/test.sh -q -p no:cacheprovider "$@" >"runs/loop/pass-$pass.log" 2>&1; then
        echo "pass $pass/$PASSES: passed in $(($(date +%s) - started)) s"
    else
        echo "pass $pass/$PASSES: FAILED after $(($(date +%s) - started)) s; see runs/loop/pass-$pass.log"
        grep -E "^(FAILED|ERROR) " "runs/loop/pass-$pass.log" || tail -20 "runs/loop/pass-$pass.log"
        exit 1
    fi
done
echo "$PASSES passes in a row under a load of ${HEED_LOOP_LOAD:-1} busy process(es)"

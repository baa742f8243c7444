#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of the compressor backward's tuned configs at the
# V4-Flash shapes: registers, each SASS loop's instructions and the memory barriers (MEMBAR) of the
# dape atomics (one a relaxed add does not need). Same Triton 3.6 venv as
# bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_compressor_atomics.sh [OUT_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
json=${1:-bench/results/2026-12-03f-h200/offline-sm90-compressor-atomics.json}
out=$(dirname "$json")
source bench/offline_sm90_run.sh
run "$json" compressor_bwd v4-flash

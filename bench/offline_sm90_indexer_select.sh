#!/usr/bin/env bash
# Offline sm_90 compiles of the indexer's selection, the bisection against the interpolating
# threshold search (SELECT_INTERP), one row a program over two and four warps, at every indexer
# shape: registers and the instructions of the pass loop. Same Triton 3.6 venv as
# bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36; that script creates it).
# Usage: bash bench/offline_sm90_indexer_select.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-02e-h200}
source bench/offline_sm90_run.sh

run "$out/offline-sm90-indexer-select.json" indexer_fwd v4-flash,v4-pro --configs '{
  "bisection_w2": {"SELECT_ROWS": 1, "SELECT_WARPS": 2, "SELECT_INTERP": 0},
  "interpolating_w2": {"SELECT_ROWS": 1, "SELECT_WARPS": 2, "SELECT_INTERP": 1},
  "bisection_w4": {"SELECT_ROWS": 1, "SELECT_WARPS": 4, "SELECT_INTERP": 0},
  "interpolating_w4": {"SELECT_ROWS": 1, "SELECT_WARPS": 4, "SELECT_INTERP": 1}}'

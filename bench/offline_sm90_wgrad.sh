#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) behind the 2026-12-04d write-up's weight-gradient
# section: the expert weight-gradient GEMMs (dW13 of the up GEMM, dW2 of the down GEMM, whose
# token operand is scaled by the routing weight in registers) at the V4-Flash EP = 8 shape,
# balanced load, with the heuristic default (128 x 128 tiles, 64 tokens a step, 8 warps, 3 stages)
# and neighbours: registers, spills, shared memory, warpgroup MMAs and, per SASS loop, the
# warpgroup-MMA waits (one after every MMA where ptxas serialized them).
# Same Triton 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_wgrad.sh [OUT_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
json=${1:-bench/results/2026-12-04d-h200/offline-sm90-wgrad.json}
out=$(dirname "$json")
source bench/offline_sm90_run.sh

run "$json" expert_up_bwd_dw,expert_down_bwd_dw v4-flash --only tokens=24576,experts=32,hidden=4096,ffn=2048,skew=0 \
  --configs '{"default": {}, "2 stages": {"num_stages": 2}, "4 stages": {"num_stages": 4},
  "32 tokens a step": {"BLOCK_K": 32}, "128 tokens a step, 2 stages": {"BLOCK_K": 128, "num_stages": 2},
  "4 warps, 64 columns": {"num_warps": 4, "BLOCK_N": 64}}'

#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of the glue forward at 4,096 tokens with its gates in
# the last split program (FUSED_GATES 1) beside the three-launch form (0), the committed tiling:
# registers, spills, each SASS loop's instructions and memory barriers. Same Triton 3.6 venv as
# bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_glue_fused_gates.sh [OUT_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
json=${1:-bench/results/2026-12-03f-h200/offline-sm90-glue-fused-gates.json}
out=$(dirname "$json")
source bench/offline_sm90_run.sh

tiling='"BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 8, "num_warps": 4, "num_stages": 3, "maxnreg": null'
run "$json" mhc_glue_fwd v4-flash --only tokens=4096 --configs "{
  \"three_launches\": {$tiling, \"FUSED_GATES\": 0},
  \"fused_gates\": {$tiling, \"FUSED_GATES\": 1}}"

#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of the indexer's Gluon scoring (GLUON 1) at each
# tiling and q ring depth, Flash sequence 4,096: registers, spills, shared memory, each SASS
# loop's instructions, CTA barriers and warpgroup-MMA waits (WARPGROUP.DEPBAR: one after every
# HGMMA where ptxas serialized the MMAs). The figures the 2026-12-03e write-up cites. Same Triton
# 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_indexer_gluon.sh [OUT_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
json=${1:-bench/results/2026-12-03e-h200/offline-sm90-indexer-gluon.json}
out=$(dirname "$json")
source bench/offline_sm90_run.sh

gluon='"BLOCK_S": 64, "BLOCK_H": 1, "KEY_TILES": 1, "LATE_HEAD_SUM": 0, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 1,
  "SELECT_ROWS": 1, "SELECT_WARPS": 2, "SELECT_INTERP": 1, "maxnreg": null'
run "$json" indexer_fwd v4-flash --only seq=4096 --configs "{
  \"t128_s3\": {$gluon, \"BLOCK_T\": 128, \"num_warps\": 4, \"num_stages\": 3},
  \"t128_s4\": {$gluon, \"BLOCK_T\": 128, \"num_warps\": 4, \"num_stages\": 4},
  \"t128_s5\": {$gluon, \"BLOCK_T\": 128, \"num_warps\": 4, \"num_stages\": 5},
  \"t256_s3\": {$gluon, \"BLOCK_T\": 256, \"num_warps\": 8, \"num_stages\": 3},
  \"t256_s4\": {$gluon, \"BLOCK_T\": 256, \"num_warps\": 8, \"num_stages\": 4}}"

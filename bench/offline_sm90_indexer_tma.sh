#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of the indexer scoring by TMA descriptors against
# pointer loads: registers, shared memory and the instructions of each SASS loop (the head loop
# first). Same Triton 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_indexer_tma.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-02f-h200}
source bench/offline_sm90_run.sh

run "$out/offline-sm90-indexer-tma.json" indexer_fwd v4-pro --only seq=8192 --configs '{
  "one_head_64x256_w8_pointers": {"BLOCK_S": 64, "BLOCK_H": 1, "BLOCK_T": 256, "KEY_TILES": 1, "LATE_HEAD_SUM": 0,
                                  "num_warps": 8, "num_stages": 3, "TMA": 0},
  "one_head_64x256_w8_tma": {"BLOCK_S": 64, "BLOCK_H": 1, "BLOCK_T": 256, "KEY_TILES": 1, "LATE_HEAD_SUM": 0,
                             "num_warps": 8, "num_stages": 3, "TMA": 1},
  "two_heads_32x128_w8_pointers": {"BLOCK_S": 32, "BLOCK_H": 2, "BLOCK_T": 128, "KEY_TILES": 1, "LATE_HEAD_SUM": 1,
                                   "num_warps": 8, "num_stages": 3, "maxnreg": 232, "TMA": 0},
  "two_heads_32x128_w8_tma": {"BLOCK_S": 32, "BLOCK_H": 2, "BLOCK_T": 128, "KEY_TILES": 1, "LATE_HEAD_SUM": 1,
                              "num_warps": 8, "num_stages": 3, "maxnreg": 232, "TMA": 1}}'

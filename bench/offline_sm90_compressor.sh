#!/usr/bin/env bash
# Offline sm_90 compiles of the compressor tiles behind its spaces' register bounds (the 2026-12-02c
# change): values a thread of the forward's window tile against the registers they take, and the
# backward on one warp. Same Triton 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default
# /tmp/triton36; that script creates it).
# Usage: bash bench/offline_sm90_compressor.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-02c-h200}
source bench/offline_sm90_run.sh

# values a thread: BLOCK_G x window (8 CSA, 128 HCA) x BLOCK_D / (32 num_warps)
run "$out/offline-sm90-compressor-fwd.json" compressor_fwd v4-flash --only seq=4096 --configs '{
  "g1_d16_w4": {"BLOCK_G": 1, "BLOCK_D": 16, "num_warps": 4, "num_stages": 1},
  "g1_d16_w2": {"BLOCK_G": 1, "BLOCK_D": 16, "num_warps": 2, "num_stages": 1},
  "g1_d16_w1": {"BLOCK_G": 1, "BLOCK_D": 16, "num_warps": 1, "num_stages": 1},
  "g1_d32_w1": {"BLOCK_G": 1, "BLOCK_D": 32, "num_warps": 1, "num_stages": 1},
  "g4_d64_w1": {"BLOCK_G": 4, "BLOCK_D": 64, "num_warps": 1, "num_stages": 1},
  "g2_d128_w1": {"BLOCK_G": 2, "BLOCK_D": 128, "num_warps": 1, "num_stages": 1}}'
run "$out/offline-sm90-compressor-bwd.json" compressor_bwd v4-flash --only "seq=4096,ratio=4," --configs '{
  "g2_d64_w2": {"BLOCK_G": 2, "BLOCK_D": 64, "SLABS": 128, "DAPE_ATOMIC": 1, "num_warps": 2, "num_stages": 1},
  "g2_d64_w1": {"BLOCK_G": 2, "BLOCK_D": 64, "SLABS": 128, "DAPE_ATOMIC": 1, "num_warps": 1, "num_stages": 1},
  "g2_d32_w1": {"BLOCK_G": 2, "BLOCK_D": 32, "SLABS": 128, "DAPE_ATOMIC": 1, "num_warps": 1, "num_stages": 1}}'

#!/usr/bin/env bash
# The offline sm_90 compiles the 2026-12-02c write-up cites: the attention forward's tuned HCA and
# CSA tilings with and without a tail tile (TAIL_K), and the compressor tiles behind its spaces'
# register bounds (values a thread of the forward's window tile against the registers they take,
# and the backward on one warp). Same Triton 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default
# /tmp/triton36; that script creates it).
# Usage: bash bench/offline_sm90_tail_and_compressor.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-02c-h200}
source bench/offline_sm90_run.sh

# each layer type's tuned tiling (kernels/tables/sm_90.json, 2026-12-02c) with and without the tail
run "$out/offline-sm90-attention-fwd-tail-hca.json" sparse_attn_fwd v4-flash --only "seq=4096,heads=64,ratio=128," --configs '{
  "no_tail": {"BLOCK_H": 64, "TILE_K": 64, "TAIL_K": 0, "num_warps": 8, "num_stages": 2, "RESCALE_SLACK": 0},
  "tail_32": {"BLOCK_H": 64, "TILE_K": 64, "TAIL_K": 32, "num_warps": 8, "num_stages": 2, "RESCALE_SLACK": 0}}'
run "$out/offline-sm90-attention-fwd-tail-csa.json" sparse_attn_fwd v4-flash --only "seq=4096,heads=64,ratio=4," --configs '{
  "no_tail": {"BLOCK_H": 64, "TILE_K": 64, "TAIL_K": 0, "num_warps": 8, "num_stages": 1, "RESCALE_SLACK": 0},
  "tail_32": {"BLOCK_H": 64, "TILE_K": 64, "TAIL_K": 32, "num_warps": 8, "num_stages": 1, "RESCALE_SLACK": 0}}'

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

#!/usr/bin/env bash
# The offline sm_90 compiles the 2026-12-01 evening write-up cites (bench/2026-12-01-h200-transposed-variants.md):
# the committed attention-backward entries, the indexer's one-warp selection and 512-entry key
# tiles, and a 32-column glue backward. Same Triton 3.6 venv as bench/offline_sm90_compiles.sh
# (VENV, default /tmp/triton36; that script creates it).
# Usage: bash bench/offline_sm90_followups.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-01-h200-c}
source bench/offline_sm90_run.sh

run "$out/offline-sm90-attention-bwd-resources.json" sparse_attn_bwd v4-flash,v4-pro --only seq=4096
# Configs are applied over each shape's default; the selection kernel does not depend on the scoring's.
run "$out/offline-sm90-indexer-select-one-warp.json" indexer_fwd v4-flash,v4-pro --configs '{
  "select_1_row_1_warp": {"SELECT_ROWS": 1, "SELECT_WARPS": 1},
  "select_2_rows_1_warp": {"SELECT_ROWS": 2, "SELECT_WARPS": 1}}'
run "$out/offline-sm90-indexer-key-tile-512.json" indexer_fwd v4-flash --only seq=4096 --configs '{
  "tuned_tiling": {"BLOCK_S": 16, "BLOCK_H": 4, "BLOCK_T": 256, "KEY_TILES": 1, "num_warps": 8, "num_stages": 2,
                   "SELECT_ROWS": 1, "SELECT_WARPS": 2},
  "key_tile_512_s8_h4": {"BLOCK_S": 8, "BLOCK_H": 4, "BLOCK_T": 512, "KEY_TILES": 1, "num_warps": 8, "num_stages": 2,
                         "SELECT_ROWS": 1, "SELECT_WARPS": 2},
  "key_tile_512_s16_h2": {"BLOCK_S": 16, "BLOCK_H": 2, "BLOCK_T": 512, "KEY_TILES": 1, "num_warps": 8,
                          "num_stages": 2, "SELECT_ROWS": 1, "SELECT_WARPS": 2}}'
run "$out/offline-sm90-glue-bwd-columns.json" mhc_glue_bwd v4-flash --only tokens=16384 --configs '{
  "tuned_64_columns": {"BLOCK_N": 64, "BLOCK_K": 64, "SLABS": 8, "DFN_TRANSPOSED": 1, "num_warps": 4, "num_stages": 1},
  "32_columns": {"BLOCK_N": 64, "BLOCK_K": 32, "SLABS": 8, "DFN_TRANSPOSED": 1, "num_warps": 4, "num_stages": 1}}'

#!/usr/bin/env bash
# The offline sm_90 compiles the second 2026-12-02 write-up cites
# (bench/2026-12-02b-h200-indexer-and-attention-forward.md): the indexer's scoring with its heads
# summed per head block against once per key tile (LATE_HEAD_SUM) at the tiling tuned before it,
# the uint32 selection, and the Flash CSA forward with and without lazy rescaling at its tuned
# tiling. Same Triton 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36;
# that script creates it).
# Usage: bash bench/offline_sm90_indexer_attention_fwd.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-02b-h200}
source bench/offline_sm90_run.sh

tiling='"BLOCK_S": 16, "BLOCK_H": 4, "BLOCK_T": 256, "KEY_TILES": 1, "num_warps": 8, "num_stages": 2, "SELECT_ROWS": 1, "SELECT_WARPS": 1'
run "$out/offline-sm90-indexer-head-sum.json" indexer_fwd v4-flash --only seq=4096 --configs "{
  \"per_head_block\": {$tiling, \"LATE_HEAD_SUM\": 0},
  \"per_key_tile\": {$tiling, \"LATE_HEAD_SUM\": 1}}"
run "$out/offline-sm90-attention-fwd-lazy.json" sparse_attn_fwd v4-flash --only ratio=4 --configs '{
  "every_tile": {"BLOCK_H": 64, "TILE_K": 64, "num_warps": 8, "num_stages": 1, "RESCALE_SLACK": 0},
  "lazy_8": {"BLOCK_H": 64, "TILE_K": 64, "num_warps": 8, "num_stages": 1, "RESCALE_SLACK": 8}}'

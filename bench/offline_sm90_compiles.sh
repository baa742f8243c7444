#!/usr/bin/env bash
# sm_90 compiles of the launch variants the 2026-12-01 CPU session added, without a GPU: registers,
# spills, shared memory and wgmma / mma.sync counts (bench/kernel_resources.py --offline-arch).
# Triton 3.6 is the GPU image's version, whose compiles these equal (agreement.md there); it is
# installed into its own venv (VENV, default /tmp/triton36) beside the project's.
# Usage: bash bench/offline_sm90_compiles.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-01-cpu-offline-resources}
venv=${VENV:-/tmp/triton36}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q triton==3.6.0 torch==2.13.0 numpy pydantic sqlalchemy pyyaml
fi
mkdir -p "$out"
run() { PYTHONPATH=. "$venv/bin/python" bench/kernel_resources.py kernels/tables/sm_90.json "$@" --offline-arch sm_90; }

run "$out/attention-bwd-transposed.json" sparse_attn_bwd v4-flash,v4-pro --only seq=4096 --configs '{
  "as_is_32x16": {"BLOCK_H": 32, "TILE_K": 16, "DE_TRANSPOSED": 0},
  "as_is_64x16": {"BLOCK_H": 64, "TILE_K": 16, "DE_TRANSPOSED": 0},
  "transposed_32x16": {"BLOCK_H": 32, "TILE_K": 16, "DE_TRANSPOSED": 1},
  "transposed_64x16": {"BLOCK_H": 64, "TILE_K": 16, "DE_TRANSPOSED": 1},
  "transposed_64x32": {"BLOCK_H": 64, "TILE_K": 32, "DE_TRANSPOSED": 1}}'
run "$out/glue-bwd-transposed.json" mhc_glue_bwd v4-flash --only tokens=4096 --configs '{
  "as_is_16x128_w4": {"BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4, "DFN_TRANSPOSED": 0},
  "as_is_64x128_w4": {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "DFN_TRANSPOSED": 0},
  "transposed_64x64_w4": {"BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "DFN_TRANSPOSED": 1},
  "transposed_64x128_w4": {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "DFN_TRANSPOSED": 1},
  "transposed_64x128_w8": {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 8, "DFN_TRANSPOSED": 1}}'
run "$out/indexer-key-tiles.json" indexer_fwd v4-flash --only seq=4096 --configs '{
  "tuned_tiling": {"BLOCK_S": 16, "BLOCK_H": 4, "BLOCK_T": 256, "KEY_TILES": 0, "num_warps": 8, "num_stages": 2,
                   "SELECT_ROWS": 2, "SELECT_WARPS": 16},
  "tuned_tiling_key_tiles_1": {"BLOCK_S": 16, "BLOCK_H": 4, "BLOCK_T": 256, "KEY_TILES": 1, "num_warps": 8,
                               "num_stages": 2, "SELECT_ROWS": 2, "SELECT_WARPS": 16},
  "one_head_64x128_key_tiles_1": {"BLOCK_S": 64, "BLOCK_H": 1, "BLOCK_T": 128, "KEY_TILES": 1, "num_warps": 4,
                                  "num_stages": 2, "SELECT_ROWS": 2, "SELECT_WARPS": 16}}'
run "$out/router.json" router_fwd,router_bwd,router_hash_fwd v4-flash,v4-pro

# The spaces' register and shared-memory bounds against compiles (bench/space_vs_compiles.py).
check() { PYTHONPATH=. "$venv/bin/python" bench/space_vs_compiles.py "$@"; }
mkdir -p "$out/spaces"
check indexer_fwd v4-flash seq=4096 "$out/spaces/indexer-fwd-flash-4096.json" --sample 40
check compressor_bwd v4-flash ratio=4,dim=512 "$out/spaces/compressor-bwd-csa-512.json" --sample 40
check compressor_bwd v4-flash ratio=128 "$out/spaces/compressor-bwd-hca-512-admitted.json" --sample 20 --admitted-only
check sparse_attn_bwd v4-flash seq=4096,heads=64,ratio=4 "$out/spaces/sparse-attn-bwd-flash-csa-admitted.json" --sample 16 --admitted-only
check mhc_glue_bwd v4-flash tokens=4096 "$out/spaces/mhc-glue-bwd-4096-admitted.json" --sample 24 --admitted-only

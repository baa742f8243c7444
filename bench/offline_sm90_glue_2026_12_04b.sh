#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) behind the 2026-12-04b write-up's glue sections:
# registers, spills, each SASS loop's instructions, CTA barriers and warpgroup-MMA waits.
#   tilings (default): the committed 64 x 64 tiling beside 128-token blocks (32 columns at 4 warps,
#     64 at 8), with the gates launch over 64- and 16-token blocks;
#   inline: the committed tiling with fn split in the split launch or by each program
#     (INLINE_FN_SPLIT), which exists only on a checkout of 291dca2: run this script there;
#   tma: the glue backward's 16,384-token tiling with host-encoded (TMA 1) and device-built (TMA 2)
#     descriptors.
# Same Triton 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_glue_2026_12_04b.sh [tilings|inline|tma] [OUT_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-tilings}
json=${2:-bench/results/2026-12-04b-h200/offline-sm90-glue-$mode.json}
out=$(dirname "$json")
source bench/offline_sm90_run.sh

common='"SPLIT_K": 8, "FUSED_GATES": 0, "num_stages": 3, "maxnreg": null'
case "$mode" in
tilings) configs="{
  \"n64_k64_w4_gates64\": {$common, \"BLOCK_N\": 64, \"BLOCK_K\": 64, \"num_warps\": 4, \"GATES_BLOCK_N\": 0},
  \"n64_k64_w4_gates16\": {$common, \"BLOCK_N\": 64, \"BLOCK_K\": 64, \"num_warps\": 4, \"GATES_BLOCK_N\": 16},
  \"n128_k32_w4_gates16\": {$common, \"BLOCK_N\": 128, \"BLOCK_K\": 32, \"num_warps\": 4, \"GATES_BLOCK_N\": 16},
  \"n128_k64_w8_gates16\": {$common, \"BLOCK_N\": 128, \"BLOCK_K\": 64, \"num_warps\": 8, \"GATES_BLOCK_N\": 16}}" ;;
inline) configs="{
  \"split_launch\": {$common, \"BLOCK_N\": 64, \"BLOCK_K\": 64, \"num_warps\": 4, \"GATES_BLOCK_N\": 16, \"INLINE_FN_SPLIT\": 0, \"PDL\": 0},
  \"inline_split\": {$common, \"BLOCK_N\": 64, \"BLOCK_K\": 64, \"num_warps\": 4, \"GATES_BLOCK_N\": 16, \"INLINE_FN_SPLIT\": 1, \"PDL\": 0}}" ;;
tma) bwd='"BLOCK_N": 64, "BLOCK_K": 64, "SLABS": 2, "DFN_TRANSPOSED": 1, "num_warps": 4, "num_stages": 2'
  run "$json" mhc_glue_bwd v4-flash --only tokens=16384 --configs "{
    \"host_encoded\": {$bwd, \"TMA\": 1}, \"device_built\": {$bwd, \"TMA\": 2}}"
  exit 0 ;;
*) echo "mode: tilings, inline or tma, not $mode" >&2; exit 2 ;;
esac
run "$json" mhc_glue_fwd v4-flash --only tokens=4096 --configs "$configs"

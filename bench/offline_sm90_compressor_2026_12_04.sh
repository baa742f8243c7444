#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of the compressor backward's 2026-12-04 forms at the
# CSA d 128 shapes, beside the committed 16-channel tiling: the last-program dape (DAPE_LAST), the
# grid launched channel blocks first (CHANNELS_FIRST) and 8 channels a program. Registers, programs
# an SM, each SASS loop's instructions and the memory barriers. Same Triton 3.6 venv as
# bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_compressor_2026_12_04.sh [OUT_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
json=${1:-bench/results/2026-12-04-h200/offline-sm90-compressor.json}
out=$(dirname "$json")
source bench/offline_sm90_run.sh

common='"SAVED_STATS": 0, "BLOCK_P": 1, "DAPE_ATOMIC": 1, "num_warps": 1, "num_stages": 2, "maxnreg": null'
run "$json" compressor_bwd v4-flash --only "ratio=4,dim=128" --configs "{
  \"atomics_16ch\": {$common, \"BLOCK_G\": 4, \"BLOCK_D\": 16, \"SLABS\": 256, \"DAPE_LAST\": 0, \"CHANNELS_FIRST\": 0},
  \"dape_last_16ch\": {$common, \"BLOCK_G\": 4, \"BLOCK_D\": 16, \"SLABS\": 256, \"DAPE_LAST\": 1, \"CHANNELS_FIRST\": 0},
  \"channels_first_16ch\": {$common, \"BLOCK_G\": 4, \"BLOCK_D\": 16, \"SLABS\": 256, \"DAPE_LAST\": 0, \"CHANNELS_FIRST\": 1},
  \"channels_first_8ch\": {$common, \"BLOCK_G\": 4, \"BLOCK_D\": 8, \"SLABS\": 512, \"DAPE_LAST\": 0, \"CHANNELS_FIRST\": 1}}"

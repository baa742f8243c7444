#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) behind the 2026-12-04c write-up's indexer section: the
# committed sequence-4,096 scoring (keys across the dot, heads summed across its rows) beside
# KEY_ROWS tilings (keys down the dot's rows, each query's heads summed across its columns):
# registers, spills, shared memory, warpgroup MMAs, each SASS loop's instructions and barriers.
#   tilings (default): the committed row-form entry beside KEY_ROWS tilings;
#   fused: the KEY_ROWS entry (4 queries x 64 keys, 8 warps) with its selection launched apart or in
#     each scoring program (SELECT_IN_SCORING), 1, 2 or 4 rows at a time;
#   tma: 2 queries x 64 keys on 4 warps, selecting in the scoring 2 rows at a time, by pointers, by
#     host-encoded TMA descriptors (TMA 1) and by descriptors each program builds (TMA 2).
# Same Triton 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_indexer_key_rows.sh [tilings|fused|tma] [OUT_JSON]
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-tilings}
suffix=${mode/tilings/}
json=${2:-bench/results/2026-12-04c-h200/offline-sm90-indexer-key-rows${suffix:+-$suffix}.json}
out=$(dirname "$json")
source bench/offline_sm90_run.sh

held='"KEY_TILES": 0, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0, "maxnreg": null, "SELECT_ROWS": 1, "SELECT_WARPS": 2, "SELECT_INTERP": 1'
case "$mode" in
tilings) ;;
fused) entry='"KEY_TILES": 0, "TMA": 0, "HEAD_SPLITS": 1, "GLUON": 0, "maxnreg": null, "SELECT_INTERP": 1, "KEY_ROWS": 1, "BLOCK_S": 4, "BLOCK_H": 64, "BLOCK_T": 64, "LATE_HEAD_SUM": 0, "num_warps": 8, "num_stages": 2'
  run "$json" indexer_fwd v4-flash --only seq=4096 --configs "{
  \"apart\": {$entry, \"SELECT_IN_SCORING\": 0, \"SELECT_ROWS\": 1, \"SELECT_WARPS\": 2},
  \"in_scoring_1\": {$entry, \"SELECT_IN_SCORING\": 1, \"SELECT_ROWS\": 1, \"SELECT_WARPS\": 8},
  \"in_scoring_2\": {$entry, \"SELECT_IN_SCORING\": 1, \"SELECT_ROWS\": 2, \"SELECT_WARPS\": 8},
  \"in_scoring_4\": {$entry, \"SELECT_IN_SCORING\": 1, \"SELECT_ROWS\": 4, \"SELECT_WARPS\": 8}}"
  exit 0 ;;
tma) entry='"KEY_TILES": 0, "HEAD_SPLITS": 1, "GLUON": 0, "maxnreg": null, "SELECT_INTERP": 1, "KEY_ROWS": 1, "BLOCK_S": 2, "BLOCK_H": 64, "BLOCK_T": 64, "LATE_HEAD_SUM": 0, "num_warps": 4, "num_stages": 2, "SELECT_IN_SCORING": 1, "SELECT_ROWS": 2, "SELECT_WARPS": 4'
  run "$json" indexer_fwd v4-flash --only seq=4096 --configs "{
  \"pointers\": {$entry, \"TMA\": 0}, \"host_encoded\": {$entry, \"TMA\": 1}, \"device_built\": {$entry, \"TMA\": 2}}"
  exit 0 ;;
*) echo "mode: tilings, fused or tma, not $mode" >&2; exit 2 ;;
esac
run "$json" indexer_fwd v4-flash --only seq=4096 --configs "{
  \"committed_rows\": {$held, \"KEY_ROWS\": 0, \"BLOCK_S\": 8, \"BLOCK_H\": 8, \"BLOCK_T\": 128, \"LATE_HEAD_SUM\": 1, \"num_warps\": 4, \"num_stages\": 3},
  \"keys_s8_h8_t128_late\": {$held, \"KEY_ROWS\": 1, \"BLOCK_S\": 8, \"BLOCK_H\": 8, \"BLOCK_T\": 128, \"LATE_HEAD_SUM\": 1, \"num_warps\": 4, \"num_stages\": 3},
  \"keys_s2_h64_t64\": {$held, \"KEY_ROWS\": 1, \"BLOCK_S\": 2, \"BLOCK_H\": 64, \"BLOCK_T\": 64, \"LATE_HEAD_SUM\": 0, \"num_warps\": 4, \"num_stages\": 2},
  \"keys_s4_h64_t64\": {$held, \"KEY_ROWS\": 1, \"BLOCK_S\": 4, \"BLOCK_H\": 64, \"BLOCK_T\": 64, \"LATE_HEAD_SUM\": 0, \"num_warps\": 4, \"num_stages\": 2},
  \"keys_s4_h64_t128_w8\": {$held, \"KEY_ROWS\": 1, \"BLOCK_S\": 4, \"BLOCK_H\": 64, \"BLOCK_T\": 128, \"LATE_HEAD_SUM\": 0, \"num_warps\": 8, \"num_stages\": 2},
  \"keys_s8_h16_t64\": {$held, \"KEY_ROWS\": 1, \"BLOCK_S\": 8, \"BLOCK_H\": 16, \"BLOCK_T\": 64, \"LATE_HEAD_SUM\": 0, \"num_warps\": 4, \"num_stages\": 3}}"

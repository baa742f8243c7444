#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of the Gluon attention forward's modes 2, 4, 5
# (persistent) and 6 (4 with its start overlapped) at the Flash CSA and window shapes: registers,
# spills, each SASS loop's instructions, CTA barriers and register-to-uniform moves (R2UR). The
# figures the 2026-12-03d write-up and the space's GLUON comment cite. Same Triton 3.6 venv as
# bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_persistent_attention.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-03d-h200}
source bench/offline_sm90_run.sh

gluon='"BLOCK_H": 64, "TILE_K": 64, "num_warps": 8, "num_stages": 2, "RESCALE_SLACK": 0, "maxnreg": null,
  "TAIL_K": 0, "UNCHAINED": 0, "PTX_BARRIER": 0, "LATE_FIRST": 0'
for layer in csa:ratio=4,topk=512 window:ratio=0,topk=0; do
  run "$out/offline-sm90-gluon-fwd-persistent-${layer%%:*}.json" sparse_attn_fwd v4-flash --only "${layer#*:}" --configs "{
    \"gluon_2_partial_sums\": {$gluon, \"GLUON\": 2}, \"gluon_4_static_slots\": {$gluon, \"GLUON\": 4},
    \"gluon_5_persistent\": {$gluon, \"GLUON\": 5}, \"gluon_6_early_start\": {$gluon, \"GLUON\": 6}}"
done

#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of the sparse-attention forward's Gluon form
# (kernels/sparse_attention_sm90.py) in each GLUON mode beside the Triton kernel's best configs
# (chained, and unchained behind PTX_BARRIER 2): registers, spills, shared memory, wgmma count,
# and each SASS loop's instructions and CTA barriers (mode 4's loop holds two tiles), at the
# Flash CSA shape; then mode 4 at every forward preset shape. The figures the 2026-12-03c
# write-up and the space's GLUON comment cite. Same Triton 3.6 venv as
# bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_gluon_attention.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-03c-h200}
source bench/offline_sm90_run.sh

fwd='"BLOCK_H": 64, "TILE_K": 64, "num_warps": 8, "num_stages": 2, "RESCALE_SLACK": 0, "maxnreg": null'
run "$out/offline-sm90-gluon-fwd.json" sparse_attn_fwd v4-flash --only ratio=4,topk=512 --configs "{
  \"triton_chained_tail32\": {$fwd, \"TAIL_K\": 32, \"UNCHAINED\": 0, \"PTX_BARRIER\": 0, \"GLUON\": 0},
  \"triton_unchained_ptx_plain\": {$fwd, \"TAIL_K\": 0, \"UNCHAINED\": 1, \"PTX_BARRIER\": 2, \"GLUON\": 0},
  \"gluon_1_in_turn\": {$fwd, \"TAIL_K\": 0, \"UNCHAINED\": 0, \"PTX_BARRIER\": 0, \"GLUON\": 1},
  \"gluon_2_partial_sums\": {$fwd, \"TAIL_K\": 0, \"UNCHAINED\": 0, \"PTX_BARRIER\": 0, \"GLUON\": 2},
  \"gluon_3_overlapped\": {$fwd, \"TAIL_K\": 0, \"UNCHAINED\": 0, \"PTX_BARRIER\": 0, \"GLUON\": 3},
  \"gluon_4_static_slots\": {$fwd, \"TAIL_K\": 0, \"UNCHAINED\": 0, \"PTX_BARRIER\": 0, \"GLUON\": 4}}"
run "$out/offline-sm90-gluon-fwd-shapes.json" sparse_attn_fwd v4-flash,v4-pro --configs "{
  \"gluon_4_static_slots\": {$fwd, \"TAIL_K\": 0, \"UNCHAINED\": 0, \"PTX_BARRIER\": 0, \"GLUON\": 4}}"

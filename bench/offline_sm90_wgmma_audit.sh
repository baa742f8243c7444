#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of every launch that runs warpgroup MMAs, with the
# heuristic default and the committed table's config at the V4-Flash shapes of 4,096 tokens (the
# expert GEMMs at their EP = 8, 24,576-row shape): where ptxas serialized a kernel's MMAs, and why.
# Same Triton 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_wgmma_audit.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-04d-h200}
source bench/offline_sm90_run.sh

run "$out/offline-sm90-wgmma-audit-gemms.json" \
  expert_up_fwd,expert_down_fwd,expert_up_bwd_dx,expert_down_bwd_dx,expert_up_bwd_dw,expert_down_bwd_dw \
  v4-flash --only tokens=24576,experts=32,hidden=4096,ffn=2048,
run "$out/offline-sm90-wgmma-audit-attention.json" sparse_attn_fwd,sparse_attn_bwd,indexer_fwd v4-flash --only seq=4096,
run "$out/offline-sm90-wgmma-audit-glue.json" mhc_glue_fwd,mhc_glue_bwd v4-flash --only tokens=4096,

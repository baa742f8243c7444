#!/usr/bin/env bash
# Offline sm_90 compiles of the router forward's top-k rounds, max-then-min against one argmax
# (ARGMAX), at the tuned tilings of the V4-Flash shapes (one and two tokens a warp). Same Triton
# 3.6 venv as bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36; that script creates it).
# Usage: bash bench/offline_sm90_router_argmax.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-02c-h200}
source bench/offline_sm90_run.sh

run "$out/offline-sm90-router-argmax.json" router_fwd v4-flash --only tokens=4096, --configs '{
  "one_token_max_min": {"BLOCK_N": 1, "num_warps": 1, "num_stages": 1, "ARGMAX": 0},
  "one_token_argmax": {"BLOCK_N": 1, "num_warps": 1, "num_stages": 1, "ARGMAX": 1},
  "two_tokens_max_min": {"BLOCK_N": 2, "num_warps": 1, "num_stages": 1, "ARGMAX": 0},
  "two_tokens_argmax": {"BLOCK_N": 2, "num_warps": 1, "num_stages": 1, "ARGMAX": 1}}'

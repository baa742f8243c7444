#!/usr/bin/env bash
# Second H200 call: every kernel's parity tests on the GPU (the V4 block kernels included),
# then tuned/default/eager timings of the tuned table's kernels by CUDA events and by
# CUDA-graph replay (device time without host launch cost).
#   usage (device tool): source .gpubundle/install.sh && bash bench/h200_followup.sh
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-followup
step() { echo "== $*" | tee -a "$out/log.txt"; }

step "tuned vs default vs eager, events and CUDA-graph timing"
python bench/kernels_h200.py kernels/tables/sm_90.json "$out/kernels.json" 2>&1 | tail -24 | tee -a "$out/log.txt"

step "parity tests of every kernel on the GPU"
python -m pytest -q -p no:cacheprovider tests/test_rmsnorm.py tests/test_sinkhorn.py tests/test_mhc.py \
  tests/test_rope.py tests/test_router.py tests/test_grouped_gemm.py 2>&1 | tail -25 | tee -a "$out/log.txt"

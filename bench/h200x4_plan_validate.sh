#!/usr/bin/env bash
# The 4- and 8-GPU planner validation (not run by the author; for nvidia-h200-x4 / -x8): proxy-16l at
# seq 4096, mbs 1, Triton kernels, through bench/h200_plan_validate.sh:
#   PP=4 on 4 GPUs (gbs 8): validate (profile, top 3 plans + baselines, refit) and the exhaustive space
#   (even split and every one-layer move between neighbouring stages x no / full / first-stage recompute);
#   with 8 GPUs also PP=4 x DP=2 (gbs 16): validate only, in the same DB (its runs refit the calibration
#   again, starting from the PP=4 refit).
# Usage: OUT=/dir bash bench/h200x4_plan_validate.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a writable folder}
PY=${PY:-python}
export MODEL=${MODEL:-proxy-16l} SEQ=${SEQ:-4096} PP=4 OUT PY
GPUS=$($PY -c 'import torch; print(torch.cuda.device_count())')
NGPUS=4 GBS=${GBS:-8} bash bench/h200_plan_validate.sh
if [ "$GPUS" -ge 8 ]; then
  NGPUS=8 GBS=${GBS8:-16} SPACE=0 bash bench/h200_plan_validate.sh
fi

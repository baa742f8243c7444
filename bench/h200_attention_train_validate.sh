#!/usr/bin/env bash
# One nvidia-h200-x2 device call for the attention kernels, the training runs and the planner's
# validation, in two time-bounded phases (the device call is capped at 10 minutes):
#   1. in parallel:
#      GPU 0: the sparse-attention backward grid at the Flash CSA shape again (its first run lost
#             configs to a GPU that the compile workers had filled), the sm_90 export, then the
#             attention benchmark (tuned vs default vs eager) with that table;
#      GPU 1: proxy-8l trained whole on one GPU with the Triton kernels under three recompute
#             plans, then the V4-Flash full-width layer profiles (bench/h200_train.sh);
#   2. `tuner plan validate` at PP=2 on both GPUs, then the exhaustive plan space as far as time
#      allows (bench/h200_plan_validate.sh).
# Work happens under /tmp/w; everything is packed into $OUT/results.tgz after each phase (the
# device tool returns a limited number of files). Phase limits (s): LANE_SECONDS, VALIDATE_SECONDS;
# every `timeout` also kills 15 s after its interrupt, since a process that handles the interrupt
# slowly (a Ray shutdown) otherwise holds the phase past its limit. Keep the two limits 60 s under
# the device call's own: the 2026-11-30 run of this script lost everything to an over-run that
# killed the packing.
# Usage (device tool): source .gpubundle/install.sh && bash bench/h200_attention_train_validate.sh
# PHASES="1" or "2" runs one phase only (one device call each, with the limits raised).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a writable folder}
W=/tmp/w
mkdir -p "$W/attn" "$W/train" "$W/pv"
export PY=${PY:-python} ITERS=${ITERS:-5} WARMUP=${WARMUP:-2}
pack() { tar -czf "$OUT/.results.tgz" -C "$W" . && mv "$OUT/.results.tgz" "$OUT/results.tgz" && echo "packed $(du -h "$OUT/results.tgz" | cut -f1)"; }
trap pack EXIT
lane=${LANE_SECONDS:-240}
phases=${PHASES:-1 2}

if [[ " $phases " == *" 1 "* ]]; then
(
  export CUDA_VISIBLE_DEVICES=0 OUT=$W/attn GROUP=attention SPECS='02-*' KERNELS=attention TABLE=$W/attn/sm_90.json
  export SWEEP_SECONDS=$((lane * 50 / 100)) BENCH_SECONDS=$((lane * 40 / 100))
  export EXPORT_ARGS="--skip-kernel expert_up_fwd --skip-kernel expert_down_fwd --skip-kernel expert_up_bwd_dx --skip-kernel expert_down_bwd_dw"
  timeout -k 15 -s INT "$lane" bash bench/h200_kernels.sh sweep bench >"$W/attn/lane.log" 2>&1
) &
(
  # The Triton V4-Flash profiles first (the planner reads them), then the recompute plans not yet
  # run on one GPU, then the eager profiles for comparison.
  export CUDA_VISIBLE_DEVICES=1 OUT=$W/train PROFILE_PROXY=0 EAGER=0 RECOMPUTES="0-8 selective:attn_core,mhc"
  timeout -k 15 -s INT "$lane" bash -c 'PROFILE_KERNELS=triton bash bench/h200_train.sh profile 1gpu; PROFILE_KERNELS=eager bash bench/h200_train.sh profile' >"$W/train/lane.log" 2>&1
) &
wait
pack
echo "== phase 1 done $(date -u +%T)"; tail -3 "$W/attn/log.txt"; cat "$W/train/logs/summary.log"
fi

if [[ " $phases " == *" 2 "* ]]; then
OUT=$W/pv TOP=3 timeout -k 15 -s INT "${VALIDATE_SECONDS:-280}" bash bench/h200_plan_validate.sh >"$W/pv/lane.log" 2>&1
echo "== phase 2 done $(date -u +%T)"; cat "$W/pv/logs/summary.log"
fi

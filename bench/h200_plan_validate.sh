#!/usr/bin/env bash
# The planner against real runs on one node (not run by the author; for the GPU host). Defaults: PP=2 on
# nvidia-h200-x2 with proxy-8l at seq 4096, mbs 1, gbs 8, Triton kernels:
#   1. `tuner plan validate --profile`: profile the layers on this GPU, plan, run the top 3 plans and
#      the two baselines (even split + full recompute, even split without recompute), refit, report;
#   2. `tuner train run` over a small space exhaustively (bench/plan_validate_space.py space: the even
#      split and every one-layer move between neighbouring stages, each with no / full / first-stage
#      recompute), so the pick can be ranked among every plan of the space;
#   3. bench/plan_validate_space.py summary: predicted (before and after the refit) vs measured for
#      every run, and where the planner's pick landed.
# Everything lands under $OUT: the SQLite DB, logs/, validate-TAG.json/.html, space-TAG.tsv/.json.
# Usage: OUT=/dir bash bench/h200_plan_validate.sh
# Knobs (env): MODEL PP NGPUS GBS SEQ MBS TOP ITERS WARMUP DEVICE KERNELS SPACE(=1 runs step 2)
# VALIDATE(=0 skips step 1: to finish the space of an earlier call, with its TUNER_DB_URL).
# CPU dry run (what the author ran by hand):
#   OUT=/tmp/dry MODEL=tiny SEQ=64 GBS=4 ITERS=3 WARMUP=1 DEVICE=cpu KERNELS=eager bash bench/h200_plan_validate.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a writable folder}
MODEL=${MODEL:-proxy-8l} PP=${PP:-2} NGPUS=${NGPUS:-$PP} GBS=${GBS:-8} SEQ=${SEQ:-4096} MBS=${MBS:-1}
TOP=${TOP:-3} ITERS=${ITERS:-10} WARMUP=${WARMUP:-3} DEVICE=${DEVICE:-cuda} KERNELS=${KERNELS:-triton} SPACE=${SPACE:-1}
TAG=${TAG:-pp$PP-gpus$NGPUS}
mkdir -p "$OUT/logs"
export TUNER_DB_URL=${TUNER_DB_URL:-sqlite:///$OUT/plan_validate.db} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python}  # the GPU host has no venv: `source .gpubundle/install.sh` first
[ "$DEVICE" = cpu ] && export TRITON_INTERPRET=1

step() {  # name, then a command; failures are logged and the script goes on
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUT/logs/summary.log"
  "$@" >"$OUT/logs/$name.log" 2>&1
  echo "   exit $?" | tee -a "$OUT/logs/summary.log"
}

if [ "${VALIDATE:-1}" = 1 ]; then
echo "== validate-$TAG" | tee -a "$OUT/logs/summary.log"
$PY -m tuner.cli plan validate --model "$MODEL" --gpus "$NGPUS" --pp "$PP" --gbs "$GBS" --mbs "$MBS" --seq "$SEQ" \
  --top "$TOP" --iters "$ITERS" --warmup "$WARMUP" --device "$DEVICE" --kernels "$KERNELS" --profile --json \
  --report "$OUT/validate-$TAG.html" >"$OUT/validate-$TAG.json" 2>"$OUT/logs/validate-$TAG.log"
echo "   exit $?" | tee -a "$OUT/logs/summary.log"
$PY - "$OUT/validate-$TAG.json" <<'PY' | tee -a "$OUT/logs/summary.log"
import json, sys
data = json.load(open(sys.argv[1]))
for c in data["candidates"]:
    print(f"{c['name']:<40} {c['layout']:<24} {c['status']:<5} predicted {c['predicted_step_ms']:9.1f} ms  "
          f"measured {c['measured_step_ms'] or float('nan'):9.1f} ms  predicted GiB "
          + " ".join(f"{b / 2**30:.3f}" for b in c["predicted_stage_bytes"]) + "  measured GiB "
          + " ".join(f"{b / 2**30:.3f}" for b in c["measured_stage_bytes"]))
print("median |error| step", data["median_abs_time_error"], "memory", data["median_abs_memory_error"],
      "pick vs best", data["pick_vs_best"], "pick vs baseline", data["pick_speedup_vs_baseline"])
PY
fi

if [ "$SPACE" = 1 ] && [ "$NGPUS" = "$PP" ]; then
  $PY bench/plan_validate_space.py space "$MODEL" "$PP" >"$OUT/space-$TAG.tsv"
  while IFS=$'\t' read -r layout recompute; do
    name=space-$TAG-${layout//[^a-zA-Z0-9]/_}-${recompute//[^a-z0-9-]/_}
    step "$name" $PY -m tuner.cli train run --model "$MODEL" --layout "$layout" --pp "$PP" --recompute "$recompute" \
      --gbs "$GBS" --mbs "$MBS" --seq "$SEQ" --iters "$ITERS" --warmup-iters "$WARMUP" --device "$DEVICE" \
      --kernels "$KERNELS" --world "$NGPUS"
  done <"$OUT/space-$TAG.tsv"
  step "summary-$TAG" $PY bench/plan_validate_space.py summary "$OUT/space-$TAG.json"
  cat "$OUT/logs/summary-$TAG.log"
fi

#!/usr/bin/env bash
# One GPU run: the training ladder of issue 36 (bench/train_ladder.py) on proxy-8l, one GPU,
# gbs 8, seq 4096, 20 steps: eager, Triton at heuristic defaults, Triton with the tuned table, and,
# when RECOMPUTE holds the planner's recompute plan for this GPU, the tuned table with that plan.
# Writes the record and its log under $OUT.
# Usage (GPU host): source .gpubundle/install.sh && [RECOMPUTE=...] bash bench/gpu/train_ladder.sh
set -uo pipefail
out=${OUT:-/tmp/train-ladder}
mkdir -p "$out"
rungs=${RUNGS:-eager,triton-defaults,triton-tuned${RECOMPUTE:+,triton-tuned-recompute}}
python3 -m bench train_ladder --record "$out/train_ladder.json" --preset proxy-8l --gbs 8 --mbs 1 --seq 4096 \
  --iters 20 --warmup-iters 3 --rungs "$rungs" ${RECOMPUTE:+--recompute "$RECOMPUTE"} --timeout "${RUNG_TIMEOUT:-240}" \
  2>&1 | tee "$out/train_ladder.log"
python3 -m bench.train_ladder --plot "$out/train_ladder.json" "$out/train_ladder.svg"

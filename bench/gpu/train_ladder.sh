#!/usr/bin/env bash
# One GPU run: the training ladder of issue 36 (bench/train_ladder.py) on proxy-8l, one GPU,
# gbs 8, seq 4096, 20 steps: eager, Triton at heuristic defaults, Triton with the tuned table, and
# the tuned table with the planner's recompute plan for this GPU. The plan comes from this run:
# proxy-8l's layers are profiled here (tuner profile layers, EP 1) and `tuner plan` picks the
# recompute for one GPU (RECOMPUTE=... skips that and uses the given plan).
# SWEEP_GROUP=<group of bench/sweep_specs.py> sweeps that group first (bench/gpu/sweep_group.sh, into
# $OUT/sweep) and lays its exported table over the shipped one as the user table of every rung (the
# sweeps before the benchmark, in one run). The table lands in $OUT/tables/sm_90.json, the sweep's database
# and logs in $OUT/sweep.tar.gz.
# Writes the record, the plot, the plan and the logs under $OUT; a run cut short leaves
# train_ladder.json.partial, the rungs it finished.
# PARITY_SEQ=0 leaves the loss-parity runs out (throughput alone, in about half the time); PARITY_NOISE_RUNS=N
# perturbed eager runs give the parity band (default 3).
# REPEAT=<rungs> trains those rungs a second time: how far their losses move from one run to the next.
# PROFILE_STEP=1 profiles one more step per rung: its device time by kernel class, and how busy the GPU was.
# Usage (GPU host): source .gpubundle/install.sh && bash bench/gpu/train_ladder.sh
# From a `git archive` export (no history of its own), set BENCH_COMMIT=<the exported commit> so the
# records name it (bench/record.py).
set -uo pipefail
out=${OUT:-/tmp/train-ladder}
mkdir -p "$out"
if [ -n "${SWEEP_GROUP:-}" ]; then
  OUT="$out/sweep" SWEEP_SECONDS="${SWEEP_SECONDS:-150}" bash bench/gpu/sweep_group.sh "$SWEEP_GROUP"
  export TUNER_TABLES_DIR="$out/tables"
  mkdir -p "$TUNER_TABLES_DIR" && cp "$out/sweep/sm_90.json" "$TUNER_TABLES_DIR/sm_90.json"
  # one archive for the sweep's database and logs: the device tool brings back 8 files of $OUT at most
  tar -czf "$out/sweep.tar.gz" -C "$out" sweep && rm -rf "$out/sweep"
fi
if [ -z "${RECOMPUTE:-}" ]; then
  db="sqlite:///$out/ladder-profiles.db"
  gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n)")
  python3 -m tuner.cli --db "$db" profile layers --model proxy-8l --seq 4096 --mbs 1 --ep 1 --kernels triton \
    > "$out/proxy-8l-profile.log" 2>&1
  python3 -m tuner.cli --db "$db" plan --model proxy-8l --nodes 1 --gpus-per-node 1 --gpu "$gpu" --gbs 8 --mbs 1 \
    --seq 4096 --ep 1 --pp 1 --json > "$out/plan.json" 2> "$out/plan.err"
  RECOMPUTE=$(python3 - "$out/plan.json" <<'PY'
import json, sys
from v4.recompute import RecomputePlan
plan = json.load(open(sys.argv[1]))["plans"][0]
print(RecomputePlan(frozenset(plan["recompute_layer_ids"])).text)
PY
  ) || RECOMPUTE=""
  echo "planner's recompute plan for one $gpu: ${RECOMPUTE:-(no plan: see plan.err)}"
  if [ "$RECOMPUTE" = none ]; then echo "the plan recomputes nothing: the fourth rung would repeat the third"; RECOMPUTE=""; fi
fi
rungs=${RUNGS:-eager,triton-defaults,triton-tuned${RECOMPUTE:+,triton-tuned-recompute}}
python3 -m bench train_ladder --record "$out/train_ladder.json" --preset proxy-8l --gbs 8 --mbs 1 --seq 4096 \
  --iters 20 --warmup-iters 3 --rungs "$rungs" ${RECOMPUTE:+--recompute "$RECOMPUTE"} --timeout "${RUNG_TIMEOUT:-150}" \
  --parity-seq "${PARITY_SEQ:-1024}" --parity-noise-runs "${PARITY_NOISE_RUNS:-3}" --repeat "${REPEAT:-}" ${PROFILE_STEP:+--profile-step} \
  2>&1 | tee "$out/train_ladder.log"
python3 -m bench.train_ladder --plot "$out/train_ladder.json" "$out/train_ladder.svg"

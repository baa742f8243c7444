#!/usr/bin/env bash
# Training runs and layer profiles on H200s, in phases (each run's failure, OOM included, is stored
# and the script goes on):
#   1gpu:    the proxy-8l preset whole on one GPU: Triton kernels under three recompute plans, and
#            the eager path once;
#   pp2:     the proxy-8l preset at PP=2 for several layouts and recompute plans (needs 2 GPUs);
#   profile: `tuner profile layers` for V4-Flash full width at seq 4096, mbs 1, EP 8 (one layer at
#            a time), eager and Triton, and for proxy-8l;
#   dump:    the runs and profiles of the DB as JSON.
# Everything lands in a SQLite file under $OUT, plus per-command logs.
# Usage: OUT=/some/dir bash bench/h200_train.sh 1gpu pp2 profile dump   (ITERS, WARMUP: iterations)
# Subsets (env): RECOMPUTES (1gpu plans, space-separated), EAGER=0 (no eager 1gpu run),
# PROFILE_KERNELS (triton and/or eager), PROFILE_PROXY=0 (no proxy-8l profile), TRACE=1 (the V4-Flash
# profiles also write each layer kind's profiler trace and op table under $OUT/traces).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a writable folder}
mkdir -p "$OUT/logs"
export TUNER_DB_URL="sqlite:///$OUT/train.db" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python}  # the GPU host has no venv: `source .gpubundle/install.sh` first
GPUS=$($PY -c 'import torch; print(torch.cuda.device_count())')
COMMON=(--model proxy-8l --seq 4096 --mbs 1 --iters "${ITERS:-10}" --warmup-iters "${WARMUP:-3}" --device cuda)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-train}  # shared by the runs: compile once

run() {  # name, then tuner arguments; a failed run (OOM, error) is stored and the script goes on
  local name=$1; shift
  echo "== $name: tuner $*" | tee -a "$OUT/logs/summary.log"
  $PY -m tuner.cli "$@" >"$OUT/logs/$name.log" 2>&1
  echo "   exit $?" | tee -a "$OUT/logs/summary.log"
}

for phase in "$@"; do case "$phase" in
1gpu)
  for recompute in ${RECOMPUTES:-none 0-8 selective:attn_core,mhc}; do
    run "1gpu-triton-${recompute//[^a-z0-9-]/_}" train run "${COMMON[@]}" --gbs 8 --world 1 --recompute "$recompute" --kernels triton
  done
  [ "${EAGER:-1}" = 1 ] && run 1gpu-eager-none train run "${COMMON[@]}" --gbs 8 --world 1 --recompute none --kernels eager
  ;;
pp2)
  [ "$GPUS" -ge 2 ] || { echo "pp2 needs 2 GPUs, this host has $GPUS" | tee -a "$OUT/logs/summary.log"; continue; }
  for layout in 'Et*4|t*4mL' 'Et*5|t*3mL' 'Et*3|t*5mL'; do
    for recompute in none 0-3 'selective:attn_core,mhc'; do
      tag=pp2-${layout//[^a-zA-Z0-9]/_}-${recompute//[^a-z0-9-]/_}
      run "$tag" train run "${COMMON[@]}" --gbs 8 --world 2 --layout "$layout" --recompute "$recompute" --kernels triton
    done
  done
  run pp2-interleaved train run "${COMMON[@]}" --gbs 8 --world 2 --pp 2 --layout 'Et*2|t*2|t*2|t*2mL' --kernels triton
  ;;
profile)
  for kernels in ${PROFILE_KERNELS:-triton eager}; do
    run "profile-v4-flash-$kernels" profile layers --model v4-flash --seq 4096 --mbs 1 --ep 8 --device cuda --kernels "$kernels" \
      ${TRACE:+--trace "$OUT/traces/v4-flash-$kernels"}
  done
  [ "${PROFILE_PROXY:-1}" = 1 ] && run profile-proxy-8l profile layers --model proxy-8l --seq 4096 --mbs 1 --ep 1 --device cuda --kernels triton
  ;;
dump)
$PY -m tuner.cli train list >"$OUT/logs/train-list.log" 2>&1
$PY - "$OUT" <<'PY'
import json, sys
from sqlalchemy import select
from db import open_database, session_scope
from db.planning import LayerProfile
from db.training import TrainRun

out = sys.argv[1]
engine = open_database()
def dump(row):
    return {c.name: getattr(row, c.name) for c in row.__table__.columns}
with session_scope(engine) as session:
    runs = [dump(r) for r in session.scalars(select(TrainRun).order_by(TrainRun.id))]
    profiles = [dump(p) for p in session.scalars(select(LayerProfile).order_by(LayerProfile.id))]
for name, rows in (("train_runs", runs), ("layer_profiles", profiles)):
    with open(f"{out}/{name}.json", "w") as f:
        json.dump(rows, f, indent=1, default=str)
print(f"{len(runs)} training runs, {len(profiles)} profile rows written to {out}")
PY
  ;;
*) echo "usage: $0 1gpu|pp2|profile|dump ..." >&2; exit 2 ;;
esac; done

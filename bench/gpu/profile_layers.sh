#!/usr/bin/env bash
# One GPU run: the per-layer profiles the planner ships (issue 34), for v4-flash and v4-pro at
# seq 4096, mbs 1, EP 8, on the Triton kernels of the committed tables, and proxy-8l at EP 1 (what
# the planner needs for the training ladder's one-GPU recompute plan). Writes a SQLite database,
# one log per model and, per model, the --trace folder (each layer kind's kernel shares and host
# syncs: kernel_shares.json) under $OUT; `tuner profile export` turns the database into packaged profiles.
# The Chrome traces (trace-*/*.json but kernel_shares.json) run to tens of MB: bring back the rest.
# Usage (GPU host, bundle carried): source .gpubundle/install.sh && bash bench/gpu/profile_layers.sh
# From a `git archive` export (no history of its own), set BENCH_COMMIT=<the exported commit> so the
# records name it (bench/record.py).
set -uo pipefail
out=${OUT:-/tmp/profile-layers}
mkdir -p "$out"
db="sqlite:///$out/profiles.db"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.csv" 2>&1
for job in "v4-flash 8" "v4-pro 8" "proxy-8l 1"; do
  set -- $job
  python3 -m tuner.cli --db "$db" profile layers --model "$1" --seq 4096 --mbs 1 --ep "$2" --kernels triton \
    --trace "$out/trace-$1" > "$out/$1.log" 2>&1
  echo "$1 (ep $2): exit $?"; tail -14 "$out/$1.log"
done

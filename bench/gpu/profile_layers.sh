#!/usr/bin/env bash
# One GPU run: the per-layer profiles the planner ships (issue 34), for v4-flash and v4-pro at
# seq 4096, mbs 1, EP 8, on the Triton kernels of the committed tables. Writes a SQLite database
# and one log per model under $OUT; `tuner profile export` turns the database into packaged profiles.
# Usage (GPU host, bundle carried): source .gpubundle/install.sh && bash bench/gpu/profile_layers.sh
set -uo pipefail
out=${OUT:-/tmp/profile-layers}
mkdir -p "$out"
db="sqlite:///$out/profiles.db"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.csv" 2>&1
for model in v4-flash v4-pro; do
  python3 -m tuner.cli --db "$db" profile layers --model "$model" --seq 4096 --mbs 1 --ep 8 --kernels triton \
    > "$out/$model.log" 2>&1
  echo "$model: exit $?"; tail -30 "$out/$model.log"
done

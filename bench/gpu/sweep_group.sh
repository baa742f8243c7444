#!/usr/bin/env bash
# One GPU run: queue a group of sweeps of bench/sweep_specs.py (default gemm-untuned: the expert
# weight-gradient GEMMs and the up GEMM's dX at the shapes the shipped sm_90 table lacks, issue 36),
# serve them until the queue drains or SWEEP_SECONDS pass, then export the table over a copy of the
# shipped one (merge keeps every entry the database has no trial for). Writes under $OUT:
#   sweeps.db     every trial (the export's provenance), kept as trials finish
#   sm_90.json    the exported table, ready to replace kernels/tables/sm_90.json
#   serve.log, export.log, status.log
# SWEEP_TRIALS=N: TPE trials a shape of the model groups (proxy-8l, v4-flash-ep8, v4-pro-ep8, proxy-8l-gemms;
# default 12).
# FASTEST="KERNEL ...": the export takes, for these kernels, the fastest winner of any of the group's sweeps
# (groups that sweep a grid beside each shape's committed entry: gemm-warp-specialized, expert-backward);
# otherwise the newest sweep's.
# Usage (GPU host, bundle carried): source .gpubundle/install.sh && bash bench/gpu/sweep_group.sh [GROUP]
set -uo pipefail
group=${1:-gemm-untuned}
out=${OUT:-/tmp/sweep-group}
mkdir -p "$out/specs" "$out/tables"
db="sqlite:///$out/sweeps.db"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.csv" 2>&1
python3 bench/sweep_specs.py "$out/specs" "$group" || exit 1
python3 -m tuner.cli --db "$db" sweep queue "$out"/specs/*.yaml || exit 1
# serve is crash-safe: a trial is stored as it finishes, so a deadline loses only the trials in flight
timeout --signal=INT "${SWEEP_SECONDS:-420}" python3 -m tuner.cli --db "$db" serve --drain > "$out/serve.log" 2>&1
echo "serve: exit $? (124: stopped at the deadline)"; tail -5 "$out/serve.log"
python3 -m tuner.cli --db "$db" sweep list > "$out/status.log" 2>&1; cat "$out/status.log"
cp kernels/tables/sm_90.json "$out/tables/sm_90.json"
fastest=()
for kernel in ${FASTEST:-}; do fastest+=(--fastest "$kernel"); done
python3 -m tuner.cli --db "$db" export --arch sm_90 --out "$out/tables" "${fastest[@]}" > "$out/export.log" 2>&1
echo "export: exit $?"; tail -20 "$out/export.log"
cp "$out/tables/sm_90.json" "$out/sm_90.json"
rm -rf "$out/tables" "$out/specs"

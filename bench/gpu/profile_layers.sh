#!/usr/bin/env bash
# One GPU run: the per-layer profiles the planner ships (issue 34) and each layer kind's remainder ratio
# (issue 36 item 4: forward + backward device time over the GEMM and attention kernels', <= 1.6x), from
# one profiling per model: v4-flash and v4-pro at seq 4096, mbs 1, EP 8, and proxy-8l at EP 1 (what the
# planner needs for the training ladder's one-GPU recompute plan), on the Triton kernels of the committed
# tables (python -m bench layer_remainder --db: the profiles land in the database as tuner profile layers
# stores them). Writes under $OUT:
#   profiles.db                     the layer profiles; `tuner profile export` turns them into packaged profiles
#   layer_remainder.<model>.json    the records
#   logs.tar.gz                     each model's log and trace folder (kernel_shares.json, the op tables); the
#                                   Chrome traces run to tens of MB and are left out
# Usage (GPU host, bundle carried): source .gpubundle/install.sh && bash bench/gpu/profile_layers.sh
# MODELS="v4-flash:8 proxy-8l:1" picks the models and their EP sizes.
# From a `git archive` export (no history of its own), set BENCH_COMMIT=<the exported commit> so the
# records name it (bench/record.py).
set -uo pipefail
out=${OUT:-/tmp/profile-layers}
mkdir -p "$out/logs"
db="sqlite:///$out/profiles.db"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.csv" 2>&1
status=0
for job in ${MODELS:-v4-flash:8 v4-pro:8 proxy-8l:1}; do
  model=${job%%:*} ep=${job##*:}
  python3 -m bench layer_remainder --model "$model" --seq 4096 --mbs 1 --ep "$ep" --db "$db" \
    --trace "$out/logs/trace-$model" --record "$out/layer_remainder.$model.json" > "$out/logs/$model.log" 2>&1
  code=$?; echo "$model (ep $ep): exit $code"; [[ $code == 0 ]] || status=1
  grep -E '"(measured|status)"' "$out/layer_remainder.$model.json" 2>/dev/null || tail -5 "$out/logs/$model.log"
  find "$out/logs/trace-$model" -name '*.json' ! -name kernel_shares.json -delete 2>/dev/null
done
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$out/logs"
rm -f "$out"/*.schema-lock
exit $status

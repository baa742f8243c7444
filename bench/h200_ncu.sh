#!/usr/bin/env bash
# Nsight Compute's hardware counters for the kernels of one call of each launch below (or of
# the "KERNEL|SHAPE_KEY|VARIANT" lines of the file LAUNCHES; VARIANT: default, tuned, or a JSON
# config laid over the default, e.g. a sweep's loser, named "config" in the files), with the table TABLE
# (default: the committed sm_90 one): occupancy, warp stalls, pipe and memory utilisation,
# as one raw CSV and one details page per launch, packed into $OUT/ncu.tar.gz (the device tool
# brings back 8 files at most; bench/ncu_summary.py reads the unpacked folder).
# Clocks are left alone (--clock-control none, as the device notes ask). Bounded by NCU_SECONDS.
# NCU_EXTRA_SECTIONS adds sections, e.g. "--section SourceCounters" (the SASS lines warps stall on).
#   usage (device tool): source .gpubundle/install.sh && bash bench/h200_ncu.sh
set -uo pipefail
out=${OUT:-/tmp/out}; work=/tmp/ncu; rm -rf "$work"; mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-block
table=${TABLE:-kernels/tables/sm_90.json}
flash_csa="batch=1,seq=4096,heads=64,ratio=4,topk=512,window=128"
default_launches="sparse_attn_bwd|$flash_csa|tuned
sparse_attn_bwd|$flash_csa|default
sparse_attn_bwd|batch=1,seq=4096,heads=64,ratio=0,topk=0,window=128|tuned
sparse_attn_bwd|batch=1,seq=4096,heads=64,ratio=128,topk=0,window=128|tuned
sparse_attn_bwd|batch=1,seq=4096,heads=128,ratio=4,topk=1024,window=128|tuned
sparse_attn_fwd|$flash_csa|tuned
sparse_attn_fwd|batch=1,seq=4096,heads=128,ratio=4,topk=1024,window=128|tuned
indexer_fwd|batch=1,seq=4096,topk=512|tuned
mhc_glue_bwd|tokens=4096,hidden=4096|tuned
mhc_glue_fwd|tokens=4096,hidden=4096|tuned
router_fwd|tokens=16384,experts=256,topk=6|tuned
router_bwd|tokens=16384,experts=256,topk=6|tuned"
launches=$(if [ -n "${LAUNCHES:-}" ]; then cat "$LAUNCHES"; else echo "$default_launches"; fi)
sections="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
  --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis ${NCU_EXTRA_SECTIONS:-}"
ncu --version | tail -1 | tee "$work/ncu-version.txt"
deadline=$(( $(date +%s) + ${NCU_SECONDS:-300} ))
i=0
while IFS='|' read -r kernel shape variant; do
  [ -z "$kernel" ] && continue
  i=$((i + 1)); case "$variant" in default|tuned) label=$variant ;; *) label=config ;; esac
  name=$(printf "%02d-%s-%s" "$i" "$kernel" "$label")
  left=$(( deadline - $(date +%s) )); [ "$left" -le 5 ] && { echo "== out of time before $name"; break; }
  echo "== $(date -u +%T) $name: $shape"
  timeout -k 10 "$left" ncu --clock-control none --profile-from-start off $sections \
    -o "$work/$name" -f python bench/ncu_launch.py "$table" "$kernel" "$shape" "$variant" \
    > "$work/$name.log" 2>&1 || { echo "   failed (rc $?), see $name.log"; tail -3 "$work/$name.log"; continue; }
  grep '^{' "$work/$name.log" > "$work/$name.launch.json"
  ncu --import "$work/$name.ncu-rep" --csv --page raw > "$work/$name.csv"
  ncu --import "$work/$name.ncu-rep" --page details > "$work/$name.details.txt"
  echo "   $(($(wc -l < "$work/$name.csv") - 2)) kernels profiled"
done <<< "$launches"
tar czf "$out/ncu.tar.gz" -C "$work" --exclude '*.ncu-rep' . && ls -la "$out/ncu.tar.gz"

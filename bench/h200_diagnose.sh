#!/usr/bin/env bash
# One nvidia-h200 device call that measures where time goes, before tuning further:
#   resources: registers, spills and shared memory of the attention, expert-GEMM and mHC glue
#              kernels at the V4-Flash shapes (bench/kernel_resources.py);
#   trace:     the V4-Flash Triton layer profiles with a profiler trace per layer kind (the op
#              tables say what fills a layer's 77-100 ms; bench/h200_train.sh profile);
#   attention: the sparse-attention benchmark (default vs table vs eager) with the committed
#              table, which measures the CSA loop bound of aa25f53 for the first time.
# Work happens under /tmp/w; everything is packed into $OUT/results.tgz after each phase (the
# device tool returns at most 8 files). Every `timeout` kills 15 s after its interrupt.
# Usage (device tool): source .gpubundle/install.sh && PHASES="resources trace attention" bash bench/h200_diagnose.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a writable folder}
W=/tmp/w
mkdir -p "$W"
export PY=${PY:-python} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-diagnose
pack() { tar -czf "$OUT/.results.tgz" -C "$W" . && mv "$OUT/.results.tgz" "$OUT/results.tgz"; }
trap pack EXIT
table=kernels/tables/sm_90.json
for phase in ${PHASES:-resources trace attention}; do
  echo "== $(date -u +%T) $phase"
  case "$phase" in
  resources)
    timeout -k 15 -s INT "${RESOURCES_SECONDS:-120}" $PY bench/kernel_resources.py "$table" "$W/resources.json" \
      sparse_attn_fwd,sparse_attn_bwd,expert_up_fwd,expert_down_fwd,mhc_glue_fwd,mhc_glue_bwd,indexer_fwd,compressor_fwd \
      v4-flash >"$W/resources.log" 2>&1
    tail -3 "$W/resources.log" ;;
  trace)
    OUT=$W/train TRACE=1 PROFILE_KERNELS=triton PROFILE_PROXY=0 timeout -k 15 -s INT "${TRACE_SECONDS:-300}" \
      bash bench/h200_train.sh profile
    gzip -f "$W"/train/traces/*/*.json 2>/dev/null
    cat "$W/train/logs/summary.log" ;;
  attention)
    timeout -k 15 -s INT "${ATTENTION_SECONDS:-150}" $PY bench/kernels_h200.py "$table" "$W/attention.json" \
      sparse_attn_fwd,sparse_attn_bwd v4-flash,v4-pro 2>&1 | grep -v '^{' | tail -30 ;;
  *) echo "usage: PHASES='resources trace attention' $0" >&2; exit 2 ;;
  esac
  pack
done

#!/usr/bin/env bash
# The kernels' H200 runs (block kernels: mHC, RoPE, router, expert GEMMs; attention: sparse
# attention, compressor, indexer), in device calls that share one sweep database (copied in as
# .sweepdb/h200.db, so the export keeps the entries of earlier runs):
#   parity: the parity tests of TESTS (default: the block kernels') on the GPU (at most
#           PARITY_SECONDS);
#   sweep: the sweeps of bench/sweep_specs.py through the service on all GPUs (bounded by
#          SWEEP_SECONDS; GROUP=gemm|memory|attention|tma for one group, SPECS=GLOB for some of
#          its spec files, e.g. '02-*'), then the sm_90 export
#          (EXPORT_ARGS: e.g. --skip-kernel K for launches whose sweeps are stale, --merge to keep
#          the committed table's entries this database has no trials for);
#   bench: tuned vs default vs eager (and the expert GEMMs' peers) at every preset shape, with
#          the table given as TABLE (default: the committed one), bounded by BENCH_SECONDS
#          (KERNELS=a,b,... or a group name gemm|memory|attention for some launches only);
#   profile: each GPU kernel's device time behind the launches KERNELS=a,b,... (default and
#          TABLE's config; bench/launch_profile.py), bounded by PROFILE_SECONDS.
#   usage (device tool): source .gpubundle/install.sh && bash bench/h200_kernels.sh parity|sweep|bench|profile ...
#   the attention run: TESTS="tests/test_sparse_attention.py tests/test_compressor.py tests/test_indexer.py"
#     GROUP=attention KERNELS=attention TABLE=$OUT/sm_90.json bash bench/h200_kernels.sh parity sweep bench
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
db=.sweepdb/h200.db; mkdir -p .sweepdb  # a fresh host has no copy of the sweep database: start one
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-block
step() { echo "== $(date -u +%T) $*" | tee -a "$out/log.txt"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee -a "$out/log.txt"

gemms=expert_up_fwd,expert_down_fwd,expert_down_bwd_dx,expert_up_bwd_dx,expert_down_bwd_dw,expert_up_bwd_dw
attention=sparse_attn_fwd,sparse_attn_bwd,compressor_fwd,compressor_bwd,indexer_fwd
memory_bound=mhc_glue_fwd,mhc_glue_bwd,mhc_collapse_fwd,mhc_collapse_bwd,mhc_expand_fwd,mhc_expand_bwd,rope_fwd,rope_bwd,router_fwd,router_bwd,router_hash_fwd
for phase in "$@"; do case "$phase" in
parity)
  step "parity tests on the GPU: ${TESTS:-the block kernels}"
  timeout -k 15 -s INT "${PARITY_SECONDS:-900}" python -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_mhc.py tests/test_rope.py tests/test_router.py \
    tests/test_grouped_gemm.py} 2>&1 | tee "$out/parity.log" | tail -8 | tee -a "$out/log.txt"
  ;;
sweep)
  step "queue the sweeps"
  rm -rf /tmp/specs  # a warm host keeps the specs of an earlier call
  python bench/sweep_specs.py /tmp/specs ${GROUP:-} | tee -a "$out/log.txt"
  python -m tuner.cli --db "sqlite:///$db" sweep queue /tmp/specs/${SPECS:-*}.yaml 2>&1 | tr "\n" " " | tee -a "$out/log.txt"; echo
  step "run them on every GPU (at most ${SWEEP_SECONDS:=400} s; finished trials are kept either way)"
  timeout -k 15 -s INT "$SWEEP_SECONDS" python -m tuner.cli --db "sqlite:///$db" serve --drain 2>&1 \
    | grep -v '━' | tail -50 | tee -a "$out/log.txt"
  python -m tuner.cli --db "sqlite:///$db" sweep list 2>&1 | tail -45 | tee -a "$out/log.txt"
  step "export"
  [ -f "$out/sm_90.json" ] || cp kernels/tables/sm_90.json "$out/"  # what EXPORT_ARGS=--merge keeps entries of
  # its whole output in export.log; here every warning (an entry slower than an older sweep's or
  # the merged table's), then the last lines of the rest
  python -m tuner.cli --db "sqlite:///$db" export --arch sm_90 --out "$out" ${EXPORT_ARGS:-} > /tmp/export.log 2>&1
  cat /tmp/export.log >> "$out/export.log"
  { grep '^warning' /tmp/export.log; grep -v '^warning' /tmp/export.log | tail -3; } | tee -a "$out/log.txt"
  cp "$db" "$out/h200.db"
  ;;
bench)
  case "${KERNELS:-}" in
    "") kernels=$gemms,$memory_bound ;; gemm) kernels=$gemms ;; memory) kernels=$memory_bound ;;
    attention) kernels=$attention ;; *) kernels=$KERNELS ;;
  esac
  step "tuned vs default vs eager (vs peers)"
  timeout -k 15 -s INT "${BENCH_SECONDS:-500}" python bench/kernels_h200.py "${TABLE:-kernels/tables/sm_90.json}" "$out/kernels.json" \
    "$kernels" \
    v4-flash,v4-pro 2>&1 | grep -v '^{' | tail -150 | tee -a "$out/log.txt"
  ;;
profile)
  step "device time of each GPU kernel behind ${KERNELS:?profile needs KERNELS=a,b,...}"
  timeout -k 15 -s INT "${PROFILE_SECONDS:-300}" python bench/launch_profile.py "${TABLE:-kernels/tables/sm_90.json}" \
    "$out/launches.json" "$KERNELS" v4-flash,v4-pro 2>&1 | tail -5 | tee -a "$out/log.txt"
  ;;
*) echo "usage: $0 parity|sweep|bench|profile ..." >&2; exit 2 ;;
esac; done

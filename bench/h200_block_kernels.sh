#!/usr/bin/env bash
# The V4 block kernels' H200 run (mHC glue/collapse/expand, RoPE, router, expert GEMMs), in two
# device calls that share one sweep database (copied in as .sweepdb/h200.db, so the export keeps
# the entries of earlier runs):
#   parity: every launch's parity tests on the GPU;
#   sweep: the sweeps of bench/block_kernel_specs.py through the service on all GPUs (bounded by
#          SWEEP_SECONDS; GROUP=gemm|memory for one group), then the sm_90 export;
#   bench: tuned vs default vs eager (and the expert GEMMs' peers) at every preset shape, with
#          the table given as TABLE (default: the committed one), bounded by BENCH_SECONDS
#          (KERNELS=a,b,... for some launches only).
#   usage (device tool): source .gpubundle/install.sh && bash bench/h200_block_kernels.sh parity|sweep|bench ...
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
db=.sweepdb/h200.db
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-block
step() { echo "== $(date -u +%T) $*" | tee -a "$out/log.txt"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee -a "$out/log.txt"

gemms=expert_up_fwd,expert_down_fwd,expert_down_bwd_dx,expert_up_bwd_dx,expert_down_bwd_dw,expert_up_bwd_dw
memory_bound=mhc_glue_fwd,mhc_glue_bwd,mhc_collapse_fwd,mhc_collapse_bwd,mhc_expand_fwd,mhc_expand_bwd,rope_fwd,rope_bwd,router_fwd,router_bwd,router_hash_fwd
for phase in "$@"; do case "$phase" in
parity)
  step "parity tests of the block kernels on the GPU"
  python -m pytest -q -p no:cacheprovider tests/test_mhc.py tests/test_rope.py tests/test_router.py \
    tests/test_grouped_gemm.py 2>&1 | tail -8 | tee -a "$out/log.txt"
  ;;
sweep)
  step "queue the sweeps"
  python bench/block_kernel_specs.py /tmp/specs ${GROUP:-} | tee -a "$out/log.txt"
  python -m tuner.cli --db "sqlite:///$db" sweep queue /tmp/specs/*.yaml 2>&1 | tr "\n" " " | tee -a "$out/log.txt"; echo
  step "run them on every GPU (at most ${SWEEP_SECONDS:=400} s; finished trials are kept either way)"
  timeout -s INT "$SWEEP_SECONDS" python -m tuner.cli --db "sqlite:///$db" serve --drain 2>&1 \
    | grep -v '━' | tail -50 | tee -a "$out/log.txt"
  python -m tuner.cli --db "sqlite:///$db" sweep list 2>&1 | tail -45 | tee -a "$out/log.txt"
  step "export"
  python -m tuner.cli --db "sqlite:///$db" export --arch sm_90 --out "$out" 2>&1 | tail -3 | tee -a "$out/log.txt"
  cp "$db" "$out/h200.db"
  ;;
bench)
  step "tuned vs default vs eager vs peers"
  timeout -s INT "${BENCH_SECONDS:-500}" python bench/kernels_h200.py "${TABLE:-kernels/tables/sm_90.json}" "$out/block_kernels.json" \
    "${KERNELS:-$gemms,$memory_bound}" \
    v4-flash,v4-pro 2>&1 | grep -v '^{' | tail -150 | tee -a "$out/log.txt"
  ;;
*) echo "usage: $0 parity|sweep|bench ..." >&2; exit 2 ;;
esac; done

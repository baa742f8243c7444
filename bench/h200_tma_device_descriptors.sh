#!/usr/bin/env bash
# One H200 call (2026-12-02f, call 5): the indexer scoring's and the glue backward's TMA paths with
# descriptors built on the device (tl.make_tensor_descriptor) instead of by the host.
#   1. GPU parity of both kernels' tests;
#   2. host against device time per call (bench/launch_host_time.py) of TMA against pointer twins:
#      does the device-built descriptor remove the host time the host-built one added?
#   3. the glue-bwd-tma grid through the service, then the sm_90 export (the indexer's TMA entries,
#      the same configs, stay from the host-descriptor grid; step 4 re-measures them);
#   4. tuned vs default vs eager with that table, and host time of its default and tuned configs.
#   usage (device tool): source .gpubundle/install.sh && bash bench/h200_tma_device_descriptors.sh
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=. EXPORT_ARGS="--merge --fastest mhc_glue_bwd"
host_time() { timeout -k 10 -s INT 60 python bench/launch_host_time.py "$@" 2>&1 | cut -c1-160 | tail -16; }
TESTS="tests/test_indexer.py tests/test_mhc.py" PARITY_SECONDS=150 bash bench/h200_kernels.sh parity
indexer='{"BLOCK_S": 64, "BLOCK_H": 1, "BLOCK_T": 128, "KEY_TILES": 1, "LATE_HEAD_SUM": 0, "num_warps": 4, "num_stages": 3, "SELECT_ROWS": 1, "SELECT_WARPS": 2, "SELECT_INTERP": 1'
glue='{"BLOCK_N": 64, "BLOCK_K": 64, "SLABS": 2, "DFN_TRANSPOSED": 1, "num_warps": 4, "num_stages": 2'
host_time kernels/tables/sm_90.json "$out/indexer-host-time-device-descriptors.json" indexer_fwd v4-flash \
  --configs "{\"tma\": $indexer, \"TMA\": 1}, \"pointers\": $indexer, \"TMA\": 0}}"
host_time kernels/tables/sm_90.json "$out/glue-bwd-host-time-device-descriptors.json" mhc_glue_bwd v4-flash \
  --configs "{\"tma\": $glue, \"TMA\": 1}, \"pointers\": $glue, \"TMA\": 0}}"
GROUP=glue-bwd-tma SWEEP_SECONDS=150 bash bench/h200_kernels.sh sweep
python bench/trials_to_csv.py "$out/h200.db" "$out/sweep-trials-glue-bwd-tma-device-descriptors.csv" && rm -f "$out/h200.db"
KERNELS=indexer_fwd,mhc_glue_bwd TABLE="$out/sm_90.json" BENCH_SECONDS=100 bash bench/h200_kernels.sh bench
host_time "$out/sm_90.json" "$out/indexer-host-time-tuned.json" indexer_fwd v4-flash,v4-pro
host_time "$out/sm_90.json" "$out/glue-bwd-host-time-tuned.json" mhc_glue_bwd v4-flash,v4-pro

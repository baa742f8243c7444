#!/usr/bin/env bash
# One H200 call (2026-12-02f, call 5): the indexer scoring's and the glue backward's TMA paths with
# descriptors built on the device (tl.make_tensor_descriptor) instead of by the host.
#   1. GPU parity of both kernels' tests;
#   2. host against device time per call (bench/launch_host_time.py) of TMA against pointer twins:
#      does the device-built descriptor remove the host time the host-built one added?
#   3. tuned vs default vs eager of the indexer with the committed table (its TMA entries at 8,192
#      came from the host-descriptor grid of call 1; this re-measures them with device descriptors).
# (The glue backward's re-sweep was dropped for the device time left.)
#   usage (device tool): source .gpubundle/install.sh && bash bench/h200_tma_device_descriptors.sh
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=.
host_time() { timeout -k 10 -s INT 45 python bench/launch_host_time.py "$@" 2>&1 | cut -c1-160 | tail -16; }
TESTS="tests/test_indexer.py tests/test_mhc.py" PARITY_SECONDS=100 bash bench/h200_kernels.sh parity
indexer='{"BLOCK_S": 64, "BLOCK_H": 1, "BLOCK_T": 128, "KEY_TILES": 1, "LATE_HEAD_SUM": 0, "num_warps": 4, "num_stages": 3, "SELECT_ROWS": 1, "SELECT_WARPS": 2, "SELECT_INTERP": 1'
glue='{"BLOCK_N": 64, "BLOCK_K": 64, "SLABS": 2, "DFN_TRANSPOSED": 1, "num_warps": 4, "num_stages": 2'
host_time kernels/tables/sm_90.json "$out/indexer-host-time-device-descriptors.json" indexer_fwd v4-flash \
  --configs "{\"tma\": $indexer, \"TMA\": 1}, \"pointers\": $indexer, \"TMA\": 0}}"
host_time kernels/tables/sm_90.json "$out/glue-bwd-host-time-device-descriptors.json" mhc_glue_bwd v4-flash \
  --configs "{\"tma\": $glue, \"TMA\": 1}, \"pointers\": $glue, \"TMA\": 0}}"
KERNELS=indexer_fwd BENCH_SECONDS=60 bash bench/h200_kernels.sh bench

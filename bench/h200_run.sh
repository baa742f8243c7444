#!/usr/bin/env bash
# Everything the sweep-service issue measures on an H200 host, in one device call:
# kernel parity on the GPU, sweeps of every kernel through the service on all GPUs,
# export of the sm_90 table, tuned/default/eager timings, service vs @triton.autotune.
#   usage (device tool): source .gpubundle/install.sh && bash bench/h200_run.sh
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-sweeps
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/log.txt"
step() { echo "== $*" | tee -a "$out/log.txt"; }

step "what a zero-GPU Ray task sees (compile workers need the GPUs visible)"
python - <<'PY' 2>&1 | tail -3 | tee -a "$out/log.txt"
import ray
from workers.pool import _worker_env
ray.init(include_dashboard=False, log_to_driver=False)
@ray.remote(num_cpus=1)
def probe():
    import os, torch
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count()
print("compile task sees", ray.get(probe.options(runtime_env={"env_vars": _worker_env(False)}).remote()))
PY

step "parity tests on the GPU"
python -m pytest -q -x tests/test_rmsnorm.py tests/test_sinkhorn.py tests/test_tuning.py 2>&1 | tail -5 | tee -a "$out/log.txt"

step "sweeps of every kernel through the service (grid, V4-Flash shapes) + export"
rm -f /tmp/sweeps.db
python -m tuner.cli --db sqlite:////tmp/sweeps.db quickstart --out "$out" 2>&1 | grep -v '━' | tail -60 | tee -a "$out/log.txt"
cp /tmp/sweeps.db "$out/sweeps.db"

step "tuned vs default vs eager"
python bench/kernels_h200.py "$out/sm_90.json" "$out/kernels.json" 2>&1 | tail -30 | tee -a "$out/log.txt"

step "service vs @triton.autotune, cold caches"
python bench/service_vs_autotune.py "$out/autotune.json" 2>&1 | grep -v '━' | tail -60 | tee -a "$out/log.txt"

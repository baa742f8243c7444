#!/usr/bin/env bash
# The expert GEMMs' HIP spaces against offline gfx942 (MI300X) and gfx950 (MI355X) compiles at the
# V4-Flash EP = 8 shape (bench/space_vs_compiles.py --arch): of a seeded sample of the configs each
# space admits there, how many fit, spill or would not load (more LDS than a workgroup may take).
# Triton 3.6 venv as bench/offline_compiler_knobs.sh.
# Usage: bash bench/offline_amd_space_checks.sh [OUT_DIR] [SAMPLE]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-04e-cpu-compiler-knobs}
sample=${2:-30}
source bench/offline_sm90_run.sh  # checks the venv, makes $out
for arch in gfx942 gfx950; do
  for kernel in expert_up_fwd expert_down_fwd expert_up_bwd_dx expert_down_bwd_dx expert_up_bwd_dw expert_down_bwd_dw; do
    PYTHONPATH=.:bench "$venv/bin/python" bench/space_vs_compiles.py $kernel v4-flash \
      tokens=24576,experts=32,hidden=4096,ffn=2048,skew=0 "$out/$arch-space-$kernel.json" \
      --sample "$sample" --admitted-only --arch $arch | tail -6
  done
done

#!/usr/bin/env bash
# What the expert GEMMs' compiler knobs change, from offline compiles at the V4-Flash EP = 8 shape
# (24,576 rows over 32 experts; bench/offline_compiler_knobs.py): Hopper warp specialization on sm_90
# (at 4 and, to show that Triton then compiles the plain loop, 8 warps; and on sm_100), and AMD's async copies and
# block ping-pong schedule on gfx942 (MI300X) and gfx950 (MI355X). Triton 3.6, the H200 image's version,
# in its own venv (VENV, default /tmp/triton36; bench/offline_sm90_compiles.sh creates it).
# Usage: bash bench/offline_compiler_knobs.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-04e-cpu-compiler-knobs}
source bench/offline_sm90_run.sh  # checks the venv, makes $out
shape=tokens=24576,experts=32,hidden=4096,ffn=2048,skew=0
knobs() { PYTHONPATH=.:bench "$venv/bin/python" bench/offline_compiler_knobs.py "$@"; }

knobs "$out/sm_90-warp-specialize.json" sm_90 expert_up_fwd,expert_down_fwd,expert_up_bwd_dx,expert_down_bwd_dx \
  v4-flash "$shape" '{
  "128x128x64-w4": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 3},
  "128x128x64-w4-ws": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 3,
                       "WARP_SPECIALIZE": 1},
  "64x128x64-w4": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 4},
  "64x128x64-w4-ws": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 4,
                      "WARP_SPECIALIZE": 1},
  "128x128x64-w8-ws": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1, "num_warps": 8, "num_stages": 3,
                       "WARP_SPECIALIZE": 1}}'
knobs "$out/sm_100-warp-specialize.json" sm_100 expert_down_fwd v4-flash "$shape" '{
  "128x128x64-w4": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 3},
  "128x128x64-w4-ws": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 3,
                       "WARP_SPECIALIZE": 1}}'
for arch in gfx942 gfx950; do
  knobs "$out/$arch-async-copy-and-pingpong.json" $arch \
    expert_up_fwd,expert_down_fwd,expert_up_bwd_dx,expert_down_bwd_dx,expert_up_bwd_dw,expert_down_bwd_dw v4-flash "$shape" '{
  "128x128": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "async_copy": 0, "block_pingpong": 0},
  "128x128-async": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "async_copy": 1, "block_pingpong": 0},
  "128x256": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "async_copy": 0, "block_pingpong": 0},
  "128x256-pingpong": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "async_copy": 0, "block_pingpong": 1},
  "128x256-async-pingpong": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "async_copy": 1, "block_pingpong": 1}}'
done
# kpack, which Triton 3.6 overrides to 1 on gfx950 (so its spaces leave 2 out there: ignored_knob_values).
for arch in gfx942 gfx950; do
  knobs "$out/$arch-kpack.json" $arch expert_down_fwd v4-flash "$shape" '{
  "kpack-1": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "kpack": 1},
  "kpack-2": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2, "kpack": 2}}'
done
# The row-tile GEMMs' default and tuned configs (the committed table) at the Flash EP = 8 shapes,
# compiled from this tree and from BEFORE (the commit before WARP_SPECIALIZE, with this script): equal
# code digests say the knob's constexpr branch left the code of every measured config as it was.
before=${BEFORE:-eeaec63}
results=$(cd "$out" && pwd)
tree=$(mktemp -d); git worktree add -q --detach "$tree" "$before"
cp bench/offline_compiler_knobs.py "$tree/bench/"
for side in after before; do
  dir=$PWD; [ $side = before ] && dir=$tree
  (cd "$dir" && PYTHONPATH=.:bench "$venv/bin/python" bench/offline_compiler_knobs.py "$results/sm_90-tuned-$side.json" \
    sm_90 expert_up_fwd,expert_down_fwd,expert_up_bwd_dx,expert_down_bwd_dx v4-flash experts=32,hidden=4096 \
    table:kernels/tables/sm_90.json)
done
git worktree remove --force "$tree"
# Every warp-specialized config that GROUP=gemm-warp-specialized (bench/sweep_specs.py) sweeps and the
# launch's space admits at the EP = 8 shape, and the 256-wide tiles that the spaces leave out since
# Triton 3.6 does not compile them.
for kernel in expert_up_fwd expert_down_fwd expert_up_bwd_dx expert_down_bwd_dx; do
  grid=$(PYTHONPATH=.:bench "$venv/bin/python" -c "
import json, sys
from search_spaces import load_space
from sweep_specs import WARP_SPECIALIZED_SPACE
from kernels import registry
shape = registry.get('$kernel').presets['v4-flash'][0]
space = load_space('$kernel').with_overrides(WARP_SPECIALIZED_SPACE)
print(json.dumps({f\"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}-s{c['num_stages']}\": c
                  for c in space.grid('sm_90') if space.violation(c, shape, 'sm_90') is None}))")
  knobs "$out/sm_90-warp-specialized-grid-$kernel.json" sm_90 $kernel v4-flash "$shape" "$grid"
done
knobs "$out/sm_90-warp-specialized-256-wide.json" sm_90 expert_down_fwd,expert_up_bwd_dx v4-flash "$shape" '{
  "64x256x64-s2": {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 2, "WARP_SPECIALIZE": 1},
  "64x256x64-s3": {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 3, "WARP_SPECIALIZE": 1}}'

#!/usr/bin/env bash
# Offline sm_90 compiles (Triton 3.6, no GPU) of the attention forward and backward with P (and
# dS) handed to the second dots through memory (UNCHAINED 1) against the chained form: registers,
# spills, shared memory, wgmma count and the instructions of each SASS loop, at the Flash CSA
# shape, in the tilings the 2026-12-03 write-up cites; the *_ptx rows wait by inline PTX
# (PTX_BARRIER 1, the hand-off read volatile; *_ptx_plain: 2, read plainly), around which a
# two-stage loop pipelines its gathers (more shared memory); the *_w16 rows run the unchained
# forms on 16 warps, the *_lazy rows with lazy rescaling (RESCALE_SLACK 8, which the space rules
# out with UNCHAINED); the plain-handoff file: PTX_BARRIER 2 at every forward preset shape
# (2026-12-03b write-up). Same Triton 3.6 venv as
# bench/offline_sm90_compiles.sh (VENV, default /tmp/triton36).
# Usage: bash bench/offline_sm90_attention_unchained.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/2026-12-03-h200}
source bench/offline_sm90_run.sh

fwd='"BLOCK_H": 64, "num_warps": 8, "RESCALE_SLACK": 0, "maxnreg": null'
run "$out/offline-sm90-attention-fwd-unchained.json" sparse_attn_fwd v4-flash --only ratio=4,topk=512 --configs "{
  \"64_stage1_chained\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 1, \"UNCHAINED\": 0},
  \"64_stage1_unchained\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 1, \"UNCHAINED\": 1},
  \"64_stage2_chained\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 2, \"UNCHAINED\": 0},
  \"64_stage2_unchained\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 2, \"UNCHAINED\": 1},
  \"32_stage2_unchained\": {$fwd, \"TILE_K\": 32, \"TAIL_K\": 0, \"num_stages\": 2, \"UNCHAINED\": 1},
  \"64_stage2_unchained_ptx\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 2, \"UNCHAINED\": 1,
                               \"PTX_BARRIER\": 1},
  \"64_stage2_unchained_ptx_plain\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 2, \"UNCHAINED\": 1,
                                     \"PTX_BARRIER\": 2},
  \"64_stage2_unchained_w16\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 2, \"UNCHAINED\": 1,
                               \"num_warps\": 16},
  \"32_stage2_unchained_w16\": {$fwd, \"TILE_K\": 32, \"TAIL_K\": 0, \"num_stages\": 2, \"UNCHAINED\": 1,
                               \"num_warps\": 16},
  \"64_stage1_unchained_lazy\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 1, \"UNCHAINED\": 1,
                                \"RESCALE_SLACK\": 8},
  \"64_stage2_unchained_ptx_plain_lazy\": {$fwd, \"TILE_K\": 64, \"TAIL_K\": 0, \"num_stages\": 2, \"UNCHAINED\": 1,
                                          \"PTX_BARRIER\": 2, \"RESCALE_SLACK\": 8}}"
plain="$fwd, \"UNCHAINED\": 1, \"num_stages\": 2, \"PTX_BARRIER\": 2"
run "$out/offline-sm90-plain-handoff-fwd.json" sparse_attn_fwd v4-flash,v4-pro --configs "{
  \"64_tail32_ptx_plain\": {$plain, \"TILE_K\": 64, \"TAIL_K\": 32},
  \"32_ptx_plain\": {$plain, \"TILE_K\": 32, \"TAIL_K\": 0}}"
bwd='"BLOCK_H": 64, "DE_TRANSPOSED": 1, "R_CHUNK": 0, "num_warps": 8, "num_stages": 2, "maxnreg": null'
run "$out/offline-sm90-attention-bwd-unchained.json" sparse_attn_bwd v4-flash --only ratio=4,topk=512 --configs "{
  \"64x16_atomic_chained\": {$bwd, \"TILE_K\": 16, \"DKV_MODE\": \"atomic\", \"UNCHAINED\": 0},
  \"64x16_atomic_unchained\": {$bwd, \"TILE_K\": 16, \"DKV_MODE\": \"atomic\", \"UNCHAINED\": 1},
  \"64x16_split_chained\": {$bwd, \"TILE_K\": 16, \"DKV_MODE\": \"split\", \"UNCHAINED\": 0},
  \"64x16_split_unchained\": {$bwd, \"TILE_K\": 16, \"DKV_MODE\": \"split\", \"UNCHAINED\": 1},
  \"64x32_atomic_unchained\": {$bwd, \"TILE_K\": 32, \"DKV_MODE\": \"atomic\", \"UNCHAINED\": 1},
  \"64x16_atomic_unchained_ptx\": {$bwd, \"TILE_K\": 16, \"DKV_MODE\": \"atomic\", \"UNCHAINED\": 1,
                                  \"PTX_BARRIER\": 1},
  \"64x32_atomic_unchained_ptx_plain\": {$bwd, \"TILE_K\": 32, \"DKV_MODE\": \"atomic\", \"UNCHAINED\": 1,
                                        \"PTX_BARRIER\": 2},
  \"64x32_atomic_unchained_w16\": {$bwd, \"TILE_K\": 32, \"DKV_MODE\": \"atomic\", \"UNCHAINED\": 1,
                                  \"num_warps\": 16}}"

#!/usr/bin/env bash
# Whether the sparse-attention backward's 64 x 16 transposed tile hits its illegal address (the
# 2026-12-01 H200 grid: at one stage only, at all six sequence-4,096 shapes) at a short sequence
# too, one process per (sequence, stages) since an illegal address ends the CUDA context.
#   usage (device tool): source .gpubundle/install.sh && bash bench/illegal_address_probe.sh
for seq in 256 4096; do for stages in 1 2; do
  CUDA_LAUNCH_BLOCKING=1 timeout 90 python - "$seq" "$stages" <<'PY' 2>&1 | tail -1 | sed "s/^/seq $seq, num_stages $stages: /"
import sys, torch
from kernels import registry
kernel = registry.get("sparse_attn_bwd")
shape = {"batch": 1, "seq": int(sys.argv[1]), "heads": 64, "ratio": 0, "topk": 0, "window": 128}
config = kernel.default_config(shape) | {"BLOCK_H": 64, "TILE_K": 16, "num_warps": 8, "num_stages": int(sys.argv[2]),
                                         "DKV_MODE": "atomic", "R_CHUNK": 0, "DE_TRANSPOSED": 1}
kernel.run(kernel.make_inputs(shape, torch.device("cuda"), 0), config)
torch.cuda.synchronize()
print("ran")
PY
done; done

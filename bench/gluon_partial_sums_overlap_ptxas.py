"""Offline sm_90 (Triton 3.6, no GPU): the Gluon forward with partial sums and the overlap together,
the pair ``kernels.sparse_attention_sm90.MODES`` leaves out, compiled at the Flash CSA shape with
the ptxas Triton bundles, or with ``--ptxas PATH`` (e.g. CUDA 13.0's): whether it compiles, and its
registers and spills where it does. One JSON line to OUT_JSON.

Usage (the Triton 3.6 venv of bench/offline_sm90_compiles.sh):
  PYTHONPATH=. /tmp/triton36/bin/python bench/gluon_partial_sums_overlap_ptxas.py OUT_JSON [--ptxas PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import kernel_resources  # bench/ is the script directory

FLASH_CSA = {"batch": 1, "seq": 4096, "heads": 64, "ratio": 4, "topk": 512, "window": 128}


def compile_pair() -> dict:
    """The pair's resources at Flash CSA, or the compile's error."""
    import torch
    import triton

    from kernels import registry, sparse_attention
    from kernels import sparse_attention_sm90 as sm90

    inputs = registry.get("sparse_attn_fwd").make_inputs(FLASH_CSA, torch.device("cpu"), 3)
    q = inputs["q"]
    args = (q, inputs["kv"], inputs["kv_compressed"], inputs["indices"], inputs["sink"], torch.empty_like(q),
            torch.empty(q.shape[:3], dtype=torch.float32), FLASH_CSA["seq"], FLASH_CSA["heads"],
            inputs["kv_compressed"].shape[1], FLASH_CSA["topk"], FLASH_CSA["window"],
            sparse_attention.SOFTMAX_SCALE * sparse_attention._LOG2E)
    constexprs = {"RATIO": FLASH_CSA["ratio"], "TOPK_BLOCK": triton.next_power_of_2(FLASH_CSA["topk"]),
                  "BLOCK": sm90.BLOCK_H, "TILE": sm90.TILE_K, "D": q.shape[-1], "PARTIAL_SUMS": True,
                  "OVERLAP": True, "STATIC_SLOTS": False, "LATE_FIRST": False, "num_warps": sm90.NUM_WARPS}
    try:
        compiled = sm90._sparse_attn_fwd_sm90_kernel.warmup(*args, grid=(1, 1, 1), **constexprs)
    except Exception as error:  # noqa: BLE001 - the compile's failure is the result
        return {"compiled": False, "error": f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"}
    return {"compiled": True, **kernel_resources._resources(compiled, kernel_resources.SM90_SHARED_PER_SM, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ptxas", default=None, help="compile with this ptxas instead of Triton's")
    args = parser.parse_args()
    if args.ptxas:
        os.environ["TRITON_PTXAS_PATH"] = args.ptxas
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # compile afresh, whichever ptxas ran before
    kernel_resources._use_offline_arch("sm_90")
    result = {"ptxas": args.ptxas or "bundled with Triton", **compile_pair()}
    args.out.write_text(json.dumps(result) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

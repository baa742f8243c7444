"""The scale of the sparse-attention backward's reference gradients at a V4 shape, on the CPU.

The tolerance a full-size trial is checked against only means something next to the size of what
it checks: this prints each reference gradient's element count, RMS and largest magnitude (seed 0,
the sweeps' inputs) as JSON.

Usage: python bench/attention_grad_scale.py [OUT_JSON]   (Flash window shape; about a minute)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kernels import registry

SHAPE = {"batch": 1, "seq": 4096, "heads": 64, "ratio": 0, "topk": 0, "window": 128}
NAMES = ("dq", "dkv", "dsink")  # the window layer has no compressed entries


def main() -> None:
    kernel = registry.get("sparse_attn_bwd")
    grads = kernel.reference(kernel.make_inputs(SHAPE, torch.device("cpu"), 0))
    rows = {name: {"elements": g.numel(), "rms": g.float().pow(2).mean().sqrt().item(),
                   "max_abs": g.float().abs().max().item()} for name, g in zip(NAMES, grads, strict=True)}
    text = json.dumps({"kernel": kernel.name, "shape": SHAPE, "seed": 0, "gradients": rows}, indent=1)
    print(text)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text + "\n")


if __name__ == "__main__":
    main()

"""Registers, spills and shared memory of the compiled Triton kernels behind registered launches.

The benchmark write-ups name what bounds a kernel; this script reads it from the compiler instead
of guessing: for each launch and preset shape asked, it runs the heuristic default and the table's
config once and records, for every Triton kernel those runs launched, ``n_regs`` (per thread),
``n_spills``, shared memory bytes and ``num_warps``, plus what that allows per SM (65,536
registers, the device's shared memory per SM).

Usage (on a GPU): python bench/kernel_resources.py TABLE_JSON OUT_JSON KERNEL,KERNEL,... [PRESET,...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from triton.runtime.jit import JITFunction

from kernels import registry

REGISTERS_PER_SM = 65536
_launched: list[Any] = []


def _recording_run(original):
    """``JITFunction.run`` that also keeps the compiled kernel of each launch."""
    def run(self, *args, **kwargs):
        compiled = original(self, *args, **kwargs)
        _launched.append((self.fn.__name__, compiled))
        return compiled
    return run


def _resources(compiled: Any, smem_per_sm: int) -> dict[str, Any]:
    compiled._init_handles()
    warps = compiled.metadata.num_warps
    shared = compiled.metadata.shared
    by_regs = REGISTERS_PER_SM // max(1, compiled.n_regs * warps * 32)
    by_smem = smem_per_sm // shared if shared else None
    return {"n_regs": compiled.n_regs, "n_spills": compiled.n_spills, "shared_bytes": shared,
            "num_warps": warps, "num_stages": compiled.metadata.num_stages,
            "programs_per_sm": min(by_regs, by_smem) if by_smem is not None else by_regs}


def main() -> None:
    table = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    names = sys.argv[3].split(",")
    presets = sys.argv[4].split(",") if len(sys.argv) > 4 else ["v4-flash"]
    smem_per_sm = torch.cuda.get_device_properties(0).shared_memory_per_multiprocessor
    JITFunction.run = _recording_run(JITFunction.run)
    rows = []
    for name in names:
        kernel = registry.get(name)
        shapes = {kernel.shape_key(s): s for p in presets for s in kernel.presets.get(p, [])}
        for key, shape in shapes.items():
            inputs = kernel.make_inputs(shape, torch.device("cuda"), 3)
            configs = {"default": kernel.default_config(shape)}
            tuned = table["entries"].get(name, {}).get(key, {}).get("config")
            if tuned is not None:
                configs["tuned"] = tuned
            for variant, config in configs.items():
                _launched.clear()
                kernel.run(inputs, config)
                torch.cuda.synchronize()
                launched = {fn: _resources(c, smem_per_sm) for fn, c in _launched}
                rows.append({"kernel": name, "shape": key, "variant": variant, "config": config,
                             "triton_kernels": launched})
                print(name, key, variant, json.dumps(launched), flush=True)
            del inputs
            torch.cuda.empty_cache()
            out.write_text(json.dumps({"smem_per_sm": smem_per_sm, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

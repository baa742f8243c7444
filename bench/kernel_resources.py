"""Registers, spills, shared memory and MMA instructions of the compiled Triton kernels behind registered launches.

The benchmark write-ups name what bounds a kernel; this script reads it from the compiler instead
of guessing: for each launch and preset shape asked, it runs the heuristic default and the table's
config once (or the configs of ``--configs``) and records, for every Triton kernel those runs
launched, registers per thread, spilled bytes, shared memory, ``num_warps``, what that allows per SM
(65,536 registers, the device's shared memory, 32 programs and 64 warps per SM), how many
warpgroup MMAs (``HGMMA``, Hopper's wgmma), warp-level MMAs (``HMMA``, mma.sync) and memory
barriers (``MEMBAR``) its SASS holds, the instructions of each of its loop bodies, and where ptxas
serialized its warpgroup MMAs, the reason ptxas gives (its C75xx warning; the kernel's PTX is
assembled again to read it).

On a machine without a GPU it compiles for ``--offline-arch`` (sm_90) instead of launching: Triton's
JIT specialises and compiles exactly as for a launch, and the registers and spills come from the
cubin's resource table (``cuobjdump``). With the Triton version of the GPU image, these equal what
the GPU reports (``bench/results/2026-12-01-cpu-offline-resources/agreement.md``). Beside OUT_JSON
it writes the same rows as a markdown table (OUT.md).

Usage: python bench/kernel_resources.py TABLE_JSON OUT_JSON KERNEL,KERNEL,... [PRESET,...]
           [--configs CONFIGS_JSON] [--only SHAPE_TEXT] [--offline-arch sm_90]
CONFIGS_JSON maps a variant name to a config (merged over the default), e.g. '{"wide": {"BLOCK_N": 64}}'.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
import triton
from triton.runtime.jit import JITFunction

REGISTERS_PER_SM = 65536
BLOCKS_PER_SM, WARPS_PER_SM = 32, 64  # sm_80 and sm_90 limits
SM90_SHARED_PER_SM = 233472  # what an H200 reports (shared_memory_per_multiprocessor)
_CUDA_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_launched: list[Any] = []


def _recording_run(original, compile_only: bool):
    """``JITFunction.run`` that also keeps the compiled kernel of each launch (only compiling it offline)."""
    def run(self, *args, grid, warmup, **kwargs):
        compiled = original(self, *args, grid=grid, warmup=warmup or compile_only, **kwargs)
        _launched.append((self.fn.__name__, compiled))
        return compiled
    return run


def record_launches(compile_only: bool) -> None:
    """Route every launch through ``_recording_run``: ``kernels.launch`` would otherwise call a key's
    compiled kernel directly from its second launch on, past ``JITFunction.run``, and record nothing."""
    from kernels import launch as launch_module

    launch_module.CACHE_COMPILED = False
    JITFunction.run = _recording_run(JITFunction.run, compile_only)


class _OfflineDriver:
    """The little of Triton's driver that its JIT needs to compile (not launch) for a GPU it does not have."""

    def __init__(self, arch: str) -> None:
        from triton.backends.compiler import GPUTarget
        from kernels.arch import backend_of
        if backend_of(arch) == "hip":
            self.target = GPUTarget("hip", arch, 64)
        else:
            self.target = GPUTarget("cuda", int(arch.removeprefix("sm_")), 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(_CUDA_BIN / "cuobjdump"), *flags, f.name], capture_output=True,
                              text=True, check=True).stdout


_SERIALIZED = re.compile(r"\((C75\d\d)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized "
                         r"due to (.*?) in the function")


def serialization_reason(ptxas_output: str) -> str:
    """ptxas's warning code and reason where it serialized a kernel's warpgroup MMAs (``C7515: non
    wgmma instructions defining ...``), or '' where it did not."""
    match = _SERIALIZED.search(ptxas_output)
    return f"{match.group(1)}: {match.group(2)}" if match else ""


def _wgmma_serialization(ptx: str) -> str:
    """Assemble ``ptx`` again with Triton's ptxas, verbose: Triton keeps none of its warnings."""
    arch = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "kernel.ptx")
        source.write_text(ptx)
        command = [str(_CUDA_BIN / "ptxas"), f"-arch={arch}", "-v", str(source), "-o", str(Path(tmp, "k.cubin"))]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    return serialization_reason(done.stdout + done.stderr)


_SASS_ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")
_BACKWARD_BRANCH = re.compile(r"\bBRA\s+(?:!?U?P\w+,\s*)?0x([0-9a-f]+)")


def _loop_spans(sass: str) -> list[tuple[int, int]]:
    """Address spans of each loop in SASS, from a backward branch's target to the branch."""
    spans = []
    for line in sass.splitlines():
        address, branch = _SASS_ADDRESS.search(line), _BACKWARD_BRANCH.search(line)
        if address and branch and int(branch.group(1), 16) < int(address.group(1), 16):
            spans.append((int(branch.group(1), 16), int(address.group(1), 16)))
    return spans


def loop_bodies(sass: str) -> list[int]:
    """Instructions of each loop body in SASS (from a backward branch's target to the branch), by
    address: what one iteration issues, where a kernel's static size says little."""
    return [(high - low) // 16 + 1 for low, high in _loop_spans(sass)]  # 16-byte instructions


def _count_in_loops(sass: str, opcode: str) -> list[int]:
    """Instructions whose opcode starts with ``opcode`` in each loop body of ``loop_bodies``."""
    found = re.compile(rf"\s{re.escape(opcode)}[\s.]")
    addresses = [int(a.group(1), 16) for line in sass.splitlines()
                 if found.search(line) and (a := _SASS_ADDRESS.search(line))]
    return [sum(low <= at <= high for at in addresses) for low, high in _loop_spans(sass)]


def loop_barriers(sass: str) -> list[int]:
    """CTA barriers (``BAR.SYNC``) in each loop body of ``loop_bodies``, in the same order: where
    the warps of a block wait for each other every iteration."""
    return _count_in_loops(sass, "BAR.SYNC")


def loop_uniform_moves(sass: str) -> list[int]:
    """Register-to-uniform-register moves (``R2UR``) in each loop body: where ptxas holds what a
    warpgroup MMA's descriptors need in ordinary registers, it moves them before every MMA."""
    return _count_in_loops(sass, "R2UR")


def loop_wgmma_waits(sass: str) -> list[int]:
    """Warpgroup-MMA waits (``WARPGROUP.DEPBAR``) in each loop body: one a step where the MMAs overlap;
    one after every HGMMA where ptxas serialized them (``wgmma_serialized`` says why), or where
    Triton waits after each MMA whose A operand comes from registers."""
    return _count_in_loops(sass, "WARPGROUP.DEPBAR")


def _sass_counts(cubin: bytes) -> dict[str, Any]:
    sass = _cuobjdump(cubin, "-sass")
    return {"hgmma": len(re.findall(r"\bHGMMA\.", sass)), "hmma": len(re.findall(r"\bHMMA\.", sass)),
            "membars": len(re.findall(r"\bMEMBAR\.", sass)), "loop_instructions": loop_bodies(sass),
            "loop_barriers": loop_barriers(sass), "loop_uniform_moves": loop_uniform_moves(sass),
            "loop_wgmma_waits": loop_wgmma_waits(sass)}


def _registers_and_spills(compiled: Any, offline: bool) -> tuple[int, int]:
    """Registers per thread and spilled bytes per thread (Triton's ``n_spills`` counts 4-byte words)."""
    if not offline:
        compiled._init_handles()
        return compiled.n_regs, compiled.n_spills * 4
    usage = _cuobjdump(compiled.asm["cubin"], "--dump-resource-usage")
    fields = dict(re.findall(r"(REG|STACK):(\d+)", usage))
    return int(fields["REG"]), int(fields["STACK"])


def _resources(compiled: Any, smem_per_sm: int, offline: bool) -> dict[str, Any]:
    regs, spilled = _registers_and_spills(compiled, offline)
    counts = _sass_counts(compiled.asm["cubin"])
    warps = compiled.metadata.num_warps
    shared = compiled.metadata.shared
    by_regs = REGISTERS_PER_SM // max(1, regs * warps * 32)
    by_smem = smem_per_sm // shared if shared else BLOCKS_PER_SM
    return {"n_regs": regs, "spilled_bytes": spilled, "shared_bytes": shared,
            "num_warps": warps, "num_stages": compiled.metadata.num_stages,
            "programs_per_sm": min(by_regs, by_smem, BLOCKS_PER_SM, WARPS_PER_SM // warps),
            **counts, "wgmma_serialized": _wgmma_serialization(compiled.asm["ptx"]) if counts["hgmma"] else ""}


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="tuned table (or, with --agree-with, unused)")
    parser.add_argument("out", type=Path)
    parser.add_argument("kernels", nargs="?", default="")
    parser.add_argument("presets", nargs="?", default="v4-flash")
    parser.add_argument("--configs", default=None, help="JSON: variant name -> config over the default")
    parser.add_argument("--only", default="", help="only the shapes whose key contains this text")
    parser.add_argument("--offline-arch", default=None, help="compile for this arch without a GPU (sm_90)")
    parser.add_argument("--agree-with", type=Path, default=None,
                        help="a GPU run's OUT_JSON: compile each of its rows offline and compare")
    return parser.parse_args()


def _use_offline_arch(arch: str) -> None:
    """Make the JIT compile for ``arch`` and the kernels believe they run there (before they import)."""
    import kernels.arch
    from triton.runtime.driver import driver
    driver.set_active(_OfflineDriver(arch))
    kernels.arch.current_arch = lambda: arch


def _measure(kernel: Any, inputs: Any, config: dict[str, Any], smem_per_sm: int, offline: bool) -> dict[str, Any]:
    """Resources of every Triton kernel that one run of ``kernel`` with ``config`` launches."""
    _launched.clear()
    kernel.run(inputs, config)
    if not offline:
        torch.cuda.synchronize()
    return {fn: _resources(c, smem_per_sm, offline) for fn, c in _launched}


def _agreement(gpu_json: Path, out: Path, smem_per_sm: int) -> None:
    """Offline resources of each row a GPU run measured, beside what the GPU reported."""
    from kernels import registry
    gpu_rows = json.loads(gpu_json.read_text())["rows"]
    rows, inputs_of = [], {}
    for row in gpu_rows:
        kernel = registry.get(row["kernel"])
        shape = next(s for p in kernel.presets.values() for s in p if kernel.shape_key(s) == row["shape"])
        if (row["kernel"], row["shape"]) not in inputs_of:
            inputs_of.clear()
            inputs_of[(row["kernel"], row["shape"])] = kernel.make_inputs(shape, torch.device("cpu"), 3)
        offline = _measure(kernel, inputs_of[(row["kernel"], row["shape"])], row["config"], smem_per_sm, True)
        for fn, gpu in row["triton_kernels"].items():
            mine = offline.get(fn, {})
            same = (mine.get("n_regs"), mine.get("spilled_bytes"), mine.get("shared_bytes")) == (
                gpu["n_regs"], gpu["n_spills"] * 4, gpu["shared_bytes"])
            rows.append({"kernel": row["kernel"], "shape": row["shape"], "variant": row["variant"],
                         "triton_kernel": fn, "gpu": gpu, "offline": mine, "agree": same})
            print(row["kernel"], row["shape"], row["variant"], fn, "agree" if same else f"DIFFER {gpu} {mine}",
                  flush=True)
        out.write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(agreement_table(rows))


def agreement_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per kernel, how many compiled kernels agree on (registers, spilled bytes, shared
    memory) with the GPU, and the GPU and offline values where they do not."""
    lines = ["| launch | compiled kernels | agree | where they differ (GPU / offline) |", "|---|---|---|---|"]
    for name in dict.fromkeys(r["kernel"] for r in rows):
        mine = [r for r in rows if r["kernel"] == name]
        differ = sorted({f"{r['triton_kernel']}: regs {r['gpu']['n_regs']} / {r['offline'].get('n_regs')}, "
                         f"spilled {r['gpu']['n_spills'] * 4} / {r['offline'].get('spilled_bytes')} B, "
                         f"shared {r['gpu']['shared_bytes']} / {r['offline'].get('shared_bytes')} B"
                         for r in mine if not r["agree"]})
        lines.append(f"| {name} | {len(mine)} | {sum(r['agree'] for r in mine)} | {'; '.join(differ)} |")
    return "\n".join(lines) + "\n"


def resources_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per compiled kernel of each (launch, shape, variant)."""
    lines = ["| launch | shape | variant | Triton kernel | registers | spilled B | shared KiB | warps | stages "
             "| programs / SM | wgmma | mma.sync | loop bodies (instructions) | loop CTA barriers | loop R2UR "
             "| loop wgmma waits | memory barriers | wgmma serialized (ptxas) |",
             "|" + "---|" * 18]
    for r in rows:
        for fn, k in r["triton_kernels"].items():
            lines.append(f"| {r['kernel']} | {r['shape']} | {r['variant']} | {fn} | {k['n_regs']} | {k['spilled_bytes']} "
                         f"| {k['shared_bytes'] / 1024:.0f} | {k['num_warps']} | {k['num_stages']} "
                         f"| {k['programs_per_sm']} | {k['hgmma']} | {k['hmma']} "
                         f"| {', '.join(map(str, k.get('loop_instructions', [])))} "
                         f"| {', '.join(map(str, k.get('loop_barriers', [])))} "
                         f"| {', '.join(map(str, k.get('loop_uniform_moves', [])))} "
                         f"| {', '.join(map(str, k.get('loop_wgmma_waits', [])))} | {k.get('membars', '-')} "
                         f"| {k.get('wgmma_serialized', '-')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = _parse_args()
    offline = args.offline_arch is not None
    if offline:
        _use_offline_arch(args.offline_arch)
        device, smem_per_sm = torch.device("cpu"), SM90_SHARED_PER_SM
    else:
        device = torch.device("cuda")
        smem_per_sm = torch.cuda.get_device_properties(0).shared_memory_per_multiprocessor
    record_launches(offline)
    if args.agree_with is not None:
        _agreement(args.agree_with, args.out, smem_per_sm)
        return
    from kernels import registry
    from launch_variants import configs_at, preset_shapes  # bench/ is the script directory

    table = json.loads(args.table.read_text())
    overrides = json.loads(args.configs) if args.configs else None
    rows = []
    for name in args.kernels.split(","):
        kernel = registry.get(name)
        for key, shape in preset_shapes(kernel, args.presets.split(","), args.only).items():
            inputs = kernel.make_inputs(shape, device, 3)
            for variant, config in configs_at(kernel, shape, table["entries"].get(name, {}), overrides).items():
                launched = _measure(kernel, inputs, config, smem_per_sm, offline)
                rows.append({"kernel": name, "shape": key, "variant": variant, "config": config,
                             "triton_kernels": launched})
                print(name, key, variant, json.dumps(launched), flush=True)
            del inputs
            if not offline:
                torch.cuda.empty_cache()
            args.out.write_text(json.dumps({"smem_per_sm": smem_per_sm, "triton": triton.__version__,
                                            "offline_arch": args.offline_arch, "rows": rows}, indent=1))
            args.out.with_suffix(".md").write_text(resources_table(rows))


if __name__ == "__main__":
    main()

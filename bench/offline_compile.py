"""Offline compiles: registers, spills, shared memory, MMAs and compiler-knob marks of a launch's configs for an arch, without its GPU.

Triton's JIT specialises and compiles for ``--arch`` (sm_90, sm_100, gfx942, gfx950) exactly as for a
launch, against a stand-in driver; nothing runs. With the GPU image's Triton (3.6) the sm_90
registers and spills equal what the H200 reports. Per compiled Triton kernel of each config:

* CUDA: registers and spilled bytes (the cubin's resource table, ``cuobjdump``), shared memory, warps,
  programs an SM holds, warpgroup MMAs (``HGMMA``) and ``mma.sync`` (``HMMA``), per loop body its
  instructions, CTA barriers, ``R2UR`` moves and wgmma waits, the reason ptxas gives where it
  serialized the wgmmas (its C75xx warning; the PTX is assembled again to read it), and the warp
  specialization marks (``ttg.warp_specialize`` regions, ``setmaxnreg`` and the counts it moves to);
* HIP: ``s_setprio`` (the ping-pong schedule), loads straight to LDS (async copy), VGPRs, scratch
  spilled per work-item, LDS;
* both: a digest of the code without debug lines, so two configs that compile alike show it.

``--configs`` picks what is compiled: ``default`` (the heuristic default at each shape), ``table``
(the default and the arch's table entry), ``space`` (configs the launch's space admits at the first
shape, ``--sample`` of them, each sorted by what the compile holds: fits, spills, over shared memory,
compile error), or a JSON object of named configs laid over the default. Run without
``TRITON_INTERPRET``. Configs compile in the order given in one process, as a sweep's child does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

REGISTERS_PER_SM = 65536
BLOCKS_PER_SM, WARPS_PER_SM = 32, 64  # sm_80 and sm_90 limits
SM90_SHARED_PER_SM = 233472  # what an H200 reports (shared_memory_per_multiprocessor)
_launched: list[tuple[str, Any]] = []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arch, launches, shapes and the source of the configs."""
    parser.add_argument("--arch", required=True, help="compile for this arch: sm_90, sm_100, gfx942, gfx950")
    parser.add_argument("--kernel", required=True, help="registered launches, comma-separated")
    parser.add_argument("--preset", default="v4-flash", help="model preset whose shapes to compile")
    parser.add_argument("--shape", default="", help="only the preset's shapes whose key contains this text")
    parser.add_argument("--configs", default="default",
                        help="default | table | space | JSON object of named configs over the default")
    parser.add_argument("--table", type=Path, default=None, help="with --configs table: this table, not the arch's")
    parser.add_argument("--sample", type=int, default=0, help="with --configs space: configs drawn (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="with --configs space: the draw's seed")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Compile every (launch, shape, config) asked for ``args.arch``; one row per compiled Triton kernel."""
    from kernels.offline import compile_for

    if args.configs not in ("default", "table", "space"):
        try:
            named = json.loads(args.configs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--configs: neither default, table, space nor a JSON object ({exc})") from None
        if not isinstance(named, dict) or not all(isinstance(c, dict) for c in named.values()):
            raise ValueError("--configs: a JSON object mapping a name to a config object")
    compile_for(args.arch)
    record_launches()
    import torch

    from kernels import registry

    names = [n for n in args.kernel.split(",") if n]
    unknown = [n for n in names if n not in registry.names()]
    if unknown:
        raise ValueError(f"--kernel: unknown launch {', '.join(unknown)}")
    figures: dict[str, Any] = {"arch": args.arch, "compiles": {}}
    for name in names:
        kernel = registry.get(name)
        shapes = {kernel.shape_key(s): s for s in kernel.presets.get(args.preset, []) if args.shape in kernel.shape_key(s)}
        if not shapes:
            raise ValueError(f"--shape: no {args.preset} shape of {name} contains {args.shape!r}")
        if args.configs == "space":
            key, shape = next(iter(shapes.items()))
            figures.setdefault("space", {})[f"{name} {key}"] = check_space(
                name, shape, args.arch, args.sample, args.seed, figures["compiles"])
            continue
        for key, shape in shapes.items():
            inputs = kernel.make_inputs(shape, torch.device("cpu"), 3)
            for variant, config in _configs(kernel, shape, args).items():
                for fn, marks in compile_config(kernel, inputs, config, args.arch).items():
                    figures["compiles"][f"{name} {key} {variant} {fn}"] = marks
    return figures


def _configs(kernel: Any, shape: dict[str, int], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    default = kernel.default_config(shape)
    if args.configs == "default":
        return {"default": default}
    if args.configs == "table":
        from kernels.tuning import load_table

        table = json.loads(args.table.read_text()) if args.table else (load_table(args.arch) or {"entries": {}})
        entry = table["entries"].get(kernel.name, {}).get(kernel.shape_key(shape))
        return {"default": default, **({"tuned": {**default, **entry["config"]}} if entry else {})}
    return {variant: {**default, **config} for variant, config in json.loads(args.configs).items()}


def record_launches() -> None:
    """Compile, never launch, and keep each launch's compiled kernel. ``kernels.launch``'s compiled-kernel
    cache would call a key's kernel directly from its second launch on, past ``JITFunction.run``: off."""
    from triton.runtime.jit import JITFunction

    from kernels import launch as launch_module

    launch_module.CACHE_COMPILED = False
    original = JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        compiled = original(self, *args, grid=grid, warmup=True, **kwargs)
        _launched.append((self.fn.__name__, compiled))
        return compiled

    JITFunction.run = run


def compile_config(kernel: Any, inputs: Any, config: dict[str, Any], arch: str) -> dict[str, dict[str, Any]]:
    """The marks of every Triton kernel one run of ``config`` compiles; ``{"error": ...}`` where it does not."""
    _launched.clear()
    try:
        kernel.run(inputs, config)
    except Exception as exc:  # noqa: BLE001 - a config the compiler rejects is a result, not a failure
        text = str(exc).strip()
        return {"(compile)": {"error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"}}
    return {fn: (hip_marks(c) if "amdgcn" in c.asm else cuda_marks(c)) for fn, c in _launched}


def check_space(name: str, shape: dict[str, int], arch: str, sample: int, seed: int,
                compiles: dict[str, Any]) -> dict[str, Any]:
    """The space's verdict on (a seeded sample of) the configs it admits at ``shape`` against their compiles."""
    import torch

    from kernels import registry
    from search_spaces import arch_facts, load_space

    kernel, space = registry.get(name), load_space(name)
    admitted = [c for c in space.grid(arch) if space.violation(c, shape, arch) is None]
    configs = random.Random(seed).sample(admitted, sample) if 0 < sample < len(admitted) else admitted
    limit = SM90_SHARED_PER_SM if arch == "sm_90" else arch_facts(arch)["smem_bytes"]
    inputs = kernel.make_inputs(shape, torch.device("cpu"), 3)
    outcomes: Counter[str] = Counter()
    for n, config in enumerate(configs):
        launched = compile_config(kernel, inputs, config, arch)
        outcomes[compile_outcome(launched, limit)] += 1
        for fn, marks in launched.items():
            compiles[f"{name} {kernel.shape_key(shape)} space-{n} {fn}"] = {"config": json.dumps(config), **marks}
    return {"admitted": len(admitted), "compiled": len(configs), **dict(sorted(outcomes.items()))}


def compile_outcome(launched: dict[str, dict[str, Any]], shared_limit: int) -> str:
    """``fits``, ``spills``, ``over shared memory`` (would not load) or ``compile error``, over a run's kernels."""
    if any("error" in k for k in launched.values()):
        return "compile error"
    if any(k["shared_bytes"] > shared_limit for k in launched.values()):
        return "over shared memory"
    return "spills" if any(k["spilled_bytes"] for k in launched.values()) else "fits"


def _bin(tool: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool)


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_bin("cuobjdump"), *flags, f.name], capture_output=True, text=True, check=True).stdout


_SERIALIZED = re.compile(r"\((C75\d\d)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized "
                         r"due to (.*?) in the function")


def serialization_reason(ptxas_output: str) -> str:
    """ptxas's code and reason where it serialized a kernel's warpgroup MMAs (``C7515: ...``), else ''."""
    match = _SERIALIZED.search(ptxas_output)
    return f"{match.group(1)}: {match.group(2)}" if match else ""


def _wgmma_serialization(ptx: str) -> str:
    """Assemble ``ptx`` again with Triton's ptxas, verbose: Triton keeps none of its warnings."""
    from triton.backends.nvidia import compiler

    arch = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE).group(1)
    try:  # the ptxas Triton compiled it with (newer Tritons bundle one per arch family)
        ptxas = compiler.get_ptxas(int(re.sub(r"\D", "", arch))).path
    except (AttributeError, TypeError):
        ptxas = _bin("ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "kernel.ptx")
        source.write_text(ptx)
        done = subprocess.run([ptxas, f"-arch={arch}", "-v", str(source), "-o", str(Path(tmp, "k.cubin"))],
                              capture_output=True, text=True)
    if done.returncode:
        return f"unknown: ptxas exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[0]}"
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
    """Instructions of each loop body (16-byte SASS instructions): what one iteration issues."""
    return [(high - low) // 16 + 1 for low, high in _loop_spans(sass)]


def loop_count(sass: str, opcode: str) -> list[int]:
    """Instructions whose opcode starts with ``opcode`` in each loop body of ``loop_bodies``: ``BAR.SYNC``
    (the block's warps wait for each other each step), ``R2UR`` (descriptors moved before each MMA),
    ``WARPGROUP.DEPBAR`` (one a step where the MMAs overlap, one after each where they are serialized)."""
    found = re.compile(rf"\s{re.escape(opcode)}[\s.]")
    addresses = [int(a.group(1), 16) for line in sass.splitlines()
                 if found.search(line) and (a := _SASS_ADDRESS.search(line))]
    return [sum(low <= at <= high for at in addresses) for low, high in _loop_spans(sass)]


_DEBUG_LINE = re.compile(r"^\s*(\.loc|\.file|//|;)")
_DEBUG_SECTIONS = re.compile(r"^\s*\.section\s+\.debug", re.MULTILINE)
_SETMAXNREG = re.compile(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)")
_LDS_LOAD = re.compile(r"^\s*(global_load_lds\w*|buffer_load\w*\s[^\n;]*\blds\b)", re.MULTILINE)


def code_digest(code: str) -> str:
    """12 hex of ``code`` without debug information and comments (line numbers and paths differ by checkout)."""
    code = _DEBUG_SECTIONS.split(code, maxsplit=1)[0]
    kept = "\n".join(line for line in code.splitlines() if not _DEBUG_LINE.search(line))
    return hashlib.sha256(kept.encode()).hexdigest()[:12]


def _lists(values: list[int]) -> str:
    return ", ".join(map(str, values)) or "-"


def cuda_marks(compiled: Any) -> dict[str, Any]:
    """Resources, MMAs, loop bodies and warp-specialization marks of one compiled CUDA kernel."""
    usage = dict(re.findall(r"(REG|STACK):(\d+)", _cuobjdump(compiled.asm["cubin"], "--dump-resource-usage")))
    regs, spilled = int(usage["REG"]), int(usage["STACK"])
    sass = _cuobjdump(compiled.asm["cubin"], "-sass")
    warps, shared = compiled.metadata.num_warps, compiled.metadata.shared
    hgmma = len(re.findall(r"\bHGMMA\.", sass))
    moved_to = [int(n) for n in _SETMAXNREG.findall(compiled.asm["ptx"])]
    return {"registers": regs, "spilled_bytes": spilled, "shared_bytes": shared, "warps": warps,
            "stages": compiled.metadata.num_stages,
            "programs_per_sm": min(REGISTERS_PER_SM // max(1, regs * warps * 32),
                                   SM90_SHARED_PER_SM // shared if shared else BLOCKS_PER_SM,
                                   BLOCKS_PER_SM, WARPS_PER_SM // warps),
            "wgmma": hgmma, "mma_sync": len(re.findall(r"\bHMMA\.", sass)),
            "membars": len(re.findall(r"\bMEMBAR\.", sass)), "loop_instructions": _lists(loop_bodies(sass)),
            "loop_barriers": _lists(loop_count(sass, "BAR.SYNC")), "loop_r2ur": _lists(loop_count(sass, "R2UR")),
            "loop_wgmma_waits": _lists(loop_count(sass, "WARPGROUP.DEPBAR")),
            "wgmma_serialized": _wgmma_serialization(compiled.asm["ptx"]) if hgmma else "",
            "warp_specialize": compiled.asm["ttgir"].count("ttg.warp_specialize("),
            "setmaxnreg": f"{min(moved_to)}-{max(moved_to)} ({len(moved_to)})" if moved_to else "-",
            "digest": code_digest(compiled.asm["ptx"])}


def hip_marks(compiled: Any) -> dict[str, Any]:
    """Ping-pong priority switches, direct-to-LDS loads, VGPRs, scratch and LDS of one compiled HIP kernel."""
    code = compiled.asm["amdgcn"]
    vgprs = re.search(r"\.vgpr_count:\s+(\d+)", code)
    scratch = re.search(r"\.private_segment_fixed_size:\s+(\d+)", code)
    return {"shared_bytes": compiled.metadata.shared, "s_setprio": code.count("s_setprio"),
            "lds_direct_loads": len(_LDS_LOAD.findall(code)), "vgprs": int(vgprs.group(1)) if vgprs else None,
            "spilled_bytes": int(scratch.group(1)) if scratch else 0, "digest": code_digest(code)}

"""What a sweep's runner needs of its kernel, read without importing it: ``KernelFacts``.

The runner needs a kernel's name, source version, tolerances, whether it compiles ahead, and per
shape its key, heuristic default and bytes moved. Reading them imports the kernel registry, and
with it torch, Triton and every kernel module: seconds that hold the driver's interpreter lock, so
no thread hides them behind Ray's start. ``tuner sweep run`` therefore reads them, and checks its
spec against the kernel, in a process of its own (``check_in_a_process``, running this module),
beside the driver's Ray start; ``tuner serve`` reads them in-process once per sweep
(``KernelFacts.of``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.sweep.spec import SpecError, SweepSpec, parse_spec, read_spec, spec_of


@dataclass(frozen=True)
class ShapeFacts:
    """One shape of a sweep, with what its kernel says of it."""

    shape: dict[str, int]
    key: str  # ``TunableKernel.shape_key``
    default: dict[str, Any]  # ``TunableKernel.default_config`` on this host's arch
    bytes_moved: int


@dataclass(frozen=True)
class KernelFacts:
    """A sweep's kernel as its runner sees it; ``shapes`` in the spec's order."""

    name: str
    source_version: str
    compiles: bool  # whether CPU workers can compile its configs ahead
    atol: float
    rtol: float
    shapes: list[ShapeFacts]

    @classmethod
    def of(cls, spec: SweepSpec) -> KernelFacts:
        """Read from the kernel registry (imports torch and the kernels); KeyError for an unknown kernel."""
        from kernels import registry

        kernel = registry.get(spec.kernel)
        shapes = [ShapeFacts(dict(s), kernel.shape_key(s), dict(kernel.default_config(s)), int(kernel.bytes_moved(s)))
                  for s in spec.resolved_shapes()]
        return cls(kernel.name, kernel.source_version, kernel.compile is not None, kernel.atol, kernel.rtol, shapes)

    def tolerances(self, spec: SweepSpec) -> tuple[float, float]:
        """The spec's tolerances where it gives them, else the kernel's."""
        return (spec.tolerance.atol, spec.tolerance.rtol) if spec.tolerance else (self.atol, self.rtol)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelFacts:
        return cls(**{**data, "shapes": [ShapeFacts(**s) for s in data["shapes"]]})


def check_in_a_process(path: Path) -> tuple[SweepSpec, KernelFacts]:
    """The spec file at ``path`` checked against its kernel, and its kernel's facts, by a child Python
    process (this module), so that this one never imports torch; :class:`SpecError` as the child
    reports it."""
    child = subprocess.run([sys.executable, "-m", __name__, str(path)], capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"checking {path} against its kernel failed:\n{child.stderr.strip()[-2000:]}")
    answer = json.loads(child.stdout.strip().splitlines()[-1])
    if "error" in answer:
        raise SpecError(answer["error"])
    return parse_spec(answer["spec"], "stored"), KernelFacts.from_json(answer["facts"])


def main(path: str) -> int:
    """Print ``{"spec", "facts"}`` for the spec file at ``path``, or ``{"error"}`` naming what is wrong."""
    try:
        spec = spec_of(read_spec(Path(path)), Path(path))
    except SpecError as exc:
        print(json.dumps({"error": str(exc)}))
        return 0
    print(json.dumps({"spec": spec.model_dump(mode="json"), "facts": asdict(KernelFacts.of(spec))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

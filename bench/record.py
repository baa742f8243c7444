"""A benchmark's record: its figures with what makes them comparable (device, toolchain, commit, table).

Records are written atomically (a temp file renamed over the target), so an interrupted run
never leaves a half-written record for ``python -m bench.report`` to read.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RECORDS_DIR = ROOT / "bench" / "records"
FIELDS = ("benchmark", "claim", "device", "toolchain", "commit", "table_digest", "command", "started_at",
          "figures")


def device_name() -> str:
    """The GPU's name (``2 x NVIDIA H200`` for two visible), or ``cpu: <model>`` where no GPU is visible."""
    try:
        import torch

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            return ("" if count == 1 else f"{count} x ") + torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"cpu: {_cpu_model()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_slug(device: str) -> str:
    """``NVIDIA H200`` -> ``nvidia-h200``: the device part of a record's file name."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


def toolchain() -> dict[str, str | None]:
    """Python, torch, triton and CUDA versions of this process (None for what is not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version(), "torch": None, "triton": None,
                                       "cuda": None}
    try:
        import torch

        versions["torch"], versions["cuda"] = torch.__version__, torch.version.cuda
    except ImportError:
        pass
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return versions


def git_commit(root: Path = ROOT) -> str | None:
    """``HEAD``'s hash, with ``+dirty`` when tracked files differ from it; None outside a git checkout.

    ``BENCH_COMMIT`` names the commit of a tree exported with ``git archive`` (what a GPU run gets):
    such a tree has no history, and a checkout around it would lend it the wrong one."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             check=True)
        if Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def table_digest() -> str | None:
    """``<arch>:<sha256>`` of the tuned table the Triton kernels resolve from here (``<arch>:none`` without one)."""
    try:
        from kernels.provenance import kernel_tables
    except ImportError:
        return None
    tables = kernel_tables("triton")
    return f"{tables['arch']}:{tables['sha256'] or 'none'}"


def make_record(benchmark: str, claim: str, command: list[str], started_at: datetime,
                figures: dict[str, Any]) -> dict[str, Any]:
    """A record of ``figures`` measured on this machine by ``command``."""
    return {"benchmark": benchmark, "claim": claim, "device": device_name(), "toolchain": toolchain(),
            "commit": git_commit(), "table_digest": table_digest(), "command": command,
            "started_at": started_at.astimezone(timezone.utc).isoformat(timespec="seconds"), "figures": figures}


def default_path(record: dict[str, Any], records_dir: Path = RECORDS_DIR) -> Path:
    """``bench/records/<benchmark>.<device-slug>.json``."""
    return records_dir / f"{record['benchmark']}.{device_slug(record['device'])}.json"


def write_record(record: dict[str, Any], path: Path) -> Path:
    """Write ``record`` to ``path`` (gzip-compressed when it ends in ``.gz``) through a temp file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, indent=1) + "\n").encode()
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a record from other users of the checkout
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def read_record(path: Path) -> dict[str, Any]:
    """A record from ``.json`` or ``.json.gz``; a ValueError naming the file and the missing fields otherwise."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    missing = [field for field in FIELDS if field not in record] if isinstance(record, dict) else list(FIELDS)
    if missing:
        raise ValueError(f"{path}: not a benchmark record, missing {', '.join(missing)}")
    return record


def record_paths(records_dir: Path = RECORDS_DIR) -> list[Path]:
    """Every record in ``records_dir`` (``*.json`` and ``*.json.gz``), by file name."""
    return sorted([*records_dir.glob("*.json"), *records_dir.glob("*.json.gz")], key=lambda p: p.name)


def plot_records(argv: list[str], draw: Callable[[list[dict[str, Any]]], str], usage: str, single: bool = False) -> int:
    """``--plot RECORD... OUT.svg`` (one RECORD where ``single``): ``draw`` the records' figures into OUT.svg;
    2 after ``usage`` or the unreadable record's name on bad arguments, with nothing written."""
    records = argv[1:-1]
    if argv[:1] != ["--plot"] or not records or (single and len(records) != 1) or not argv[-1].endswith(".svg"):
        print(usage, file=sys.stderr)
        return 2
    try:
        figures = [read_record(Path(path))["figures"] for path in records]
    except (OSError, ValueError) as exc:
        print(f"--plot: {exc}", file=sys.stderr)
        return 2
    Path(argv[-1]).write_text(draw(figures))
    return 0

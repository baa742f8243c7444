"""Reprinting a write-up's summary: a committed ``bench/`` script run over committed raw results."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess:
    """``bench/SCRIPT ARGS`` run from the repository root, its output captured."""
    return subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def reprint(script: str, *args: str) -> str:
    """The stdout of ``bench/SCRIPT ARGS`` from the repository root (which must exit 0), stripped."""
    proc = run_bench(script, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def assert_best_by_param_reprints(results: Path, summary: str, trials: str, kernel: str, param: str,
                                  reference: str) -> None:
    """``bench/best_by_param.py`` over ``results/trials`` prints the committed ``results/summary``."""
    printed = reprint("best_by_param.py", str(results / trials), param, "--kernel", kernel, "--reference", reference)
    assert printed == (results / summary).read_text().strip()


def assert_ncu_reprints(results: Path, run: int, scratch: Path) -> None:
    """``bench/ncu_summary.py`` over call ``run``'s unpacked Nsight Compute files prints ``ncu-run-RUN.md``."""
    with tarfile.open(results / f"run-{run}-ncu.tar.gz") as packed:
        packed.extractall(scratch, filter="data")
    assert reprint("ncu_summary.py", str(scratch)) == (results / f"ncu-run-{run}.md").read_text().strip()

"""The 2026-12-04 write-up's summaries reprint from the committed raw results: the launch-cache
check (``bench/launch_cache_check.py --summary``) and the glue forward's projection kernel against
the copy (``bench/kernel_share_of_copy.py``); a wrong argument ends in exit 2 naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "2026-12-04-h200"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, capture_output=True, text=True)


def test_launch_cache_summary_reprints_the_committed_one():
    proc = _run("launch_cache_check.py", "--summary", str(RESULTS / "run-3-launch-cache-small.json"),
                str(RESULTS / "run-3-launch-cache-v4.json"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (RESULTS / "launch-cache-summary.md").read_text().strip()
    assert "faster with the cache: 72; host µs a call saved, median: 3.2, a Triton launch: 3.0" in proc.stdout


def test_kernel_share_reprints_the_glue_table():
    proc = _run("kernel_share_of_copy.py", str(RESULTS / "run-1-kernels.json"), str(RESULTS / "run-1-launches.json"),
                "mhc_glue_fwd", "_glue_fwd_kernel")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (RESULTS / "glue-fwd-kernel-share-run-1.md").read_text().strip()
    assert "| tokens=4096,hidden=4096 | 136.2 | 39.4 | 81% | 50.5 | 63% |" in proc.stdout


def test_bad_arguments_exit_2_naming_them(tmp_path):
    bench, launches = str(RESULTS / "run-1-kernels.json"), str(RESULTS / "run-1-launches.json")
    cases = [
        (_run("launch_cache_check.py", "--summary", str(tmp_path / "none.json")), "OUT_JSON:"),
        (_run("launch_cache_check.py", "--summary", bench), "OUT_JSON:"),
        (_run("kernel_share_of_copy.py", str(tmp_path / "none.json"), launches, "mhc_glue_fwd", "x"), "BENCH_JSON:"),
        (_run("kernel_share_of_copy.py", bench, launches, "rope_fwd", "_glue_fwd_kernel"), "LAUNCH:"),
        (_run("kernel_share_of_copy.py", bench, launches, "mhc_glue_fwd", "no_such_kernel"), "KERNEL_NAME_PART:"),
    ]
    for proc, field in cases:
        assert proc.returncode == 2 and field in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

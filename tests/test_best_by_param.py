"""``bench/best_by_param.py`` reprints the committed 2026-12-02c tables from the sweep trials, and a
wrong argument ends in exit 2 naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "2026-12-02c-h200"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/best_by_param.py", *args], cwd=ROOT, capture_output=True, text=True)


def test_reprints_the_tail_tile_table():
    proc = _run(str(RESULTS / "sweep-trials.csv.gz"), "TAIL_K", "--kernel", "sparse_attn_fwd")
    assert proc.returncode == 0 and proc.stdout.strip() == (RESULTS / "tail-k-summary.md").read_text().strip()
    # the Flash HCA forward at 4,096: the 32-entry tail's best is 4% under the best without one
    assert "| 0.5428 (11) | 0.5268 (11) | 0.5206 (5) | 0.959 |" in proc.stdout


def test_reprints_the_compressor_warps_table():
    proc = _run(str(RESULTS / "sweep-trials-compressor.csv.gz"), "num_warps", "--reference", "2")
    assert proc.returncode == 0 and proc.stdout.strip() == (RESULTS / "compressor-warps-summary.md").read_text().strip()


def test_bad_arguments_exit_2_naming_them(tmp_path):
    missing = _run(str(tmp_path / "none.csv"), "TAIL_K")
    unknown = _run(str(RESULTS / "sweep-trials.csv.gz"), "NO_SUCH_PARAM")
    assert missing.returncode == 2 and "TRIALS_CSV:" in missing.stderr and "Traceback" not in missing.stderr
    assert unknown.returncode == 2 and "PARAM:" in unknown.stderr and "Traceback" not in unknown.stderr

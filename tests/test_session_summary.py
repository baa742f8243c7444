"""``bench/session_2026_12_02b_summary.py``: its figures come from the committed results, and a
folder without them ends in exit 2 naming what is missing, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ["bench/session_2026_12_02b_summary.py"]


def test_reprints_the_committed_summary():
    proc = subprocess.run([sys.executable, *SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True)
    committed = (ROOT / "bench" / "results" / "2026-12-02b-h200" / "summary.md").read_text()
    assert proc.stdout.strip() == committed.strip()
    assert "| LATE_HEAD_SUM, re-swept (call 2) | 107.7 | 29.8 | 137.5 |" in proc.stdout


def test_a_folder_without_the_results_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, *SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "RESULTS_DIR:" in proc.stderr and "Traceback" not in proc.stderr

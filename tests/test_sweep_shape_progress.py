"""``bench/sweep_shape_progress.py`` over the committed 2026-12-02c compressor trials: the backward
TPE sweep (sweep 2) measured nothing at its last shape and wrote 1,460 pruned rows there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRIALS = "bench/results/2026-12-02c-h200/sweep-trials-compressor.csv.gz"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/sweep_shape_progress.py", *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_rows_per_shape_of_the_named_sweep():
    proc = _run(f"call 5={TRIALS}:2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 + 6
    assert "| call 5 | batch=1,seq=8192,ratio=128,dim=512 | 0 | 1460 | - | - |" in lines
    assert "| call 5 | batch=1,seq=4096,ratio=4,dim=512 | 100 | 37 | 14.3 | 0.0198 |" in lines


def test_no_argument_prints_the_usage_and_exits_2():
    proc = _run()
    assert proc.returncode == 2 and "LABEL=TRIALS_CSV:SWEEP_ID" in proc.stderr


@pytest.mark.parametrize(("arg", "message"), [
    ("call 5", "expected LABEL=TRIALS_CSV:SWEEP_ID"),
    (f"call 5={TRIALS}:two", "expected LABEL=TRIALS_CSV:SWEEP_ID"),
    ("call 5=no/such.csv.gz:2", "no file no/such.csv.gz"),
])
def test_a_bad_argument_is_named_and_exits_2_with_nothing_printed(arg, message):
    proc = _run(f"ok={TRIALS}:2", arg)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""

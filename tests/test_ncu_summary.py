"""``bench/ncu_summary.py`` over committed Nsight Compute CSVs of the 2026-12-02 H200 run: the
figures the write-up cites come out of the raw counters, durations in either of ncu's units, and
kernels under 1% of their launch are left out; and ``bench/ncu_launch.py``'s refusal of bad input."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ncu_summary import kernel_rows, summary

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "2026-12-02-h200"


def _cells(text: str, launch: str, kernel: str) -> list[str]:
    """The table cells of ``kernel``'s rows whose launch label contains ``launch``."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]
    found = [r for r in rows if launch in r[0] and r[1] == kernel]
    assert len(found) == 1, (launch, kernel, found)
    return found[0]


def test_attention_backward_row_reads_occupancy_issue_and_stalls(tmp_path):
    for suffix in (".csv", ".launch.json"):  # a report whose durations are in ms
        shutil.copy(RESULTS / "ncu" / f"01-sparse_attn_bwd-tuned{suffix}", tmp_path)
    text = summary(tmp_path)
    cells = _cells(text, "ratio=4,topk=512", "_sparse_attn_bwd_kernel")
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    row = dict(zip(header, cells))
    assert row["µs"] == "7371.4"
    assert row["regs"] == "255"
    assert row["blocks/SM (cap)"] == "1 (registers+shared_mem)"
    assert row["achieved occ %"] == "12.5" and row["issue %"] == "21.9" and row["cycles/issue"] == "9.2"
    assert row["MMA"] == "mma.sync"
    assert row["top stalls"].startswith("short_scoreboard 2.3, wait 1.8")
    # torch's fill and reduce kernels of the launch take under 1% of its 7.4 ms
    assert "vectorized_elementwise_kernel" not in text and "reduce_kernel" not in text


def test_glue_rows_in_microseconds_and_small_kernels_dropped():
    text = summary(RESULTS / "ncu-glue-sums")
    assert _cells(text, "tokens=4096,hidden=4096", "_glue_bwd_sums_kernel")[2] == "6.7"
    assert _cells(text, "tokens=16384,hidden=7168", "_glue_bwd_kernel")[2] == "683.6"
    # the first pass takes 4.9 of 16,384 x 7,168's 706.6 µs: under 1%, so no row
    assert _cells(text, "tokens=4096,hidden=4096", "_glue_bwd_gates_kernel")[2] == "3.9"
    assert not any("16384" in line and "_glue_bwd_gates_kernel" in line for line in text.splitlines())


def test_unknown_duration_unit_is_refused(tmp_path):
    with (RESULTS / "ncu-glue-sums" / "01-mhc_glue_bwd-tuned.csv").open() as f:
        lines = list(csv.reader(f))
    lines[1][lines[0].index("gpu__time_duration.sum")] = "s"
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as f:
        csv.writer(f).writerows(lines)
    with pytest.raises(ValueError, match="gpu__time_duration.sum"):
        kernel_rows(bad)


@pytest.mark.parametrize(("kernel", "shape", "variant", "reason"), [
    ("no_such_kernel", "n=1", "tuned", "unknown kernel"),
    ("mhc_glue_fwd", "tokens=4096,hidden=4096", "{BLOCK_N: 32", "neither default, tuned nor a JSON object"),
])
def test_ncu_launch_refuses_bad_input_before_touching_a_gpu(kernel, shape, variant, reason):
    """``bench/ncu_launch.py`` (run under ncu on the H200) names the bad argument and exits 2."""
    proc = subprocess.run([sys.executable, "bench/ncu_launch.py", "kernels/tables/sm_90.json", kernel, shape, variant],
                          cwd=RESULTS.parents[2], capture_output=True, text=True)
    assert proc.returncode == 2 and reason in proc.stderr and "Traceback" not in proc.stderr

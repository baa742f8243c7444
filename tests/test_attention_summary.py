"""``bench/attention_summary.py`` reprints committed summaries from their raw runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "2026-12-02c-h200"


def _summary(*runs: str, results: Path = RESULTS) -> str:
    return subprocess.run([sys.executable, "bench/attention_summary.py", *(str(results / run) for run in runs)],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_reprints_the_attention_summary_with_its_geomean():
    out = _summary("bench-run-4.json")
    assert out.strip() == (RESULTS / "attention-summary.md").read_text().strip()
    assert "at sequence 4096, over 12 cells: 1.308x" in out
    # the indexer is timed by events, with no copy beside it
    assert "| indexer_fwd | batch=1,seq=4096,topk=512 | 0.0458 | - | 0.2510 | 0.1468 | 3.21 | - |" in out


def test_compressor_rows_stand_beside_a_same_size_copy():
    out = _summary("bench-run-5.json")
    assert out[out.index("### Compressor"):].strip() == (RESULTS / "compressor-summary.md").read_text().strip()
    # the forward at CSA d 512: 7.6 us, 1.82x its bandwidth floor and 1.25x a copy of its bytes
    assert "| compressor_fwd | batch=1,seq=4096,ratio=4,dim=512 | 0.0042 | 0.0061 | 0.0584 | 0.0076 | 1.82 | 1.25 |" in out
    # a launch without a swept config is timed by its default and says so
    assert "| 4.02 (default) | 3.01 (default) |" in out


def test_a_later_run_replaces_an_earlier_runs_rows():
    """2026-12-03c: the backward rows from run 2, the forward rows from run 4, which re-timed them."""
    results = ROOT / "bench" / "results" / "2026-12-03c-h200"
    out = _summary("bench-run-2.json", "bench-run-4.json", results=results)
    assert out.strip() == (results / "attention-summary.md").read_text().strip()
    # run 4's forward (run 2 had 0.854 ms), run 2's backward (run 4 timed none)
    assert "| v4-flash | CSA | 4096 | 1.615 \\| 170 | 0.822 \\| 333 |" in out
    assert "| 10.823 \\| 63 | 4.305 \\| 159 |" in out

"""The 2026-12-04c write-up's tables reprint from the committed raw results, by the committed
scripts: the sweeps' best config per parameter value (``bench/best_by_param.py``), the benches'
summaries (``bench/attention_summary.py``, ``bench/block_kernels_summary.py``), the indexer's host
time by TMA mode (``bench/launch_host_time.py --summary``) and Nsight Compute's counters
(``bench/ncu_summary.py``)."""

from __future__ import annotations

import pytest

from tests.bench_reprint import ROOT, assert_ncu_reprints, reprint, run_bench

RESULTS = ROOT / "bench" / "results" / "2026-12-04c-h200"

# (summary file, script, its arguments); an argument naming a file of RESULTS is read from there.
SUMMARIES = [
    ("key-rows-run-1-by-key-rows.md", "best_by_param.py",
     ("run-1-trials.csv", "KEY_ROWS", "--kernel", "indexer_fwd", "--reference", "0")),
    ("select-in-scoring-run-2-by-select-in-scoring.md", "best_by_param.py",
     ("run-2-trials.csv", "SELECT_IN_SCORING", "--kernel", "indexer_fwd", "--reference", "0")),
    ("select-in-scoring-run-2-by-key-rows.md", "best_by_param.py",
     ("run-2-trials.csv", "KEY_ROWS", "--kernel", "indexer_fwd", "--reference", "0")),
    ("tma-modes-run-3-by-tma.md", "best_by_param.py", ("run-3-trials.csv", "TMA", "--kernel", "indexer_fwd",
                                                       "--reference", "1")),
    ("tma-modes-run-3-by-select-in-scoring.md", "best_by_param.py",
     ("run-3-trials.csv", "SELECT_IN_SCORING", "--kernel", "indexer_fwd", "--reference", "0")),
    ("glue-bwd-tma-modes-run-4-by-tma.md", "best_by_param.py",
     ("run-4-trials.csv", "TMA", "--kernel", "mhc_glue_bwd", "--reference", "1")),
    *[(f"indexer-summary-run-{run}.md", "attention_summary.py", (f"run-{run}-kernels.json",)) for run in (1, 2, 3, 5)],
    *[(f"fused-knobs-run-5-by-{name}.md", "best_by_param.py", ("run-5-trials.csv", param, "--kernel", "indexer_fwd",
                                                              "--reference", reference))
      for name, param, reference in (("block-t", "BLOCK_T", "64"), ("num-stages", "num_stages", "2"),
                                     ("select-interp", "SELECT_INTERP", "1"), ("select-rows", "SELECT_ROWS", "2"))],
    ("glue-bwd-summary-run-4.md", "block_kernels_summary.py", ("run-4-kernels.json",)),
    ("indexer-host-time-run-4.md", "launch_host_time.py", ("--summary", "run-4-indexer-host-time-tma-modes.json")),
]


@pytest.mark.parametrize(("summary", "script", "args"), SUMMARIES, ids=[s for s, _, _ in SUMMARIES])
def test_summary_reprints(summary, script, args):
    printed = reprint(script, *(str(RESULTS / a) if (RESULTS / a).is_file() else a for a in args))
    assert printed == (RESULTS / summary).read_text().strip()


def test_the_write_ups_figures_are_in_the_summaries():
    """The figures the write-up quotes for its targets: the indexer against its floor, and the host
    cost of host-encoded descriptors."""
    assert "| indexer_fwd | batch=1,seq=4096,topk=512 | 0.0458 | - | 0.2430 | 0.0941 | 2.06 | - |" in \
        (RESULTS / "indexer-summary-run-3.md").read_text()
    assert "| indexer_fwd | batch=1,seq=4096,topk=512 | host_encoded | 104.0 | 0.1044 | 0.0940 | yes |" in \
        (RESULTS / "indexer-host-time-run-4.md").read_text()


@pytest.mark.parametrize("run", [2, 3])
def test_ncu_tables_reprint(run, tmp_path):
    assert_ncu_reprints(RESULTS, run, tmp_path)


def test_host_time_summary_of_a_wrong_file_exits_2_naming_it(tmp_path):
    """A file that is not launch_host_time's output: exit 2, one line naming OUT_JSON, no traceback."""
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"rows": []}')
    proc = run_bench("launch_host_time.py", "--summary", str(wrong))
    assert proc.returncode == 2
    assert proc.stderr.startswith("OUT_JSON: not a launch_host_time result") and "Traceback" not in proc.stderr

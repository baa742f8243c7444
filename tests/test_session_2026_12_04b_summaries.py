"""The 2026-12-04b write-up's tables reprint from the committed raw results, by the committed
scripts: the sweeps' best config per parameter value (``bench/best_by_param.py``), the benches'
summaries (``bench/attention_summary.py``, ``bench/block_kernels_summary.py``), the launch-cache
check (``bench/launch_cache_check.py --summary``) and Nsight Compute's counters
(``bench/ncu_summary.py``)."""

from __future__ import annotations

import pytest

from tests.bench_reprint import ROOT, assert_best_by_param_reprints, assert_ncu_reprints, reprint

RESULTS = ROOT / "bench" / "results" / "2026-12-04b-h200"


@pytest.mark.parametrize(("summary", "trials", "kernel", "param", "reference"), [
    ("narrow-channels-run-1-by-block-d.md", "run-1-trials.csv", "compressor_bwd", "BLOCK_D", "16"),
    ("wide-blocks-run-2-by-block-n.md", "run-2-trials.csv", "mhc_glue_fwd", "BLOCK_N", "64"),
    ("wide-blocks-run-2-by-gates-block-n.md", "run-2-trials.csv", "mhc_glue_fwd", "GATES_BLOCK_N", "0"),
    ("launches-run-3-by-inline-fn-split.md", "run-3-trials.csv", "mhc_glue_fwd", "INLINE_FN_SPLIT", "0"),
    ("launches-run-3-by-pdl.md", "run-3-trials.csv", "mhc_glue_fwd", "PDL", "0"),
    ("launches-run-3-by-gates-block-n.md", "run-3-trials.csv", "mhc_glue_fwd", "GATES_BLOCK_N", "0"),
    ("tma-16384-run-4-by-tma.md", "run-4-trials.csv", "mhc_glue_bwd", "TMA", "0"),
])
def test_best_by_param_tables_reprint(summary, trials, kernel, param, reference):
    assert_best_by_param_reprints(RESULTS, summary, trials, kernel, param, reference)


def test_bench_summaries_reprint():
    assert reprint("attention_summary.py", str(RESULTS / "run-1-kernels.json")) == \
        (RESULTS / "compressor-summary-run-1.md").read_text().strip()
    for summary, run in (("glue-fwd-summary", 2), ("glue-fwd-summary", 3), ("glue-bwd-summary", 4),
                         ("glue-bwd-summary", 7)):
        printed = reprint("block_kernels_summary.py", str(RESULTS / f"run-{run}-kernels.json"))
        assert printed == (RESULTS / f"{summary}-run-{run}.md").read_text().strip()
    assert "| mhc_glue_fwd | T=4096 D=4096 | graph | 23% | 65% |" in (RESULTS / "glue-fwd-summary-run-2.md").read_text()


def test_launch_cache_summary_reprints():
    printed = reprint("launch_cache_check.py", "--summary", str(RESULTS / "run-5-launch-cache-tma.json"))
    assert printed == (RESULTS / "launch-cache-tma-summary.md").read_text().strip()
    assert "| mhc_glue_bwd | tokens=16384,hidden=4096 | tuned | 3 | 272.1 | 218.5 | 0.80 |" in printed


@pytest.mark.parametrize("run", [1, 2])
def test_ncu_tables_reprint(run, tmp_path):
    assert_ncu_reprints(RESULTS, run, tmp_path)

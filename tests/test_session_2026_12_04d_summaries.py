"""The 2026-12-04d write-up's tables reprint from the committed raw results, by the committed
scripts: the benches' summaries (``bench/attention_summary.py``, ``bench/block_kernels_summary.py``),
the indexer's host time (``bench/launch_host_time.py --summary``) and the offline sm_90 compiles'
tables (``bench/kernel_resources.py``); the figures it quotes from raw logs are in them."""

from __future__ import annotations

import json

import pytest

from bench.kernel_resources import resources_table
from tests.bench_reprint import ROOT, reprint, run_bench

RESULTS = ROOT / "bench" / "results" / "2026-12-04d-h200"
ATTENTION = ("sparse_attn_fwd", "sparse_attn_bwd", "compressor_fwd", "compressor_bwd", "indexer_fwd")

# (summary file, script, its arguments); an argument naming a file of RESULTS is read from there.
SUMMARIES = [
    ("attention-summary-run-2.md", "attention_summary.py", ("run-2-kernels.json",)),
    ("indexer-summary-run-1.md", "attention_summary.py", ("run-1-kernels.json",)),
    ("block-summary-run-2-3.md", "block_kernels_summary.py",
     ("--table", "kernels/tables/sm_90.json", *[arg for k in ATTENTION for arg in ("--skip-kernel", k)],
      "run-2-kernels.json", "run-3-kernels.json")),
    ("indexer-host-time-run-1.md", "launch_host_time.py", ("--summary", "run-1-indexer-host-time.json")),
]
OFFLINE = ["offline-sm90-wgrad", "offline-sm90-wgrad-45c00a1", "offline-sm90-wgmma-audit-gemms",
           "offline-sm90-wgmma-audit-attention", "offline-sm90-wgmma-audit-glue",
           "offline-sm90-wgmma-audit-glue-b06fe3a"]


@pytest.mark.parametrize(("summary", "script", "args"), SUMMARIES, ids=[s for s, _, _ in SUMMARIES])
def test_summary_reprints(summary, script, args):
    printed = reprint(script, *(str(RESULTS / a) if (RESULTS / a).is_file() else a for a in args))
    assert printed == (RESULTS / summary).read_text().strip()


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_compile_tables_reprint(name):
    rows = json.loads((RESULTS / f"{name}.json").read_text())["rows"]
    assert resources_table(rows) == (RESULTS / f"{name}.md").read_text()


def _kernel(name: str, launch: str, variant: str, triton_kernel: str) -> dict:
    rows = json.loads((RESULTS / f"{name}.json").read_text())["rows"]
    [row] = [r for r in rows if r["kernel"] == launch and r["variant"] == variant and "skew=50" not in r["shape"]]
    return row["triton_kernels"][triton_kernel]


def test_the_write_ups_figures_are_in_the_raw_results():
    """The targets' figures, the memo's summary (printed on the device by 91e7914's script), the GPU
    parity count, and the serialized MMAs before and after the loop rewrites."""
    block = (RESULTS / "block-summary-run-2-3.md").read_text()
    assert "every cell with a swept config, over 88 cells: 1.261x" in block
    assert ("`expert_up_bwd_dx` 8, `expert_down_bwd_dw` 12, `expert_up_bwd_dw` 12), over 120 cells: 1.185x."
            in block)
    [rope] = [r for r in json.loads((RESULTS / "run-2-kernels.json").read_text())["rows"]
              if r["kernel"] == "rope_bwd" and r["shape"] == "tokens=4096,heads=128"]
    assert round(rope["graph_pct_of_copy"]["tuned"], 1) == 79.7  # the write-up's one RoPE cell under 80%
    attention = (RESULTS / "attention-summary-run-2.md").read_text()
    assert "| v4-flash | CSA | 4096 | 1.612 \\| 170 | 0.777 \\| 352 |" in attention
    assert "at sequence 4096, over 12 cells: 2.033x" in attention
    log = (RESULTS / "run-1-log.txt").read_text()
    assert "timed launches with memo hits: 14; faster with the memo: 0;" in log
    assert "on / off 1.00-1.10, geomean 1.03" in log
    assert "81 launches checked; parity failed: 0" in log
    assert "401 passed" in (RESULTS / "run-4-gpu-parity-kernels.log").read_text()
    before = _kernel("offline-sm90-wgrad-45c00a1", "expert_up_bwd_dw", "default", "_grouped_wgrad_kernel")
    after = _kernel("offline-sm90-wgrad", "expert_up_bwd_dw", "default", "_grouped_wgrad_kernel")
    assert (before["loop_wgmma_waits"], after["loop_wgmma_waits"]) == ([4], [1])
    assert before["wgmma_serialized"].startswith("C7515") and after["wgmma_serialized"] == ""
    down_before = _kernel("offline-sm90-wgrad-45c00a1", "expert_down_bwd_dw", "default", "_grouped_wgrad_kernel")
    down_after = _kernel("offline-sm90-wgrad", "expert_down_bwd_dw", "default", "_grouped_wgrad_kernel")
    assert (down_before["loop_wgmma_waits"], down_after["loop_wgmma_waits"]) == ([4], [1])
    glue_before = _kernel("offline-sm90-wgmma-audit-glue-b06fe3a", "mhc_glue_bwd", "tuned", "_glue_bwd_kernel")
    glue_after = _kernel("offline-sm90-wgmma-audit-glue", "mhc_glue_bwd", "tuned", "_glue_bwd_kernel")
    assert glue_before["hgmma"] == 14 and set(glue_before["loop_wgmma_waits"]) == {14, 0}
    assert glue_before["wgmma_serialized"].startswith("C7515") and glue_after["wgmma_serialized"] == ""
    assert max(glue_after["loop_wgmma_waits"]) == 5


def test_cache_check_summary_refuses_the_removed_memos_report():
    proc = run_bench("launch_cache_check.py", "--summary", str(RESULTS / "run-1-memo-check.json"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("OUT_JSON: a report of another switch") and "Traceback" not in proc.stderr

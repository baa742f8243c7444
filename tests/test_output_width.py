"""Every rich table the CLI prints (but the planner's, tested with the planner) reads at 80 columns: no
line is wider, no cell is cut short with an ellipsis, and no word of a cell is broken across lines
(rich folds a word its column cannot hold). Tables are rendered with representative rows, the
tuned table with the shipped sm_90 table itself."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from db import Sweep, Trial
from db.training import TrainRun
from kernels import tuning
from tuner.cli import display
from tuner.cli.replay import rows_table
from tuner.sweep.replay import ReplayRow
from tuner.train import display as train_display
from tuner.train.profile_layers import LayerCost
from workers.alltoall_cost import AlltoallCost, AlltoallShape

WIDTH = 80
NOW = datetime(2026, 12, 5, 13, 0, tzinfo=timezone.utc)
LONGEST_WORD = 24  # a word longer than any column can be (a 40-symbol layout) may wrap; none shorter


def _rendered(renderable) -> str:
    console = Console(width=WIDTH, record=True, file=open("/dev/null", "w"), color_system=None)
    console.print(renderable)
    return console.export_text()


def _cells(renderable) -> list[str]:
    """Every cell's text (and every shown header's) of the tables in ``renderable``."""
    tables = [getattr(r, "table", r) for r in (renderable.renderables if isinstance(renderable, Group) else [renderable])]
    return [Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)
            for table in tables if isinstance(table, Table) for column in table.columns
            for cell in [*column._cells, *([column.header] if table.show_header else [])]]


def _train_run() -> TrainRun:
    return TrainRun(id=12, status="ok", preset="v4-flash", world=8, pp=4, vpp=2, dp=2, microbatches=16,
                    layout="Et*10|t*11|t*11|t*11mL", recompute="selective:attn_core,mhc", kernels="triton",
                    request={"gbs": 32, "mbs": 1, "seq": 4096, "iters": 20, "warmup_iters": 2, "kernels": "triton"},
                    step_median_s=1.2345, step_p20_s=1.2, step_p80_s=1.3, tokens_per_s_per_gpu=12345.6,
                    model_tflops_per_gpu=345.678, losses=[10.8765, 9.1234, 7.654], host="gpu-node-17",
                    gpu_name="NVIDIA H200", versions={"torch": "2.11.0", "triton": "3.6.0", "cuda": "12.8"},
                    kernel_tables={"arch": "sm_90", "sha256": "0123456789abcdef"}, created_at=NOW,
                    stage_memory=[{"rank": r, "stages": [r, r + 4], "params": 1_234_567_890, "static_bytes": 12 << 30,
                                   "saved_activation_peak_bytes": 30 << 30, "peak_allocated_bytes": 70 << 30,
                                   "peak_reserved_bytes": 75 << 30} for r in range(4)])


def _tables() -> dict[str, object]:
    sweeps = [SimpleNamespace(id=i, kernel="expert_down_bwd_dx", arch="sm_90", status="running", created_at=NOW,
                              owner="gpu-node-17.cluster.example.com:123456:abcdef") for i in (1, 22, 333)]
    counts = {1: {"ok": 1234, "pruned": 567, "compile_error": 3, "wrong": 2}}
    sweep = Sweep(id=7, kernel="sparse_attn_fwd", arch="sm_90", status="running", spec={})
    key = "batch=1,seq=8192,heads=128,ratio=4,topk=1024,window=128"
    config = {"BLOCK_H": 64, "GLUON": 6, "LATE_FIRST": 1, "PTX_BARRIER": 0, "RESCALE_SLACK": 8, "TAIL_K": 1,
              "TILE_K": 32, "UNCHAINED": 1, "num_stages": 2, "num_warps": 8, "maxnreg": 232}
    trials = [Trial(shape_key=key, status="ok", median_ms=0.1 * w, config={**config, "num_warps": w},
                    metrics={"host_ms": 0.3}) for w in (4, 8, 16)]
    layers = tuning.table_layers("sm_90", warn=False)
    cost = LayerCost(layer_kind="decoder-csa-moe", forward_ms=123.456, backward_ms=234.567,
                     recompute_backward_ms=345.678, activation_bytes=12345 << 20, recompute_kept_bytes=2345 << 20,
                     params=1_234_567_890, expert_params=1_000_000_000, optimizer_ms_per_param=1.234e-6,
                     p2p_bytes=64 << 20)
    replay = ReplayRow(kernel="sinkhorn_fwd", shape="tokens=65536", strategy="random", fraction=0.1, budget=11,
                       grid_evaluations=105, seeds=5, optimum_ms=0.0123, random_expectation_ms=0.0145,
                       default_gap_pct=20.5, mean_best_ms=0.0127, worst_best_ms=0.0138, mean_gap_pct=3.25,
                       worst_gap_pct=12.5, score=0.45, within_2pct=0.6, mean_asks=14.2, mean_pruned_asks=3.2)
    return {
        "sweep list": display.sweeps_table(sweeps, counts),
        "sweep status": display.status_table(sweep, trials, {key: 1200}),
        "tables show": display.tuned_table(layers[-1].table, tuning.merged_entries(layers), layers),
        "train list": train_display.runs_table([_train_run()] * 3),
        "train show": train_display.run_summary(_train_run()),
        "train show memory": train_display.memory_table(_train_run()),
        "profile layers": train_display.profile_table([cost] * 3, "v4-flash on NVIDIA H200: seq 4096, mbs 1, ep 8"),
        "profile kernel shares": train_display.shares_table(
            [{"kind": "csa/learned", "gemm_ms": 12.345, "attention_ms": 6.789, "other_ms": 4.321, "total_ms": 23.455,
              "total_over_gemm_and_attention": 1.226, "timed_ms": 123.456, "device_busy": 0.19,
              "host_syncs": 12, "host_sync_sites": {"v4/moe.py:98": 12}},
             {"kind": "head", "gemm_ms": 0.0, "attention_ms": 0.0, "other_ms": 1.0, "total_ms": 1.0,
              "total_over_gemm_and_attention": None, "timed_ms": 0.0, "device_busy": None}]),
        "profile alltoall": train_display.alltoall_table(
            AlltoallCost(AlltoallShape(rows=24576, hidden=4096, ep=8), 1.234, 1.345, 100), "EP all-to-all"),
        "replay": rows_table(3, [replay] * 2),
    }


@pytest.mark.parametrize("name", list(_tables()))
def test_a_table_reads_at_80_columns(name):
    table = _tables()[name]
    text = _rendered(table)
    assert max(map(len, text.splitlines())) <= WIDTH
    assert "…" not in text, text
    broken = sorted({word for cell in _cells(table) for word in cell.split()
                     if len(word) <= LONGEST_WORD and word not in text})
    assert broken == [], f"{name}: words broken across lines: {broken}\n{text}"


@pytest.mark.parametrize("own_ray", [True, False])
def test_the_pool_start_line_reads_at_80_columns(own_ray):
    line = display.pool_started(16, "sm_90", {"import_s": 0.01, "ray_s": 16.234, "workers_s": 118.5}, own_ray)
    text = _rendered(line)
    assert max(map(len, text.splitlines())) <= WIDTH
    assert ("Ray started 16.2 s" in text) == own_ray and ("tip:" in text) == own_ray
    assert "up in 134.7 s" in text and "workers 118.5 s" in text

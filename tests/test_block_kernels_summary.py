"""``bench/block_kernels_summary.py``'s geomeans: over the cells with a swept config, and over every
cell with the unswept ones at their default (issue 4's target counts every cell)."""

from __future__ import annotations

import json

from tests.bench_reprint import reprint


def _row(kernel: str, shape: str, default_ms: float, tuned_ms: float | None) -> dict:
    ms = {"default": default_ms, **({"tuned": tuned_ms} if tuned_ms else {})}
    return {"kernel": kernel, "shape": shape, "flops": None, "ms": ms, "graph_ms": {},
            "pct_of_copy": {variant: 50.0 for variant in ms}, "parity": {"default": "ok"}}


def test_every_cell_line_counts_unswept_cells_at_their_default(tmp_path):
    rows = [_row("rope_fwd", "tokens=1", 2.0, 1.0), _row("rope_fwd", "tokens=2", 8.0, 1.0),
            _row("router_fwd", "tokens=1", 3.0, None)]
    result = tmp_path / "kernels.json"
    result.write_text(json.dumps({"rows": rows}))
    printed = reprint("block_kernels_summary.py", str(result))
    assert "every cell with a swept config, over 2 cells: 4.000x" in printed
    assert "(it runs the default; `router_fwd` 1), over 3 cells: 2.520x." in printed  # (2 * 8 * 1) ** (1 / 3)
    result.write_text(json.dumps({"rows": rows[:2]}))
    assert "Over every cell" not in reprint("block_kernels_summary.py", str(result))

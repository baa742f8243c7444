"""The layer remainder benchmark's figures and targets (``bench/layer_remainder.py``); its GPU run is in
``bench/gpu/profile_layers.sh``."""

from __future__ import annotations

import pytest
import torch

from bench import __main__ as runner
from bench.layer_remainder import TARGET_RATIO, kind_row, targets


def _share(kind: str, gemm: float, attention: float, other: float) -> dict:
    total = gemm + attention + other
    core = gemm + attention
    return {"kind": kind, "gemm_ms": gemm, "attention_ms": attention, "other_ms": other, "total_ms": total,
            "total_over_gemm_and_attention": round(total / core, 3) if core else None, "timed_ms": total * 1.1,
            "device_busy": 0.91, "host_syncs": 0, "gemm_top": [{"name": "nvjet", "ms": gemm}],
            "other_top": [{"name": f"k{i}", "ms": 0.1} for i in range(8)]}


def test_kind_row_keeps_the_classes_and_a_few_of_the_rest() -> None:
    row = kind_row(_share("csa/hash", 4.0, 3.0, 3.5))
    assert row["total_over_gemm_and_attention"] == 1.5 and row["other_ms"] == 3.5
    assert len(row["other_top"]) == 5 and "gemm_top" not in row


def test_targets_judge_the_decoder_and_mtp_layers_only() -> None:
    kinds = {share["kind"]: kind_row(share) for share in (
        _share("embedding", 0.0, 0.0, 0.8), _share("window/hash", 4.0, 0.7, 2.8), _share("hca/learned", 4.0, 0.9, 4.0),
        _share("mtp", 5.0, 0.7, 3.0), _share("head", 2.0, 0.0, 3.0))}
    rows = {row["target"].split(" layer")[0]: row for row in targets("v4-flash", kinds)}
    assert set(rows) == {"v4-flash window/hash", "v4-flash hca/learned", "v4-flash mtp"}
    assert rows["v4-flash window/hash"]["status"] == "met"  # 7.5 / 4.7 = 1.60
    assert rows["v4-flash hca/learned"]["status"] == "missed"  # 8.9 / 4.9 = 1.82
    assert rows["v4-flash hca/learned"]["measured"].startswith("1.82x")
    assert f"<= {TARGET_RATIO:g}x" in rows["v4-flash mtp"]["target"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a host without a GPU")
def test_refuses_without_a_gpu_with_exit_2(tmp_path, capsys) -> None:
    assert runner.main(["layer_remainder", "--record", str(tmp_path / "r.json")]) == 2
    assert "no GPU is visible" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_plot_has_a_bar_per_kind_with_gemm_or_attention_and_the_target(tmp_path) -> None:
    import json
    import re

    from bench import layer_remainder

    figures = {"model": "v4-flash", "kinds": {share["kind"]: kind_row(share) for share in (
        _share("embedding", 0.0, 0.0, 0.8), _share("window/hash", 4.0, 0.7, 2.8), _share("mtp", 5.0, 0.7, 3.0))}}
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"benchmark": "layer_remainder", "claim": "c", "device": "NVIDIA H200",
                                  "toolchain": {}, "commit": "abc", "table_digest": None, "command": [],
                                  "started_at": "2026-12-06T10:00:00+00:00", "figures": figures}))
    assert layer_remainder.main(["--plot", str(record), str(tmp_path / "p.svg")]) == 0
    svg = (tmp_path / "p.svg").read_text()
    # two kinds (the embedding has neither), three segments each; a bar is as long as its ratio
    widths = [float(w) for w in re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)"', svg)]
    assert len(widths) == 6 and "v4-flash window/hash" in svg and "embedding" not in svg
    assert sum(widths[:3]) / sum(widths[:2]) == pytest.approx(7.5 / 4.7, rel=1e-2)
    assert f"target {TARGET_RATIO:g}x" in svg and "1.60x (7.5 ms)" in svg
    assert layer_remainder.main(["--plot", str(tmp_path / "q.svg")]) == 2  # no record named
    assert layer_remainder.main(["--plot", str(tmp_path / "p.svg"), str(tmp_path / "q.svg")]) == 2  # not a record
    assert not (tmp_path / "q.svg").exists()

"""Layer remainder: each V4 layer kind's forward + backward device time over its GEMM and attention kernels' alone (issue 36: within 1.6x for V4-Flash's layers).

What ``tuner profile layers --trace`` measures, as a record: every layer kind of ``--model`` is built
alone on the GPU with the Triton kernels and the arch's tables (``tuner.train.profile_layers``), timed
with CUDA events, then run once more under ``torch.profiler``. Each device activity of that round is
put in one class by its name (``tuner.train.kernel_shares``: GEMM, attention, the rest), and the ratio
is the round's device time over its GEMM and attention time. Per kind the record keeps the three
classes, the ratio, the largest kernels of the rest (what to fuse or remove next), the host syncs and
how busy the device was over the timed forward + backward.

The target is judged for the decoder and MTP layers; the embedding (no GEMM) and the head (its
losses) are reported beside them. With ``--db`` the same run stores the layer profiles as ``tuner
profile layers`` does, so the planner's packaged profiles (``tuner profile export``) come from the
run that gave the ratios. GPU only: the classes come from the profiler's device activities.
``python -m bench.layer_remainder --plot RECORD... OUT.svg`` draws the records' kinds as bars in units of their
GEMM and attention time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.record import plot_records

TARGET_RATIO = 1.6
JUDGED_KINDS = ("window", "csa", "hca", "mtp")  # layer kinds the target is about (their prefix)
TOP_KEPT = 5  # the rest's largest kernels kept per kind in the record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="v4-flash", help="preset name (v4/presets) or a YAML file of ModelConfig fields")
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--mbs", type=int, default=1, help="sequences per microbatch")
    parser.add_argument("--ep", type=int, default=8, help="expert-parallel ranks the layers are sized for (their local experts)")
    parser.add_argument("--db", default=None, help="also store the layer profiles in this database (as tuner profile layers does)")
    parser.add_argument("--trace", type=Path, default=None,
                        help="keep each kind's Chrome trace and op table here (default: a temporary folder)")


def kind_row(share: dict[str, Any]) -> dict[str, Any]:
    """One layer kind's figures from its ``kernel_shares.json`` entry, the rest's largest kernels cut to a few."""
    keep = ("gemm_ms", "attention_ms", "other_ms", "total_ms", "total_over_gemm_and_attention", "timed_ms",
            "device_busy", "host_syncs")
    return {**{key: share.get(key) for key in keep}, "other_top": share.get("other_top", [])[:TOP_KEPT]}


def targets(model: str, kinds: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One row per judged layer kind: its ratio against ``TARGET_RATIO``."""
    rows = []
    for kind, row in kinds.items():
        ratio = row["total_over_gemm_and_attention"]
        if not kind.startswith(JUDGED_KINDS) or ratio is None:
            continue
        rows.append({"target": f"{model} {kind} layer: forward + backward device time <= {TARGET_RATIO:g}x its GEMM "
                               f"and attention kernels'",
                     "measured": f"{ratio:.2f}x ({row['total_ms']:.1f} ms, of which GEMM {row['gemm_ms']:.1f} and "
                                 f"attention {row['attention_ms']:.1f})",
                     "status": "met" if ratio <= TARGET_RATIO else "missed"})
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Profile every layer kind of the model and report its remainder ratio; see the module doc."""
    import torch

    from v4.config import PresetError, load_preset

    if not torch.cuda.is_available():
        raise ValueError("layer_remainder reads the profiler's GPU kernels; no GPU is visible")
    for name in ("seq", "mbs", "ep"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    try:
        config = load_preset(args.model)
    except PresetError as exc:
        raise ValueError(f"--model: {exc}") from None
    from tuner.cli.errors import open_engine
    from tuner.cli.profile import measure_layers

    with tempfile.TemporaryDirectory() as scratch:  # without --db the profiles are kept in a scratch database
        trace = args.trace or Path(scratch)
        engine = open_engine(args.db or f"sqlite:///{Path(scratch) / 'profiles.db'}")
        measure_layers(engine, config, args.seq, args.mbs, args.ep, "triton", "cuda", trace=trace, show=False)
        engine.dispose()
        shares = json.loads((trace / "kernel_shares.json").read_text())
    kinds = {share["kind"]: kind_row(share) for share in shares}
    return {"model": config.name, "seq": args.seq, "mbs": args.mbs, "ep": args.ep, "kernels": "triton",
            "target_ratio": TARGET_RATIO, "kinds": kinds, "targets": targets(config.name, kinds)}


CLASS_COLORS = {"gemm_ms": "#1f77b4", "attention_ms": "#ff7f0e", "other_ms": "#999"}
BAR_H, LABEL_W, PLOT_W = 16, 230, 420


def plot_svg(records: list[dict[str, Any]]) -> str:
    """One bar per (model, layer kind) of the records' figures, in units of its GEMM + attention time: the
    GEMMs, the attention, then the rest, so that a bar's length is the kind's ratio; the target a dashed line."""
    rows = [(figures["model"], kind, row) for figures in records for kind, row in figures["kinds"].items()
            if row["total_over_gemm_and_attention"] is not None]
    scale = PLOT_W / max(max((row["total_over_gemm_and_attention"] for _, _, row in rows), default=1.0),
                         TARGET_RATIO * 1.1)
    height = 40 + BAR_H * 1.4 * len(rows) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + PLOT_W + 80}" height="{height:.0f}" '
             'font-family="sans-serif" font-size="11">',
             '<text x="8" y="16">forward + backward device time over the GEMM and attention kernels\' (one profiled round '
             'each): ' + ", ".join(f'<tspan fill="{color}">{name.removesuffix("_ms")}</tspan>'
                                   for name, color in CLASS_COLORS.items()) + "</text>"]
    for i, (model, kind, row) in enumerate(rows):
        y = 32 + i * BAR_H * 1.4
        core = row["gemm_ms"] + row["attention_ms"]
        x = LABEL_W
        parts.append(f'<text x="8" y="{y + BAR_H - 4:.1f}">{model} {kind}</text>')
        for name, color in CLASS_COLORS.items():
            width = row[name] / core * scale
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{BAR_H}" fill="{color}"/>')
            x += width
        parts.append(f'<text x="{x + 4:.1f}" y="{y + BAR_H - 4:.1f}">{row["total_over_gemm_and_attention"]:.2f}x '
                     f'({row["total_ms"]:.1f} ms)</text>')
    target_x = LABEL_W + TARGET_RATIO * scale
    parts.append(f'<line x1="{target_x:.1f}" y1="26" x2="{target_x:.1f}" y2="{height - 16:.0f}" stroke="#d62728" '
                 f'stroke-dasharray="4 3"/><text x="{target_x + 3:.1f}" y="{height - 6:.0f}" fill="#d62728">'
                 f'target {TARGET_RATIO:g}x</text>')
    return "\n".join([*parts, "</svg>"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``--plot RECORD... OUT.svg``: draw the records' layer kinds in one figure."""
    return plot_records(sys.argv[1:] if argv is None else argv, plot_svg,
                        "usage: python -m bench layer_remainder [options] | "
                        "python -m bench.layer_remainder --plot RECORD... OUT.svg")


if __name__ == "__main__":
    sys.exit(main())

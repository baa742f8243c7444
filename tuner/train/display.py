"""Rich rendering of training runs (the list, one run's summary and memory, a plain-text loss curve) and of profiles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from tuner.cli.display import Fitted, cell, fitted

if TYPE_CHECKING:  # the CLI's listing commands render runs without importing torch
    from db.training import TrainRun
    from tuner.train.profile_layers import LayerCost
    from workers.alltoall_cost import AlltoallCost

_BARS = "▁▂▃▄▅▆▇█"
GIB = 1 << 30


def sparkline(values: list[float]) -> str:
    """One block character per value, scaled between the smallest and the largest."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(_BARS[round((v - low) / span * (len(_BARS) - 1))] for v in values)


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.1f}" if seconds is not None else "-"


def _gib(nbytes: int | None) -> str:
    return f"{nbytes / GIB:.3f}" if nbytes is not None else "-"


def runs_table(runs: list[TrainRun]) -> Fitted:
    """One row per run, readable at 80 columns: what ran (preset, ranks, kernels, layout, recompute, when)
    in one cell of words, then the figures."""
    table = Table("id", "status", "run", "step ms", "tokens /s/GPU", "loss first → last")
    for r in runs:
        losses = f"{r.losses[0]:.3f} → {r.losses[-1]:.3f}" if r.losses else "-"
        run = (f"{r.preset}, world {r.world}, {r.kernels or r.request.get('kernels', '-')}, layout "
               f"{r.layout or r.request.get('layout') or 'even'}, recompute "
               f"{r.recompute or r.request.get('recompute', 'none')}, {r.created_at.strftime('%Y-%m-%d %H:%M')}")
        table.add_row(str(r.id), r.status, run, _ms(r.step_median_s), cell(r.tokens_per_s_per_gpu, ",.0f"), losses)
    return fitted(table)


def run_summary(r: TrainRun) -> Fitted:
    """Key figures of one run, one per row."""
    table = Table("field", "value", title=f"training run {r.id}: {r.status}", show_header=False)
    rows = [
        ("preset", r.preset), ("layout", r.layout or "-"), ("recompute", r.recompute or "-"),
        ("grid", f"world {r.world}, pp {r.pp}, vpp {r.vpp}, dp {r.dp}, {r.microbatches} microbatches"
         if r.pp else f"world {r.world}"),
        ("batch", f"gbs {r.request['gbs']}, mbs {r.request['mbs']}, seq {r.request['seq']}, "
                  f"{r.request['iters']} iterations ({r.request['warmup_iters']} warm-up)"),
        ("kernels", f"{r.kernels or r.request['kernels']}"
                    + (f" (table {r.kernel_tables['arch']} {str(r.kernel_tables['sha256'])[:12]})"
                       if r.kernel_tables and r.kernel_tables.get("arch") else "")),
        ("step ms median [p20, p80]", f"{_ms(r.step_median_s)} [{_ms(r.step_p20_s)}, {_ms(r.step_p80_s)}]"),
        ("tokens/s/GPU", cell(r.tokens_per_s_per_gpu, ",.1f")),
        ("model TFLOP/s/GPU", cell(r.model_tflops_per_gpu, ".3f")),
        ("where", f"{r.host or '-'}, {r.gpu_name or '-'}, " + ", ".join(
            f"{k} {v}" for k, v in (r.versions or {}).items() if v)),
    ]
    if r.status == "oom":
        rows.append(("OOM stage", str(r.oom_stage)))
    if r.error:
        rows.append(("message", r.error.strip().splitlines()[-1]))
    for name, value in rows:
        table.add_row(escape(name), escape(value))  # "[p20, p80]" is text, not markup
    return fitted(table)


def memory_table(r: TrainRun) -> Fitted:
    table = Table("rank", "stages", "params", "static GiB", "saved activations GiB", "peak allocated GiB",
                  "peak reserved GiB", title="memory per pipeline rank")
    for m in r.stage_memory or []:
        table.add_row(str(m["rank"]), ",".join(map(str, m["stages"])), f"{m['params']:,}", _gib(m["static_bytes"]),
                      _gib(m["saved_activation_peak_bytes"]), _gib(m["peak_allocated_bytes"]),
                      _gib(m["peak_reserved_bytes"]))
    return fitted(table)


def loss_curve(r: TrainRun) -> str:
    """The LM loss per iteration as a sparkline, then the values."""
    if not r.losses:
        return "no losses"
    values = " ".join(f"{v:.3f}" for v in r.losses)
    return f"loss {sparkline(r.losses)}  {values}"


def profile_table(costs: list[LayerCost], title: str) -> Fitted:
    """Per layer kind: times, memory and sizes, grouped in cells of words so that 80 columns hold them."""
    table = Table("layer kind", "ms: fwd, bwd, recompute+bwd", "MiB: activations, kept w/ recompute, p2p", "params",
                  "optimizer ns/param", title=title)
    for c in costs:
        table.add_row(c.layer_kind, f"{c.forward_ms:.3f}, {c.backward_ms:.3f}, {c.recompute_backward_ms:.3f}",
                      f"{c.activation_bytes / 2**20:.2f}, {c.recompute_kept_bytes / 2**20:.2f}, "
                      f"{c.p2p_bytes / 2**20:.2f}", f"{c.params:,}", f"{c.optimizer_ms_per_param * 1e6:.3f}")
    return fitted(table)


def shares_table(shares: list[dict]) -> Fitted:
    """Per layer kind: one profiled forward + backward's device time in GEMMs, attention and the rest,
    the total over GEMMs plus attention, the share of the timed forward + backward the device was
    busy, and the host syncs of the profiled round (``tuner.train.kernel_shares``)."""
    table = Table("layer kind", "ms: GEMM, attention, other", "total / (GEMM + attention)", "device busy",
                  "host syncs", title="device time by kernel class (one profiled forward + backward)")
    for share in shares:
        ratio, busy = share["total_over_gemm_and_attention"], share.get("device_busy")
        table.add_row(share["kind"], f"{share['gemm_ms']:.3f}, {share['attention_ms']:.3f}, {share['other_ms']:.3f}",
                      "-" if ratio is None else f"{ratio:.2f}x",
                      "-" if busy is None else f"{busy:.0%} of {share['timed_ms']:.3f} ms",
                      str(share.get("host_syncs", "-")))
    return fitted(table)


def alltoall_table(cost: AlltoallCost, title: str) -> Fitted:
    """One MoE layer's dispatch, combine and their sum (one forward; the backward repeats it), with GB/s."""
    shape = cost.shape
    table = Table("phase", "ms", "MiB leaving a rank", "GB/s", title=title,
                  caption=f"{shape.rows:,} rows x {shape.hidden} bf16 per rank over {shape.ep} ranks; "
                          f"median of {cost.reps} rounds, slowest rank")
    mib = shape.bytes_per_rank / 2**20
    for phase, ms, count in (("dispatch", cost.dispatch_ms, 1), ("combine", cost.combine_ms, 1),
                             ("forward (dispatch + combine)", cost.alltoall_ms, 2)):
        gbps = count * shape.bytes_per_rank / (ms * 1e6) if ms > 0 else 0.0
        table.add_row(phase, f"{ms:.3f}", f"{count * mib:.4g}", f"{gbps:.4g}")
    return fitted(table)

"""``tuner plan``: the fastest pipeline layouts and recompute sets for a model on a cluster, from layer
profiles (the database's, else the packaged ones), with memory per stage, a proven optimality
bound, the CPU time it took, an optional HTML report and JSON output. ``--nodes 2,4,8,16`` (or
``2-16``) plans every node count and names the smallest that fits. Each plan is stored; a
stored plan of the same request computed from older profiles or kernel tables is reported stale.

What is printed, top to bottom: the request, where the profiles came from (and BORROWED when
they are another GPU kind's), warnings, the chosen plan as a block (layout, recompute, the
Primus / Megatron arguments, step, memory per stage), then the ranking with a short layout.
Everything fits 80 columns; the planner modules are imported when the command runs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from tuner.cli.display import console, summary_help
from tuner.cli.errors import fail

if TYPE_CHECKING:
    from tuner.plan.request import Outcome, PlanRequest, Resolved

GiB = 1 << 30
MAX_NODE_COUNTS = 64  # a sweep plans each count in about a second of CPU
plan_app = typer.Typer(help=summary_help(__doc__), invoke_without_command=True, no_args_is_help=False)


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Bad arguments, missing profiles and plans that cannot fit: one message naming the cause, exit code 2."""
    from db import DatabaseError
    from tuner.plan.profiles import ProfilesMissing
    from tuner.plan.request import RequestError
    from tuner.plan.search import NoPlanFits

    try:
        yield
    except RequestError as exc:
        fail(f"--{exc.field.replace('_', '-')}: {exc.reason}")
    except (ProfilesMissing, NoPlanFits, DatabaseError, OSError) as exc:
        fail(str(exc))


def _auto(value: str, field: str) -> int | None:
    from tuner.plan.request import RequestError

    if value == "auto":
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise RequestError(field, f"must be auto or an integer >= 1, got {value!r}")
    return number


def node_counts(value: str) -> list[int]:
    """``16``, ``2,4,8,16`` or the range ``2-16`` (every count from 2 to 16) as sorted distinct counts."""
    from tuner.plan.request import RequestError

    counts: set[int] = set()
    for part in value.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise RequestError("nodes", f"must be a count, a list like 2,4,8,16 or a range like 2-16, got {value!r}") \
                from None
        if first < 1 or last < first:
            raise RequestError("nodes", f"counts must be >= 1 and ranges ascending, got {part!r}")
        if last - first + 1 + len(counts) > MAX_NODE_COUNTS:
            raise RequestError("nodes", f"at most {MAX_NODE_COUNTS} node counts per sweep, got more in {value!r}")
        counts.update(range(first, last + 1))
    return sorted(counts)


@plan_app.callback()
def plan(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option(help="model preset, e.g. v4-flash (required)")] = None,
    nodes: Annotated[Optional[str], typer.Option(help="nodes: a count, a list (2,4,8,16) or a range (2-16) (required)")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option(help="GPUs per node (required)")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU kind: h100, h200, b200, mi300x, mi325x, mi355x (cpu: this host) (required)")] = None,
    gbs: Annotated[Optional[int], typer.Option(help="global batch, sequences per step (required)")] = None,
    mbs: Annotated[int, typer.Option(help="micro-batch, sequences")] = 1,
    seq: Annotated[Optional[int], typer.Option(help="sequence length (required)")] = None,
    ep: Annotated[int, typer.Option(help="expert-parallel ranks (inside the data-parallel group)")] = 8,
    pp: Annotated[str, typer.Option(help="pipeline ranks, or auto")] = "auto",
    vpp: Annotated[str, typer.Option(help="virtual stages per pipeline rank, or auto")] = "auto",
    top: Annotated[int, typer.Option(help="plans to rank: the chosen one and the runners-up")] = 5,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
    report: Annotated[Optional[Path], typer.Option(help="write an HTML report here (one node count)")] = None,
    profiles_from: Annotated[Optional[str], typer.Option(
        help="plan from this GPU kind's profiles (the output is marked BORROWED)")] = None,
    scale_time: Annotated[Optional[float], typer.Option(help="with --profiles-from: multiply every time")] = None,
    flops_per_token: Annotated[Optional[float], typer.Option(help="model FLOPs per token (default: the preset's)")] = None,
    kernels: Annotated[Optional[str], typer.Option(
        help="plan from the profiles of this kernel path: triton or eager (default: Triton where profiled)")] = None,
) -> None:
    """Plan pipeline layout and recompute for MODEL on NODES x GPUS_PER_NODE GPUs."""
    if ctx.invoked_subcommand:
        return
    from tuner.cli.errors import command_engine
    from tuner.plan.request import PlanRequest, RequestError, plan_node_counts, plan_request
    from tuner.plan.validate import starting_calibration

    with _user_errors():
        required = {"model": model, "nodes": nodes, "gpus_per_node": gpus_per_node, "gpu": gpu, "gbs": gbs, "seq": seq}
        for field, value in required.items():
            if value is None:
                raise RequestError(field, "is required")
        counts = node_counts(nodes)
        if report is not None and len(counts) > 1:
            raise RequestError("report", "an HTML report is of one node count; give --nodes one count")
        request = PlanRequest.parse(
            model=model, nodes=counts[0], gpus_per_node=gpus_per_node, gpu=gpu, gbs=gbs, mbs=mbs, seq=seq, ep=ep,
            pp=_auto(pp, "pp"), vpp=_auto(vpp, "vpp"), top=top, profiles_from=profiles_from, scale_time=scale_time,
            flops_per_token=flops_per_token, kernels=kernels)
        engine = command_engine(ctx)
        # The newest calibration `tuner plan validate` refitted on this GPU kind, else the defaults.
        from tuner.plan.hardware import gpu_kind

        calibration = starting_calibration(engine, gpu_kind(request.gpu).device_name)
        if len(counts) > 1:
            rows = plan_node_counts(engine, request, counts, calibration)
        else:
            outcome = plan_request(engine, request, calibration)
            if report is not None:
                from tuner.plan.report import write_report

                write_report(report, outcome)
    if len(counts) > 1:
        _print_sweep(rows, json_out)
        return
    if json_out:
        typer.echo(json.dumps(outcome.to_dict(), indent=2))
        return
    print_outcome(outcome, report)


# -- one node count -------------------------------------------------------------------------


def _megatron_flags(flags: dict | None) -> str:
    if flags is None:
        return "not expressible (use Primus recompute_layer_ids)"
    if not flags:
        return "none"
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in flags.items())


def _header(request: PlanRequest, resolved: Resolved, nodes: str) -> None:
    r = request
    console.print(f"[bold]{r.model}[/bold] on {nodes} x {r.gpus_per_node} {resolved.gpu.name}: gbs {r.gbs}, "
                  f"mbs {r.mbs}, seq {r.seq}, ep {r.ep}", highlight=False)
    console.print(f"profiles: {resolved.loaded.source}", highlight=False)
    if resolved.label:
        console.print(f"[bold yellow]{resolved.label}[/bold yellow]", highlight=False)
    for warning in resolved.warnings:
        console.print(f"[yellow]warning: {warning}[/yellow]", highlight=False)


def print_outcome(outcome: Outcome, report: Path | None = None) -> None:
    """The request, the chosen plan as a block, its memory per stage, the ranking, the bound and the time."""
    from rich import box
    from rich.table import Table

    from tuner.plan.report import compact_layout
    from v4.layout import format_ranges

    _header(outcome.request, outcome.resolved, str(outcome.request.nodes))
    for note in outcome.stale:
        console.print(f"[yellow]{note}[/yellow]", highlight=False)
    best = outcome.plan_dict(outcome.plans[0])
    ids = best["recompute_layer_ids"]
    layers = len(outcome.plans[0].model.layers)
    layout = compact_layout(best["layout"])
    block = Table.grid(padding=(0, 2))
    block.add_column(style="bold")
    block.add_column(overflow="fold")
    for name, text in (
        ("parallelism", f"pp {best['pp']} x vpp {best['vpp']}, dp {best['dp']}, ep {best['ep']}, "
                        f"{best['microbatches']} microbatches"),
        ("layout", layout),
        ("recompute", f"{len(ids)} of {layers} layers: {format_ranges(ids)}"),
        ("Primus", f"--pipeline-model-parallel-layout '{layout}'\nrecompute_layer_ids: {format_ranges(ids)}"),
        ("Megatron", f"--pipeline-model-parallel-layout '{layout}'\n{_megatron_flags(best['megatron_recompute'])}"),
        ("step", f"{best['step_ms']:,.1f} ms: {best['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, "
                 f"{best['tflops_per_gpu']:.0f} TFLOP/s/GPU, bubble {best['bubble_fraction']:.0%}"),
    ):
        block.add_row(name, text)
    console.print("[bold]chosen plan[/bold]" + (" (BORROWED profiles)" if outcome.resolved.borrowed else ""))
    console.print(block, highlight=False)
    capacity = outcome.capacity_bytes / GiB
    memory = Table("rank", "in flight", "weights", "optim.", "activ.", "buffers", "total", "free",
                   title=f"memory per stage, GiB (capacity {capacity:.1f}, "
                         f"{'measured' if outcome.capacity_measured else 'datasheet'})")
    for s in best["stages"]:
        memory.add_row(str(s["rank"]), str(s["in_flight"]), *(f"{s[k] / GiB:.1f}" for k in (
            "weights_and_grads_bytes", "optimizer_bytes", "activation_bytes", "buffer_bytes", "total_bytes",
            "headroom_bytes")))
    console.print(memory)
    ranking = Table("#", "pp x vpp", "layout", "recompute", "step ms", "tok/s/GPU", "peak GiB", box=box.SIMPLE_HEAD,
                    title="ranking")
    ranking.columns[2].overflow = "fold"
    for i, plan in enumerate(outcome.plans):
        d = outcome.plan_dict(plan)
        ranking.add_row(str(i + 1), f"{d['pp']} x {d['vpp']}", compact_layout(d["layout"]),
                        f"{len(d['recompute_layer_ids'])}/{layers}", f"{d['step_ms']:,.1f}",
                        f"{d['tokens_per_s_per_gpu']:,.0f}", f"{max(s['total_bytes'] for s in d['stages']) / GiB:.1f}")
    console.print(ranking)
    gap = outcome.result.gap
    console.print(("proven optimal under the model" if gap == 0 else
                   f"proven within {gap:.1%} of the optimum under the model (lower bound "
                   f"{outcome.result.lower_bound_ms:,.1f} ms)")
                  + f"; planned in {outcome.cpu_s:.2f} s CPU; stored as plan {outcome.plan_id}"
                  + (f"; report {report}" if report else ""), highlight=False)


# -- a node sweep ---------------------------------------------------------------------------


def _print_sweep(sweep: dict[str, Any], json_out: bool) -> None:
    from rich import box
    from rich.table import Table

    from tuner.plan.report import compact_layout

    resolved, rows, smallest = sweep["resolved"], sweep["rows"], sweep["smallest_fitting"]
    cpu = sweep["cpu_s"]
    if json_out:
        typer.echo(json.dumps({"request": resolved.request.model_dump(exclude={"nodes"}), "label": resolved.label,
                               "profiles_source": resolved.loaded.source, "warnings": list(resolved.warnings),
                               "rows": rows, "smallest_fitting_nodes": smallest, "planning_cpu_s": cpu}, indent=2))
        return
    _header(resolved.request, resolved, ",".join(str(row["nodes"]) for row in rows))
    table = Table("nodes", "pp x vpp", "best plan", "step ms", "tok/s/GPU", "peak GiB", box=box.SIMPLE_HEAD,
                  title="best plan per node count" + (" (BORROWED)" if resolved.borrowed else ""))
    table.columns[2].overflow = "fold"
    for row in rows:
        if not row["fits"]:
            table.add_row(str(row["nodes"]), "-", row["why"], "-", "-", "-")
            continue
        d = row["plan"]
        table.add_row(str(row["nodes"]), f"{d['pp']} x {d['vpp']}", compact_layout(d["layout"]),
                      f"{d['step_ms']:,.1f}", f"{d['tokens_per_s_per_gpu']:,.0f}", f"{row['peak_bytes'] / GiB:.1f}")
    console.print(table)
    console.print((f"smallest node count that fits: {smallest}" if smallest is not None else
                   f"no node count of {rows[0]['nodes']}-{rows[-1]['nodes']} fits: try more nodes or a smaller --mbs")
                  + f"; planned {len(rows)} node counts in {cpu:.2f} s CPU", highlight=False)

"""``tuner plan``: the fastest pipeline layouts and recompute sets for a model on a cluster, from stored
layer profiles (``tuner profile layers``), with memory per stage, a proven optimality bound, an
optional HTML report and JSON output. Each plan is stored; a stored plan of the same request
computed from older profiles or kernel tables is reported stale.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from db import DatabaseError, default_url, open_database
from tuner.cli.errors import fail
from tuner.plan.hardware import gpu_kind
from v4.layout import format_ranges
from tuner.plan.profiles import ProfilesMissing
from tuner.plan.report import write_report
from tuner.plan.request import Outcome, PlanRequest, RequestError, plan_request
from tuner.plan.search import NoPlanFits
from tuner.plan.validate import starting_calibration

GiB = 1 << 30
plan_app = typer.Typer(help=__doc__, invoke_without_command=True, no_args_is_help=False)
console = Console()


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Bad arguments, missing profiles and plans that cannot fit: one message naming the cause, exit code 2."""
    try:
        yield
    except RequestError as exc:
        fail(f"--{exc.field.replace('_', '-')}: {exc.reason}")
    except (ProfilesMissing, NoPlanFits, DatabaseError, OSError) as exc:
        fail(str(exc))


def _auto(value: str, field: str) -> int | None:
    if value == "auto":
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise RequestError(field, f"must be auto or an integer >= 1, got {value!r}")
    return number


@plan_app.callback()
def plan(
    ctx: typer.Context,
    model: Annotated[Optional[str], typer.Option(help="model preset, e.g. v4-flash")] = None,
    nodes: Annotated[Optional[int], typer.Option(help="nodes in the cluster")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option(help="GPUs per node")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU kind: h100, h200, b200, mi300x, mi325x, mi355x (cpu: this host)")] = None,
    gbs: Annotated[Optional[int], typer.Option(help="global batch, sequences per step")] = None,
    mbs: Annotated[int, typer.Option(help="micro-batch, sequences")] = 1,
    seq: Annotated[Optional[int], typer.Option(help="sequence length")] = None,
    ep: Annotated[int, typer.Option(help="expert-parallel ranks (inside the data-parallel group)")] = 8,
    pp: Annotated[str, typer.Option(help="pipeline ranks, or auto")] = "auto",
    vpp: Annotated[str, typer.Option(help="virtual stages per pipeline rank, or auto")] = "auto",
    top: Annotated[int, typer.Option(help="plans to show: the chosen one and the runners-up")] = 5,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
    report: Annotated[Optional[Path], typer.Option(help="write an HTML report here")] = None,
    profiles_from: Annotated[Optional[str], typer.Option(help="plan from this GPU kind's profiles")] = None,
    scale_time: Annotated[Optional[float], typer.Option(help="with --profiles-from: multiply every time")] = None,
    flops_per_token: Annotated[Optional[float], typer.Option(help="model FLOPs per token (default: the preset's)")] = None,
    kernels: Annotated[Optional[str], typer.Option(
        help="plan from the profiles of this kernel path: triton or eager (default: Triton where profiled)")] = None,
) -> None:
    """Plan pipeline layout and recompute for MODEL on NODES x GPUS_PER_NODE GPUs."""
    if ctx.invoked_subcommand:
        return
    with _user_errors():
        required = {"model": model, "nodes": nodes, "gpus_per_node": gpus_per_node, "gpu": gpu, "gbs": gbs, "seq": seq}
        for field, value in required.items():
            if value is None:
                raise RequestError(field, "is required")
        request = PlanRequest.parse(
            model=model, nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, gbs=gbs, mbs=mbs, seq=seq, ep=ep,
            pp=_auto(pp, "pp"), vpp=_auto(vpp, "vpp"), top=top, profiles_from=profiles_from, scale_time=scale_time,
            flops_per_token=flops_per_token, kernels=kernels)
        root = ctx.find_root().params
        engine = open_database(root.get("db") or default_url())
        # The newest calibration `tuner plan validate` refitted on this GPU kind, else the defaults.
        outcome = plan_request(engine, request, starting_calibration(engine, gpu_kind(request.gpu).device_name))
        if report is not None:
            write_report(report, outcome)
    if json_out:
        typer.echo(json.dumps(outcome.to_dict(), indent=2))
        return
    _print(outcome, report)


def _megatron_flags(flags: dict | None) -> str:
    if flags is None:
        return "not expressible (use Primus recompute_layer_ids)"
    if not flags:
        return "none"
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in flags.items())


def _print(outcome: Outcome, report: Path | None) -> None:
    r = outcome.request
    console.print(f"[bold]{r.model}[/bold] on {r.nodes}x{r.gpus_per_node} {outcome.gpu.name}: gbs {r.gbs}, "
                  f"mbs {r.mbs}, seq {r.seq}, ep {r.ep}", highlight=False)
    for note in ([outcome.label] if outcome.label else []) + list(outcome.stale):
        console.print(f"[yellow]{note}[/yellow]", highlight=False)
    for warning in outcome.warnings:
        console.print(f"[yellow]warning: {warning}[/yellow]", highlight=False, soft_wrap=True)
    capacity = outcome.capacity_bytes / GiB
    table = Table("", "pp", "vpp", "dp", "layout", "recompute ids", "step ms", "tokens/s/GPU", "TFLOP/s/GPU",
                  "peak GiB", "min headroom GiB", title="plans" + (f" ({outcome.label})" if outcome.label else ""))
    for column in (table.columns[4], table.columns[5]):
        column.overflow = "fold"
    for i, plan in enumerate(outcome.plans):
        d = outcome.plan_dict(plan)
        table.add_row("chosen" if i == 0 else str(i), str(d["pp"]), str(d["vpp"]), str(d["dp"]), d["layout"],
                      format_ranges(d["recompute_layer_ids"]), f"{d['step_ms']:.1f}",
                      f"{d['tokens_per_s_per_gpu']:.0f}", f"{d['tflops_per_gpu']:.0f}",
                      f"{max(s['total_bytes'] for s in d['stages']) / GiB:.1f}",
                      f"{min(s['headroom_bytes'] for s in d['stages']) / GiB:.1f}")
    console.print(table)
    best = outcome.plan_dict(outcome.plans[0])
    console.print(f"chosen: --pipeline-model-parallel-layout '{best['layout']}'\n"
                  f"  recompute_layer_ids: {format_ranges(best['recompute_layer_ids'])}\n"
                  f"  Megatron recompute: {_megatron_flags(best['megatron_recompute'])}", highlight=False, soft_wrap=True)
    memory = Table("stage (rank)", "in flight", "weights+grads", "optimizer", "activations", "buffers", "total",
                   "headroom",
                   title=f"memory per stage of the chosen plan, GiB (capacity {capacity:.1f}, "
                         f"{'measured' if outcome.capacity_measured else 'nominal'})")
    for s in best["stages"]:
        memory.add_row(str(s["rank"]), str(s["in_flight"]), *(f"{s[k] / GiB:.1f}" for k in (
            "weights_and_grads_bytes", "optimizer_bytes", "activation_bytes", "buffer_bytes", "total_bytes",
            "headroom_bytes")))
    console.print(memory)
    gap = outcome.result.gap
    console.print(("proven optimal under the model" if gap == 0 else
                   f"proven within {gap:.1%} of the optimum under the model (lower bound "
                   f"{outcome.result.lower_bound_ms:.1f} ms; the search budget ran out first)")
                  + f"; stored as plan {outcome.plan_id}" + (f"; report {report}" if report else ""), highlight=False)

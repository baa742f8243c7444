"""``tuner profile layers|alltoall|export``: measure what the planner prices, and ship it.

``layers`` times each layer kind alone on one device and ``alltoall`` one MoE layer's EP dispatch
+ combine across the GPUs of one node; both store rows in the database (``--db``).
``export`` writes the newest rows of one GPU kind to a packaged-profiles file with their
provenance (``tuner.plan.packaged``), the file a fresh install plans from.

Every heavy module (torch, Ray, the V4 model) is imported inside the command that needs it, so
``tuner --help`` does not pay for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from tuner.cli.errors import command_engine, reporting

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from v4.config import ModelConfig

profile_app = typer.Typer(help="Measure per-layer costs for the planner, and export them as packaged profiles.",
                          no_args_is_help=True)


# What the profile commands report in words (``module:Class``: looked up only once the module is loaded).
ERRORS = ("tuner.train.profile_layers:ProfileError", "tuner.plan.profiles:ProfileError", "v4.config:PresetError",
          "v4.config:ModelArgumentError",
          "workers.alltoall_runner:AlltoallRunError", "tuner.plan.packaged:NothingToExport",
          "tuner.plan.hardware:UnknownGpu", "builtins:OSError")


def _check_device(device: str) -> None:
    from tuner.train.profile_layers import ProfileError

    if device not in ("auto", "cpu", "cuda"):
        raise ProfileError(f"device: must be auto, cpu or cuda, got {device!r}")


Model = Annotated[str, typer.Option("--model", help="preset name (v4/presets) or a YAML file of ModelConfig fields")]
Seq = Annotated[int, typer.Option(help="sequence length")]
Mbs = Annotated[int, typer.Option(help="microbatch size")]
Device = Annotated[str, typer.Option(help="auto (a GPU when there is one), cpu or cuda")]


@profile_app.command("layers")
@reporting(ERRORS)
def profile_layers_command(
    ctx: typer.Context, model: Model, seq: Seq, mbs: Mbs = 1,
    ep: Annotated[int, typer.Option(help="expert-parallel ranks: each layer holds experts/ep experts")] = 1,
    kernels: Annotated[str, typer.Option(help="eager or triton")] = "eager", device: Device = "auto",
    warmup: Annotated[Optional[int], typer.Option(help="untimed rounds (default: 2 on GPU, 1 on CPU)")] = None,
    reps: Annotated[Optional[int], typer.Option(help="timed rounds, median taken (default: 5 on GPU, 3 on CPU)")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        help="also write each layer kind's profiler trace (KIND.json, Chrome format) and op table (KIND.txt) here")] = None,
) -> None:
    """Time each layer kind alone on one device and store the costs the planner reads."""
    import torch

    from tuner.train.profile_layers import ProfileError
    from v4.config import load_preset
    from v4.ops import KERNEL_CHOICES

    config = load_preset(model)
    if kernels not in KERNEL_CHOICES:
        raise ProfileError(f"kernels: must be one of {KERNEL_CHOICES}, got {kernels!r}")
    _check_device(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    measure_layers(command_engine(ctx), config, seq, mbs, ep, kernels, device, warmup, reps, trace)


def measure_layers(engine: Engine, config: ModelConfig, seq: int, mbs: int, ep: int, kernels: str, device: str,
                   warmup: int | None = None, reps: int | None = None, trace: Path | None = None,
                   show: bool = True) -> None:
    """Profile every layer kind of ``config`` on ``device`` (cpu or cuda), store the rows with their
    provenance (device, toolchain, kernel-table key) and, with ``show``, print them."""
    from kernels.provenance import kernel_tables, tables_key
    from tuner.cli.display import console
    from tuner.plan import profiles
    from tuner.train import display as train_display
    from tuner.train.profile_layers import profile_layers
    from workers.device_info import describe_device, gpu_name_and_memory

    gpu = device == "cuda"
    with console.status(f"profiling {config.name}") as status:
        costs = profile_layers(config, seq, mbs, ep, kernels, device,
                               warmup=warmup if warmup is not None else 2 if gpu else 1,
                               reps=reps if reps is not None else 5 if gpu else 3,
                               on_piece=lambda kind: status.update(f"profiling {config.name}: {kind}"),
                               trace_dir=trace)
    kind, memory = gpu_name_and_memory(device)
    tables = tables_key(kernel_tables(kernels))
    profiles.store_profiles(engine, costs, gpu_kind=kind, gpu_memory_bytes=memory, model=config.name, seq=seq, mbs=mbs,
                            ep=ep, kernel_tables=tables, toolchain=describe_device()["versions"])
    if show:
        console.print(train_display.profile_table(costs, f"{config.name} on {kind}: seq {seq}, mbs {mbs}, ep {ep}, "
                                                         f"{tables}"))
        shares = trace / "kernel_shares.json" if trace is not None else None
        if shares is not None and shares.exists():
            console.print(train_display.shares_table(json.loads(shares.read_text())))


def _ranks_per_node(device: str) -> tuple[int, int]:
    """(the most GPUs, or CPUs, one alive Ray node has; the cluster's total) for ``device``."""
    import ray

    resource = "GPU" if device == "cuda" else "CPU"
    counts = [int(node["Resources"].get(resource, 0)) for node in ray.nodes() if node.get("Alive")]
    return max(counts, default=0), sum(counts)


@profile_app.command("alltoall")
@reporting(ERRORS)
def profile_alltoall_command(
    ctx: typer.Context, model: Model, seq: Seq,
    ep: Annotated[int, typer.Option(help="expert-parallel ranks, all on one node (>= 2)")],
    mbs: Mbs = 1, device: Device = "auto",
    warmup: Annotated[int, typer.Option(help="untimed rounds")] = 5,
    reps: Annotated[Optional[int], typer.Option(help="timed rounds, median taken (default: 100 on GPU, 20 on CPU)")] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", envvar="RAY_ADDRESS", help="join this Ray cluster (default: start a local one)")] = None,
) -> None:
    """Time one MoE layer's EP dispatch + combine on EP ranks of one node and store it for the planner."""
    import ray

    from tuner.cli.display import console
    from tuner.plan import profiles
    from tuner.train import display as train_display
    from tuner.train.profile_layers import ProfileError
    from tuner.train.serve import connect_ray, resolve_device
    from v4.config import PresetError, load_preset
    from workers.alltoall_cost import alltoall_shape
    from workers.alltoall_runner import run_alltoall

    try:
        config = load_preset(model)
    except PresetError as exc:
        raise ProfileError(f"model: {exc}") from None
    shape = alltoall_shape(config, seq, mbs, ep)
    _check_device(device)
    if warmup < 0:
        raise ProfileError(f"warmup: must be >= 0, got {warmup}")
    if reps is not None and reps < 1:
        raise ProfileError(f"reps: must be >= 1, got {reps}")
    engine = command_engine(ctx)
    started = connect_ray(ray_address)
    try:
        device = resolve_device(device)
        per_node, total = _ranks_per_node(device)
        if ep > per_node:
            unit = "GPUs" if device == "cuda" else "CPUs"
            raise ProfileError(f"ep: {ep} ranks need {ep} {unit} on one node; the largest Ray node has {per_node} "
                               f"({total} in the cluster): the all-to-all is measured inside one node")
        with console.status(f"timing the all-to-all of {config.name} on {ep} {device} rank(s)"):
            outcome = run_alltoall(shape, device, warmup, reps if reps is not None else 100 if device == "cuda" else 20)
    finally:
        if started:
            ray.shutdown()
    cost = outcome.cost
    profiles.store_alltoall(engine, cost, gpu_kind=outcome.gpu_kind, model=config.name, seq=seq, mbs=mbs, ep=ep,
                            rows_per_rank=shape.rows, hidden=shape.hidden, bytes_per_rank=shape.bytes_per_rank,
                            toolchain=outcome.environment.get("versions", {}))
    console.print(train_display.alltoall_table(
        cost, f"{config.name} EP all-to-all on {ep} x {outcome.gpu_kind}: seq {seq}, mbs {mbs}"))


@profile_app.command("export")
@reporting(ERRORS)
def profile_export_command(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Option(help="GPU kind whose rows to export: h100, h200, b200, mi300x, mi325x, mi355x")],
    out: Annotated[Path, typer.Option(
        help="folder to write KIND.json into; tuner/plan/profiles_data in a checkout ships them with the package")],
) -> None:
    """Write the newest layer profiles of GPU kind GPU from the database, with their provenance (device, toolchain, kernel-table digest, date, command), as the file the planner falls back to."""
    import json

    from tuner.plan.hardware import gpu_kind
    from tuner.plan.packaged import export_profiles

    kind = gpu_kind(gpu)
    path = export_profiles(command_engine(ctx), kind.name, kind.device_name, out)
    typer.echo(f"wrote {path}")
    for entry in json.loads(path.read_text())["profiles"]:
        p = entry["provenance"]
        alltoall = ("measured" if entry["alltoall"] else
                    "not measured (the planner prices it 0 inside a node and says so)")
        typer.echo(f"  {entry['model']} seq {entry['seq']} mbs {entry['mbs']} ep {entry['ep']}: "
                   f"{len(entry['layers'])} layer kinds, {p['kernel_tables']}, measured {p['measured_at'][:19]}; "
                   f"EP all-to-all {alltoall}")

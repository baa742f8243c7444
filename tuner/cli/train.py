"""``tuner train run|queue|list|show|cancel`` and ``tuner profile layers|alltoall``: measured V4 training runs, layer
costs and the expert-parallel all-to-all.

Registered on the main app by ``register(app)``; the database URL is the main app's ``--db``
(or ``TUNER_DB_URL``), read from the root command's parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import ray
import typer
from sqlalchemy import Engine

from db import DatabaseError, default_url, open_database
from tuner.train import display as train_display
from tuner.train import queue as train_queue
from tuner.cli.errors import reporting
from tuner.cli.display import console
from tuner.plan import profiles
from v4.layout import parse_layout
from workers.alltoall_cost import alltoall_shape
from tuner.train.profile_layers import ProfileError, profile_layers
from kernels.provenance import kernel_tables, tables_key
from tuner.sweep.serve import owner_name
from tuner.train.serve import connect_ray, execute, resolve_device
from v4.config import PresetError, load_preset
from v4.ops import KERNEL_CHOICES
from workers.alltoall_runner import AlltoallRunError, run_alltoall
from workers.device_info import describe_device, gpu_name_and_memory

train_app = typer.Typer(help="Run, queue and inspect measured V4 training runs.", no_args_is_help=True)
profile_app = typer.Typer(help="Measure per-layer costs for the planner.", no_args_is_help=True)

USER_ERRORS = (train_queue.TrainRequestError, train_queue.TrainRunNotFound, ProfileError, profiles.ProfileError,
               PresetError, DatabaseError, AlltoallRunError)


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``profile`` to the ``tuner`` command."""
    app.add_typer(train_app, name="train")
    app.add_typer(profile_app, name="profile")


_user_errors = reporting(USER_ERRORS)


def _engine(ctx: typer.Context) -> Engine:
    return open_database(ctx.find_root().params.get("db") or default_url())


def _stages(model: str, layout: str) -> int:
    """How many stages ``layout`` has (the default pp); 1 when it does not parse (RunConfig then says why)."""
    try:
        config = load_preset(model)
        return len(parse_layout(layout, config.layers, 1, config.mtp_layers).stages)
    except ValueError:
        return 1


Model = Annotated[str, typer.Option("--model", help="preset name (v4/presets) or a YAML file of ModelConfig fields")]
Kernels = Annotated[str, typer.Option(help=f"one of {', '.join(KERNEL_CHOICES)}")]
Device = Annotated[str, typer.Option(help="auto (a GPU when the cluster has one), cpu or cuda")]


Layout = Annotated[Optional[str], typer.Option(help="pipeline layout, e.g. 'Et*2|t*2mL' (default: even split)")]
PP = Annotated[Optional[int], typer.Option(help="pipeline ranks (default: the layout's stage count)")]
Recompute = Annotated[str, typer.Option(help="e.g. 'none', '0-3', 'selective:attn_core,mhc'")]
Gbs = Annotated[int, typer.Option(help="global batch (samples per iteration)")]
Mbs = Annotated[int, typer.Option(help="microbatch size")]
Seq = Annotated[int, typer.Option(help="sequence length")]
Iters = Annotated[int, typer.Option(help="iterations")]
Warmup = Annotated[int, typer.Option(help="iterations left out of the step-time figures")]
Dtype = Annotated[str, typer.Option(help="bfloat16 or float32")]
World = Annotated[int, typer.Option(help="ranks: data-parallel replicas × pp")]


def _request(model: str, layout: Optional[str], pp: Optional[int], recompute: str, gbs: int, mbs: int, seq: int,
             iters: int, warmup_iters: int, lr: float, seed: int, kernels: str, dtype: str, device: str,
             world: int) -> train_queue.TrainRequest:
    """The request of ``train run`` / ``train queue``; ``TrainRequestError`` names every bad field."""
    fields = dict(preset=model, layout=layout, pp=pp or (_stages(model, layout) if layout else 1),
                  recompute=recompute, gbs=gbs, mbs=mbs, seq=seq, iters=iters, warmup_iters=warmup_iters, lr=lr,
                  seed=seed, kernels=kernels, dtype=dtype)
    return train_queue.parse_request(fields, device, world)  # type: ignore[arg-type]


@train_app.command("run")
@_user_errors
def train_run(ctx: typer.Context, model: Model, gbs: Gbs, seq: Seq, iters: Iters, layout: Layout = None,
              pp: PP = None, recompute: Recompute = "none", mbs: Mbs = 1, warmup_iters: Warmup = 1,
              lr: float = 1e-3, seed: int = 0, kernels: Kernels = "eager", dtype: Dtype = "bfloat16",
              device: Device = "auto", world: World = 1,
              ray_address: Annotated[Optional[str], typer.Option(
                  "--ray-address", envvar="RAY_ADDRESS", help="join this Ray cluster (default: start a local one)")] = None,
              lease_seconds: Annotated[float, typer.Option(help="how long the run's lease lasts unrenewed")] = 60.0) -> None:
    """Run a training run now on the Ray cluster, store it, and print what it measured (exit 1 unless ok)."""
    request = _request(model, layout, pp, recompute, gbs, mbs, seq, iters, warmup_iters, lr, seed, kernels, dtype,
                       device, world)
    engine = _engine(ctx)
    started = connect_ray(ray_address)
    try:
        run_id = train_queue.enqueue(engine, request)
        owner = owner_name()
        if not train_queue.try_claim(engine, run_id, owner, lease_seconds):
            raise train_queue.TrainRunNotFound(f"training run {run_id} was taken by a server before it could start")
        with console.status(f"training run {run_id}") as status:
            result = execute(engine, run_id, owner, on_phase=lambda phase: status.update(f"run {run_id}: {phase}"))
    finally:
        if started:
            ray.shutdown()
    _show(engine, run_id)
    if result != "ok":
        raise typer.Exit(1)


@train_app.command("queue")
@_user_errors
def train_queue_command(ctx: typer.Context, model: Model, gbs: Gbs, seq: Seq, iters: Iters, layout: Layout = None,
                        pp: PP = None, recompute: Recompute = "none", mbs: Mbs = 1, warmup_iters: Warmup = 1,
                        lr: float = 1e-3, seed: int = 0, kernels: Kernels = "eager", dtype: Dtype = "bfloat16",
                        device: Device = "auto", world: World = 1) -> None:
    """Store a training run as queued for ``tuner serve``; prints its id."""
    request = _request(model, layout, pp, recompute, gbs, mbs, seq, iters, warmup_iters, lr, seed, kernels, dtype,
                       device, world)
    typer.echo(train_queue.enqueue(_engine(ctx), request))


@train_app.command("list")
@_user_errors
def train_list(ctx: typer.Context) -> None:
    """All training runs with their status and headline figures."""
    console.print(train_display.runs_table(train_queue.list_runs(_engine(ctx))))


def _show(engine: Engine, run_id: int) -> None:
    row = train_queue.get_run(engine, run_id)
    console.print(train_display.run_summary(row))
    if row.stage_memory:
        console.print(train_display.memory_table(row))
    console.print(train_display.loss_curve(row))


@train_app.command("show")
@_user_errors
def train_show(ctx: typer.Context, run_id: int) -> None:
    """One run: its figures, memory per pipeline rank and loss curve."""
    _show(_engine(ctx), run_id)


@train_app.command("cancel")
@_user_errors
def train_cancel(ctx: typer.Context, run_id: int) -> None:
    """Cancel a queued or running training run (a running one stops within seconds)."""
    typer.echo(f"training run {run_id}: {train_queue.cancel(_engine(ctx), run_id)}")


@profile_app.command("layers")
@_user_errors
def profile_layers_command(
    ctx: typer.Context, model: Model, seq: Seq, mbs: Mbs = 1,
    ep: Annotated[int, typer.Option(help="expert-parallel ranks: each layer holds experts/ep experts")] = 1,
    kernels: Kernels = "eager", device: Device = "auto",
    warmup: Annotated[Optional[int], typer.Option(help="untimed rounds (default: 2 on GPU, 1 on CPU)")] = None,
    reps: Annotated[Optional[int], typer.Option(help="timed rounds, median taken (default: 5 on GPU, 3 on CPU)")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        help="also write each layer kind's profiler trace (KIND.json, Chrome format) and op table (KIND.txt) here")] = None,
) -> None:
    """Time each layer kind alone on one device and store the costs the planner reads."""
    import torch

    config = load_preset(model)
    if kernels not in KERNEL_CHOICES:
        raise ProfileError(f"kernels: must be one of {KERNEL_CHOICES}, got {kernels!r}")
    if device not in ("auto", "cpu", "cuda"):
        raise ProfileError(f"device: must be auto, cpu or cuda, got {device!r}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = device == "cuda"
    engine = _engine(ctx)
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
    console.print(train_display.profile_table(costs, f"{config.name} on {kind}: seq {seq}, mbs {mbs}, ep {ep}, {tables}"))


def _ranks_per_node(device: str) -> tuple[int, int]:
    """(the most GPUs, or CPUs, one alive Ray node has; the cluster's total) for ``device``."""
    resource = "GPU" if device == "cuda" else "CPU"
    counts = [int(node["Resources"].get(resource, 0)) for node in ray.nodes() if node.get("Alive")]
    return max(counts, default=0), sum(counts)


@profile_app.command("alltoall")
@_user_errors
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
    try:
        config = load_preset(model)
    except PresetError as exc:
        raise ProfileError(f"model: {exc}") from None
    shape = alltoall_shape(config, seq, mbs, ep)
    if device not in ("auto", "cpu", "cuda"):
        raise ProfileError(f"device: must be auto, cpu or cuda, got {device!r}")
    if warmup < 0:
        raise ProfileError(f"warmup: must be >= 0, got {warmup}")
    if reps is not None and reps < 1:
        raise ProfileError(f"reps: must be >= 1, got {reps}")
    engine = _engine(ctx)
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

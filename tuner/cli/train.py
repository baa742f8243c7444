"""``tuner train run|queue|list|show|cancel``: measured V4 training runs (``tuner profile`` is in ``profile.py``).

Registered on the main app by ``register(app)``; the database URL is the main app's ``--db``
(or ``TUNER_DB_URL``), read from the root command's parameters. ``run`` and ``queue`` import the
V4 model and Ray when they run; ``list``, ``show`` and ``cancel`` read the database only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from tuner.cli.display import console
from tuner.cli.errors import ID_MAX, command_engine, reporting

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from db.training import TrainRun
    from tuner.train.queue import TrainRequest

train_app = typer.Typer(help="Run, queue and inspect measured V4 training runs.", no_args_is_help=True)
RunId = Annotated[int, typer.Argument(min=1, max=ID_MAX, help="a training run's id (tuner train list)")]


# What the training commands report in words.
ERRORS = ("v4.config:PresetError", "tuner.sweep.queue:SweepNotFound", "tuner.train.queue:TrainRequestError",
          "tuner.train.queue:TrainRunNotFound")


def register(app: typer.Typer) -> None:
    """Add ``train`` to the ``tuner`` command."""
    app.add_typer(train_app, name="train")


_user_errors = reporting(ERRORS)


def _stages(model: str, layout: str) -> int:
    """How many stages ``layout`` has (the default pp: one stage per rank); 1 when it does not parse (RunConfig
    then says why). Only the stage count and the MTP layer's virtual stage depend on pp, so pp grows from 1
    until they hold: at the latest at pp = the stage count (vpp 1), where every layout the parser accepts holds."""
    from v4.config import load_preset  # pydantic and YAML: not for --help
    from v4.layout import LayoutError, parse_layout

    try:
        config = load_preset(model)
    except ValueError:
        return 1
    for pp in range(1, config.layers + config.mtp_layers + 3):  # a stage holds a layer, E or L
        try:
            return len(parse_layout(layout, config.layers, pp, config.mtp_layers).stages)
        except LayoutError as exc:
            if exc.rule not in ("stage-count", "mtp-stage"):
                return 1
    return 1


Model = Annotated[str, typer.Option("--model", help="preset name (v4/presets) or a YAML file of ModelConfig fields")]
Kernels = Annotated[str, typer.Option(help="eager (torch ops) or triton (the project's kernels)")]
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
CudaGraphs = Annotated[bool, typer.Option("--cuda-graphs", help=(
    "replay each layer's forward and backward as CUDA graphs (pp 1, triton kernels, no recompute, a GPU): "
    "the host's launches stop limiting the step"))]


def _request(model: str, layout: Optional[str], pp: Optional[int], recompute: str, gbs: int, mbs: int, seq: int,
             iters: int, warmup_iters: int, lr: float, seed: int, kernels: str, dtype: str, device: str,
             world: int, cuda_graphs: bool) -> TrainRequest:
    """The request of ``train run`` / ``train queue``; ``TrainRequestError`` names every bad field."""
    from tuner.train import queue as train_queue

    fields = dict(preset=model, layout=layout, pp=pp or (_stages(model, layout) if layout else 1),
                  recompute=recompute, gbs=gbs, mbs=mbs, seq=seq, iters=iters, warmup_iters=warmup_iters, lr=lr,
                  seed=seed, kernels=kernels, dtype=dtype, cuda_graphs=cuda_graphs)
    return train_queue.parse_request(fields, device, world)  # type: ignore[arg-type]


@train_app.command("run")
@_user_errors
def train_run(ctx: typer.Context, model: Model, gbs: Gbs, seq: Seq, iters: Iters, layout: Layout = None,
              pp: PP = None, recompute: Recompute = "none", mbs: Mbs = 1, warmup_iters: Warmup = 1,
              lr: float = 1e-3, seed: int = 0, kernels: Kernels = "eager", dtype: Dtype = "bfloat16",
              device: Device = "auto", world: World = 1, cuda_graphs: CudaGraphs = False,
              ray_address: Annotated[Optional[str], typer.Option(
                  "--ray-address", envvar="RAY_ADDRESS", help="join this Ray cluster (default: start a local one)")] = None,
              lease_seconds: Annotated[float, typer.Option(help="how long the run's lease lasts unrenewed")] = 60.0) -> None:
    """Run a training run now on the Ray cluster, store it, and print what it measured (exit 1 unless ok)."""
    import ray

    from tuner.sweep.serve import owner_name
    from tuner.train import queue as train_queue
    from tuner.train.serve import connect_ray, execute

    request = _request(model, layout, pp, recompute, gbs, mbs, seq, iters, warmup_iters, lr, seed, kernels, dtype,
                       device, world, cuda_graphs)
    engine = command_engine(ctx)
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
                        device: Device = "auto", world: World = 1, cuda_graphs: CudaGraphs = False) -> None:
    """Store a training run as queued for ``tuner serve``; prints its id."""
    from tuner.train import queue as train_queue

    request = _request(model, layout, pp, recompute, gbs, mbs, seq, iters, warmup_iters, lr, seed, kernels, dtype,
                       device, world, cuda_graphs)
    typer.echo(train_queue.enqueue(command_engine(ctx), request))


@train_app.command("list")
@_user_errors
def train_list(ctx: typer.Context) -> None:
    """All training runs with their status and headline figures."""
    from sqlalchemy import select

    from db import session_scope
    from db.training import TrainRun
    from tuner.train import display as train_display

    with session_scope(command_engine(ctx)) as session:
        runs = list(session.scalars(select(TrainRun).order_by(TrainRun.id)).all())
    console.print(train_display.runs_table(runs))


def _run(engine: Engine, run_id: int) -> TrainRun:
    """The stored run (read without the training modules, which import the V4 model)."""
    from db.training import TrainRun
    from tuner.sweep import queue

    return queue.get(engine, run_id, job=TrainRun)


def _show(engine: Engine, run_id: int) -> None:
    from tuner.train import display as train_display

    row = _run(engine, run_id)
    console.print(train_display.run_summary(row))
    if row.stage_memory:
        console.print(train_display.memory_table(row))
    console.print(train_display.loss_curve(row))


@train_app.command("show")
@_user_errors
def train_show(ctx: typer.Context, run_id: RunId) -> None:
    """One run: its figures, memory per pipeline rank and loss curve."""
    _show(command_engine(ctx), run_id)


@train_app.command("cancel")
@_user_errors
def train_cancel(ctx: typer.Context, run_id: RunId) -> None:
    """Cancel a queued or running training run (a running one stops within seconds)."""
    from db.training import TrainRun
    from tuner.sweep import queue

    typer.echo(f"training run {run_id}: {queue.cancel(command_engine(ctx), run_id, job=TrainRun)}")

"""``tuner plan validate``: run the planner's best plans and two baselines as short training runs on this
node, compare measured with predicted step time and memory per stage, refit the calibration and store it.

Added to the ``plan`` app on import (``tuner.cli.main`` imports this module).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from tuner.cli.display import console, err_console
from tuner.cli.plan import _user_errors, plan_app


def _gpu_name(device: str, gpu: str | None) -> str:
    """The planner's GPU kind for runs on ``device``: ``cpu``, ``--gpu``, or the driver's CUDA device."""
    from tuner.plan.hardware import GPUS
    from tuner.plan.request import RequestError

    if device == "cpu":
        return "cpu"
    if gpu is not None:
        return gpu
    import torch

    if not torch.cuda.is_available():
        raise RequestError("gpu", "this process sees no GPU to name the GPU kind; pass --gpu (e.g. h200)")
    name = torch.cuda.get_device_name(0)
    kind = next((k.name for k in GPUS.values() if k.device_name == name), None)
    if kind is None:
        raise RequestError("gpu", f"the planner does not know {name!r}; known: {', '.join(GPUS)}")
    return kind


@plan_app.command("validate")
def plan_validate(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="model preset, e.g. tiny or a proxy preset")],
    gpus: Annotated[int, typer.Option(help="ranks on this node: pipeline x data-parallel")],
    gbs: Annotated[int, typer.Option(help="global batch, sequences per step")],
    seq: Annotated[int, typer.Option(help="sequence length")],
    mbs: Annotated[int, typer.Option(help="micro-batch, sequences")] = 1,
    pp: Annotated[Optional[int], typer.Option(help="pipeline ranks (default: auto)")] = None,
    top: Annotated[int, typer.Option(help="planner plans to run (the pick and runners-up)")] = 3,
    iters: Annotated[int, typer.Option(help="iterations per run")] = 8,
    warmup: Annotated[int, typer.Option(help="iterations left out of the measured step")] = 2,
    device: Annotated[str, typer.Option(help="auto (a GPU when the cluster has one), cpu or cuda")] = "auto",
    gpu: Annotated[Optional[str], typer.Option(help="GPU kind of a cuda run (default: this process's GPU)")] = None,
    kernels: Annotated[str, typer.Option(help="eager (torch ops) or triton (the project's kernels)")] = "eager",
    profile: Annotated[bool, typer.Option("--profile", help="profile the layers on this device first")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
    report: Annotated[Optional[Path], typer.Option(help="write an HTML report here")] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", envvar="RAY_ADDRESS", help="join this Ray cluster (default: start a local one)")] = None,
) -> None:
    """Run the plans for MODEL on GPUS ranks of this node and compare them with their predictions."""
    import ray

    from tuner.cli.errors import command_engine
    from tuner.cli.profile import measure_layers
    from tuner.plan import profiles
    from tuner.plan.hardware import gpu_kind
    from tuner.plan.parallel import Cluster, ParallelismError, parallelisms
    from tuner.plan.profiles import ProfilesMissing, load_costs
    from tuner.plan.request import PlanRequest, RequestError
    from tuner.plan.validate import validate
    from tuner.plan.validate_report import summary_lines, tables, write_validation_report
    from tuner.train.profile_layers import ProfileError
    from tuner.train.queue import TrainRequestError
    from tuner.train.serve import connect_ray, resolve_device
    from v4.config import PresetError, load_preset
    from v4.ops import KERNEL_CHOICES
    from v4.pipeline import check_microbatches

    started = False
    try:
        with _user_errors():
            try:
                if device not in ("auto", "cpu", "cuda"):
                    raise RequestError("device", f"must be auto, cpu or cuda, got {device!r}")
                if kernels not in KERNEL_CHOICES:
                    raise RequestError("kernels", f"must be one of {KERNEL_CHOICES}, got {kernels!r}")
                if top < 1:
                    raise RequestError("top", f"must be >= 1, got {top}")
                if not 0 <= warmup < iters:
                    raise RequestError("warmup", f"must be >= 0 and below --iters {iters}, got {warmup}")
                if gpus < 1:
                    raise RequestError("gpus", f"must be >= 1, got {gpus}")
                fields = dict(model=model, nodes=1, gpus_per_node=gpus, gbs=gbs, mbs=mbs, seq=seq, ep=1, pp=pp, top=top,
                              kernels=kernels)  # plan from the profiles of the kernels the runs use
                # bad input fails before Ray starts
                PlanRequest.parse(**fields, gpu="cpu" if device == "cpu" else gpu or "h200")
                try:
                    config = load_preset(model)
                except PresetError as exc:
                    raise RequestError("model", str(exc)) from None
                try:
                    parallelisms(Cluster(1, gpus), gbs=gbs, mbs=mbs, ep=1, pp=pp, layers=len(config.layer_ids))
                    if pp is not None:  # torch's schedules take no fewer microbatches than stages
                        check_microbatches(gbs // (mbs * (gpus // pp)), pp, 1)
                except ParallelismError as exc:
                    raise RequestError(exc.field, exc.reason) from None
                except ValueError as exc:
                    raise RequestError("gbs", str(exc)) from None
                engine = command_engine(ctx)
                if device == "auto":  # only the cluster knows
                    started = connect_ray(ray_address)
                resolved = resolve_device(device)
                request = PlanRequest.parse(**fields, gpu=_gpu_name(resolved, gpu))
                if profile:  # at ep 1: the training runs have no expert parallelism
                    measure_layers(engine, config, seq, mbs, 1, kernels, resolved, show=False)
                try:
                    load_costs(engine, gpu_kind(request.gpu).device_name, model, seq, mbs, 1, kernels)
                except ProfilesMissing as exc:
                    raise ProfilesMissing(
                        f"{str(exc).split(';')[0]}. Profile it first: tuner profile layers --model {model} "
                        f"--seq {seq} --mbs {mbs} --ep 1 --device {resolved}, or pass --profile") from None
                started = connect_ray(ray_address) or started
                validation = validate(engine, request, top, iters=iters, warmup=warmup, device=resolved,
                                      kernels=kernels, on_phase=lambda phase: err_console.print(
                                          f"[dim]{phase}[/dim]", highlight=False))
            except (ProfileError, profiles.ProfileError, TrainRequestError) as exc:
                raise RequestError("request", str(exc)) from None
            data = validation.to_dict()
            if report is not None:
                write_validation_report(report, data)
    finally:
        if started:
            ray.shutdown()
    if json_out:
        typer.echo(json.dumps(data, indent=2))
        return
    for table in tables(data):
        console.print(table)
    for line in summary_lines(data) + ([f"report {report}"] if report else []):
        console.print(line, highlight=False)

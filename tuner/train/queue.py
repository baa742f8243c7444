"""Training runs in SQL: validate a request, enqueue, claim under a lease, store what the run measured.

Claims work as for sweeps (``tuner.sweep.queue``): one conditional UPDATE of a row that is queued, or
running under a lease nobody renewed, so two servers never run the same training run.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, PositiveInt, ValidationError, ValidationInfo, field_validator
from sqlalchemy import Engine, select

from db import session_scope
from db.training import TrainRun, TrainStatus
from tuner.sweep import queue
from v4.layout import format_layout
from v4.pipeline import RunConfig, RunResult, check_microbatches
from v4.recompute import RecomputePlan
from workers.train_runner import TrainOutcome

DeviceChoice = Literal["auto", "cpu", "cuda"]


class TrainRequestError(ValueError):
    """A training request that cannot run; one ``field: reason`` line per problem."""


class TrainRunNotFound(LookupError):
    pass


class TrainRequest(BaseModel):
    """A run and where to run it; ``world`` must hold ``dp × pp`` ranks whose schedule takes the batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: RunConfig
    device: DeviceChoice = "auto"
    world: PositiveInt = 1

    @field_validator("world")
    @classmethod
    def _fits(cls, world: int, info: ValidationInfo) -> int:
        run: RunConfig | None = info.data.get("run")
        if run is None:  # the run itself is invalid; its errors say why
            return world
        if world % run.pp:
            raise ValueError(f"{world} is not a multiple of pp={run.pp}")
        dp = world // run.pp
        if run.gbs % (run.mbs * dp):
            raise ValueError(f"gbs={run.gbs} is not a multiple of mbs × dp = {run.mbs} × {dp}")
        check_microbatches(run.gbs // (run.mbs * dp), run.pp, run.pipeline_layout().vpp)
        return world


def parse_request(run: dict[str, Any], device: DeviceChoice, world: int) -> TrainRequest:
    """Validate CLI-style fields (``run`` holds RunConfig's); ``TrainRequestError`` names each bad field.

    ``device="auto"`` is validated as a CPU run (as a GPU run with CUDA graphs, which only a GPU runs)
    and resolved by whoever runs it.
    """
    on_gpu = device == "cuda" or (device == "auto" and bool(run.get("cuda_graphs")))
    try:
        return TrainRequest(run={**run, "device": "cuda" if on_gpu else "cpu"}, device=device, world=world)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            loc = [str(part) for part in error["loc"] if part != "run"]
            lines.append(f"{'.'.join(loc) or 'run'}: {error['msg'].removeprefix('Value error, ')}")
        raise TrainRequestError("\n".join(lines)) from None


def enqueue(engine: Engine, request: TrainRequest) -> int:
    """Store a validated request as a ``queued`` run; its id."""
    with session_scope(engine) as session:
        row = TrainRun(request=request.run.model_dump(mode="json"), world=request.world, device=request.device,
                       preset=request.run.preset, status=TrainStatus.queued.value)
        session.add(row)
        session.flush()
        return row.id


def try_claim(engine: Engine, run_id: int, owner: str, lease_s: float) -> bool:
    """Take ``run_id`` for ``owner`` if it is queued or abandoned; True when taken."""
    return queue.try_claim(engine, run_id, owner, lease_s, job=TrainRun)


def claim_next(engine: Engine, owner: str, lease_s: float) -> int | None:
    """Claim the oldest claimable run; its id, or None when there is none."""
    return queue.claim_next(engine, owner, lease_s, job=TrainRun)


def heartbeat(engine: Engine, run_id: int, owner: str) -> bool:
    """Renew the lease; False when the run was cancelled or taken over."""
    return queue.heartbeat(engine, run_id, owner, job=TrainRun)


def _steady(times: list[float], warmup: int) -> dict[str, float | None]:
    measured = times[warmup:]
    if not measured:
        return {"step_median_s": None, "step_p20_s": None, "step_p80_s": None}
    p20, median, p80 = np.percentile(measured, [20, 50, 80])
    return {"step_median_s": float(median), "step_p20_s": float(p20), "step_p80_s": float(p80)}


def record(engine: Engine, run_id: int, owner: str, run: RunConfig, outcome: TrainOutcome) -> str:
    """Store a finished run's figures and close it; the status stored, or the row's own if the lease was lost."""
    result: RunResult = outcome.result
    env = outcome.environment
    plan = RecomputePlan.parse(run.recompute)
    figures = dict(
        oom_stage=result.stage if result.status == "oom" else None,
        model=run.model().model_dump(mode="json"), layout=format_layout(run.pipeline_layout()),
        recompute=plan.text, kernels=run.kernels, pp=result.pp, vpp=result.vpp, dp=result.dp,
        microbatches=result.microbatches, step_times_s=result.iteration_times_s, losses=result.losses,
        mtp_losses=result.mtp_losses, tokens_per_s_per_gpu=result.tokens_per_s_per_gpu,
        model_tflops_per_gpu=result.model_tflops_per_gpu,
        stage_memory=[m.model_dump() for m in result.stage_memory],
        versions=env.get("versions"), host=env.get("host"), gpu_name=env.get("gpu_name"),
        kernel_tables=env.get("kernel_tables"), **_steady(result.iteration_times_s, run.warmup_iters))
    status = TrainStatus(result.status)
    if queue.finish(engine, run_id, owner, status, result.message or None, job=TrainRun, **figures):
        return status.value
    return get_run(engine, run_id).status


def finish(engine: Engine, run_id: int, owner: str, status: TrainStatus, error: str) -> bool:
    """Close a run this owner holds without figures (it could not start); False when the lease was lost."""
    return queue.finish(engine, run_id, owner, status, error, job=TrainRun)


def cancel(engine: Engine, run_id: int) -> str:
    """Cancel a queued or running run (a running one stops at its next lease renewal); the status it ends with."""
    return queue.cancel(engine, run_id, job=TrainRun, not_found=TrainRunNotFound)


def get_run(engine: Engine, run_id: int) -> TrainRun:
    return queue.get(engine, run_id, job=TrainRun, not_found=TrainRunNotFound)


def list_runs(engine: Engine) -> list[TrainRun]:
    with session_scope(engine) as session:
        return list(session.scalars(select(TrainRun).order_by(TrainRun.id)).all())

"""Run one ``v4.pipeline.RunConfig`` on ``world`` Ray actors: ``run_training(run, world) -> TrainOutcome``.

In order, and why:
1.-2. place and start the ranks on one node (``workers.rank_group``; one node because the
   pipeline's sends are latency-bound); failing that, the run is ``error`` with the reason;
3. every actor joins the process group (NCCL on CUDA, gloo on CPU) and calls ``v4.pipeline.train``;
4. collect the answers: a rank that dies or raises, or no answer before the deadline, makes the
   run ``error`` with the message; once one rank has failed the others get ``GRACE_S`` to report
   (a peer of an OOM only notices at its next exchange) and are then killed;
5. always kill the actors and remove the placement group (``workers.rank_group``).

The run's result is ``merge_results`` of the ranks' answers (an OOM anywhere wins).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from v4.pipeline import RunConfig, RunResult, merge_results
from workers.pool import FORWARDED_PREFIXES
from workers.rank_group import START_TIMEOUT_S, RankGroupError, rank_group, rendezvous_address

GRACE_S = 15.0
POLL_S = 5.0  # how often the lease is renewed while the run goes on


class RunCancelled(RuntimeError):
    """The run's lease was lost (cancelled or taken over) while it ran; the actors were stopped."""


@dataclass
class TrainOutcome:
    """The merged result and rank 0's description of where it ran (host, GPU, versions, tuned-table hash)."""

    result: RunResult
    environment: dict[str, Any] = field(default_factory=dict)


@ray.remote(max_restarts=0, max_task_retries=0)
class RankActor:
    """One rank of the run: joins the process group, trains, leaves the group."""

    def rendezvous(self) -> tuple[str, int]:
        return rendezvous_address()

    def train(self, run: dict[str, Any], rank: int, world: int, address: str, port: int,
              timeout_s: float) -> dict[str, Any]:
        import torch.distributed as dist

        from kernels.provenance import kernel_tables
        from v4.pipeline import train
        from workers.device_info import describe_device

        config = RunConfig.model_validate(run)
        dist.init_process_group("nccl" if config.device == "cuda" else "gloo", init_method=f"tcp://{address}:{port}",
                                rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
        try:
            result = train(config)
        finally:
            dist.destroy_process_group()
        environment = {**describe_device(), "kernel_tables": kernel_tables(config.kernels)} if rank == 0 else {}
        return {"result": result.model_dump(), "environment": environment}


def _runtime_env(run: RunConfig) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
    if run.device == "cpu" and run.kernels == "triton":
        env["TRITON_INTERPRET"] = "1"
    return {"env_vars": env}


def _failed(run: RunConfig, world: int, message: str) -> RunResult:
    """An ``error`` result for a run that produced none (placement, a dead rank, a timeout)."""
    pp, dp = run.pp, max(world // run.pp, 1)
    return RunResult(status="error", message=message, world=world, pp=pp, vpp=run.pipeline_layout().vpp, dp=dp,
                     microbatches=run.gbs // (run.mbs * dp))


def _get(ref: ray.ObjectRef, timeout_s: float, keep_alive: Callable[[], bool]) -> Any:
    """``ray.get`` with a timeout that keeps calling ``keep_alive`` (the lease) while it waits."""
    deadline = time.monotonic() + timeout_s
    while not ray.wait([ref], timeout=max(min(POLL_S, deadline - time.monotonic()), 0))[0]:
        if not keep_alive():
            raise RunCancelled("the run's lease was lost")
        if time.monotonic() >= deadline:
            raise GetTimeoutError(f"no answer within {timeout_s:.0f} s")
    return ray.get(ref)


def _collect(refs: list[ray.ObjectRef], timeout_s: float,
             keep_alive: Callable[[], bool]) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Every rank's answer or error message, stopping early GRACE_S after a first failure or at the deadline."""
    ranks = {ref: rank for rank, ref in enumerate(refs)}
    answers: dict[int, dict[str, Any]] = {}
    errors: dict[int, str] = {}
    deadline, give_up = time.monotonic() + timeout_s, None
    pending = list(refs)
    while pending:
        now = time.monotonic()
        stop = min(deadline, give_up or deadline)
        if now >= stop:
            for ref in pending:
                errors[ranks[ref]] = ("stopped after a peer failed" if give_up and now >= give_up
                                      else f"no answer within {timeout_s:.0f} s")
            break
        done, pending = ray.wait(pending, num_returns=1, timeout=min(POLL_S, stop - now))
        if not keep_alive():
            raise RunCancelled("the run's lease was lost")
        for ref in done:
            rank = ranks[ref]
            try:
                answers[rank] = ray.get(ref)
            except RayError as exc:
                errors[rank] = f"rank {rank}: {exc}"
            if rank in errors or answers[rank]["result"]["status"] != "ok":
                give_up = give_up or time.monotonic() + GRACE_S
    return answers, errors


def run_training(run: RunConfig, world: int, timeout_s: float = 3600.0,
                 keep_alive: Callable[[], bool] = lambda: True,
                 on_phase: Callable[[str], None] = lambda _: None) -> TrainOutcome:
    """Run ``run`` on ``world`` ranks of the connected Ray cluster; never raises for a failed run.

    ``keep_alive`` is called every few seconds while the run goes on (the caller renews its
    lease there); when it returns False the actors are stopped and ``RunCancelled`` raised.
    ``on_phase`` hears what is happening, for a progress display.
    """
    if world % run.pp:
        raise ValueError(f"world={world} is not a multiple of pp={run.pp}")
    on_phase(f"placing and starting {world} rank(s)")
    try:
        with rank_group(RankActor, world, run.device, _runtime_env(run),
                        wait=lambda ref, timeout_s: _get(ref, timeout_s, keep_alive)) as (actors, address, port):
            on_phase(f"training {run.iters} iteration(s) on {world} {run.device} rank(s)")
            refs = [actor.train.remote(run.model_dump(), rank, world, address, port, timeout_s)
                    for rank, actor in enumerate(actors)]
            answers, errors = _collect(refs, timeout_s + START_TIMEOUT_S, keep_alive)
    except RankGroupError as exc:
        return TrainOutcome(_failed(run, world, str(exc)))
    results = [RunResult.model_validate(a["result"]) for _, a in sorted(answers.items())]
    environment = answers.get(0, {}).get("environment", {})
    merged = merge_results(results) if results else None
    if merged is not None and merged.status != "ok":
        return TrainOutcome(merged, environment)
    if errors:
        return TrainOutcome(_failed(run, world, "\n".join(errors[r] for r in sorted(errors))), environment)
    return TrainOutcome(merged, environment)

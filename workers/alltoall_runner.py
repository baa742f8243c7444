"""Time one MoE layer's EP all-to-all on ``ep`` Ray actors of one node: ``run_alltoall(...) -> AlltoallOutcome``.

The ranks are placed and started as for training runs (``workers.rank_group``), on one node: the
planner takes this time as the intra-node one and models only the share that crosses nodes. Every
actor joins the process group (NCCL on CUDA, gloo on CPU) and runs ``workers.alltoall_cost.time_rank``;
rank 0 also says what device it ran on.

A rank that fails, or no answer before the deadline, raises :class:`AlltoallRunError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from workers.alltoall_cost import AlltoallCost, AlltoallShape, summarize
from workers.pool import FORWARDED_PREFIXES
from workers.rank_group import START_TIMEOUT_S, RankGroupError, rank_group, rendezvous_address


class AlltoallRunError(RuntimeError):
    """The measurement did not complete: placement, a rank's error, or a timeout; the message says which."""


@dataclass
class AlltoallOutcome:
    """The summarized timings and rank 0's device: its kind and memory as the layer profiles key them, versions."""

    cost: AlltoallCost
    gpu_kind: str
    gpu_memory_bytes: int | None
    environment: dict[str, Any] = field(default_factory=dict)


@ray.remote(max_restarts=0, max_task_retries=0)
class AlltoallRank:
    """One EP rank: joins the process group, times its all-to-alls, leaves the group."""

    def rendezvous(self) -> tuple[str, int]:
        return rendezvous_address()

    def measure(self, shape: AlltoallShape, device: str, warmup: int, reps: int, rank: int, address: str, port: int,
                timeout_s: float) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        from workers.alltoall_cost import time_rank
        from workers.device_info import describe_device, gpu_name_and_memory

        if device == "cuda":
            torch.cuda.set_device(0)  # the one GPU Ray gave this actor
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://{address}:{port}",
                                rank=rank, world_size=shape.ep, timeout=timedelta(seconds=timeout_s))
        try:
            times = time_rank(shape, rank, device, warmup, reps)
        finally:
            dist.destroy_process_group()
        answer: dict[str, Any] = {"times": times}
        if rank == 0:
            answer["gpu_kind"], answer["gpu_memory_bytes"] = gpu_name_and_memory(device)
            answer["environment"] = describe_device()
        return answer


def run_alltoall(shape: AlltoallShape, device: str, warmup: int, reps: int,
                 timeout_s: float = 600.0) -> AlltoallOutcome:
    """Time ``shape``'s dispatch and combine on ``shape.ep`` ranks of the connected Ray cluster (see the module doc)."""
    world = shape.ep
    # NCCL_* settings change how the all-to-all travels; the ranks must see the caller's
    env = {k: v for k, v in os.environ.items() if k.startswith((*FORWARDED_PREFIXES, "NCCL_"))}
    try:
        with rank_group(AlltoallRank, world, device, {"env_vars": env}) as (actors, address, port):
            refs = [actor.measure.remote(shape, device, warmup, reps, rank, address, port, timeout_s)
                    for rank, actor in enumerate(actors)]
            try:
                answers = ray.get(refs, timeout=timeout_s + START_TIMEOUT_S)
            except (RayError, GetTimeoutError) as exc:
                raise AlltoallRunError(f"the all-to-all did not complete on {world} {device} rank(s): {exc}") from None
    except RankGroupError as exc:
        raise AlltoallRunError(str(exc)) from None
    first = answers[0]
    return AlltoallOutcome(summarize(shape, [a["times"] for a in answers]), first["gpu_kind"],
                           first["gpu_memory_bytes"], first["environment"])

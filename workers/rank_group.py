"""The ranks of a Ray-dispatched torch.distributed group on one node: placement, actors, rendezvous.

Training runs (``workers.train_runner``) and all-to-all measurements (``workers.alltoall_runner``)
start their ranks the same way:

1. reserve a placement group of ``world`` bundles (one GPU each on CUDA, one CPU otherwise),
   STRICT_PACK, so that every rank is on one node; wait with a timeout (a request the cluster
   cannot place is an error, not a hang);
2. start one actor per bundle; rank 0's address and a free port on it are the rendezvous;
3. always kill the actors and remove the placement group afterwards.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PLACEMENT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 300.0  # an actor's first start imports torch

Wait = Callable[[ray.ObjectRef, float], Any]


class RankGroupError(RuntimeError):
    """The ranks could not be placed or started; the message says which."""


def rendezvous_address() -> tuple[str, int]:
    """This node's address as Ray sees it and a port free on it now, for the group's TCP store."""
    address = ray.util.get_node_ip_address()
    with socket.socket() as sock:
        sock.bind((address, 0))
        return address, sock.getsockname()[1]


def _ray_get(ref: ray.ObjectRef, timeout_s: float) -> Any:
    return ray.get(ref, timeout=timeout_s)


@contextmanager
def rank_group(actor_class: Any, world: int, device: str, runtime_env: dict[str, Any],
               wait: Wait = _ray_get) -> Iterator[tuple[list[Any], str, int]]:
    """``(actors, address, port)`` of ``world`` started ranks of ``actor_class`` (which must have a
    ``rendezvous`` method returning :func:`rendezvous_address`); ``wait(ref, timeout_s)`` waits for
    the placement and the first actor (the training runner's keeps renewing its lease)."""
    bundle = {"GPU": 1} if device == "cuda" else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(world)], strategy="STRICT_PACK")
    actors: list[Any] = []
    try:
        try:
            wait(group.ready(), PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            raise RankGroupError(f"cannot place {world} bundles of {bundle} on one node within "
                                 f"{PLACEMENT_TIMEOUT_S:.0f} s; cluster has {ray.cluster_resources()}") from None
        options = dict(num_gpus=1, num_cpus=0) if device == "cuda" else dict(num_cpus=1)
        actors = [actor_class.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
            runtime_env=runtime_env, **options).remote() for rank in range(world)]
        try:
            address, port = wait(actors[0].rendezvous.remote(), START_TIMEOUT_S)
        except (RayError, GetTimeoutError) as exc:
            raise RankGroupError(f"rank 0 did not start: {exc}") from None
        yield actors, address, port
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)

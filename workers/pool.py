"""Start the Ray workers of a sweep: one device worker per GPU, CPU slots for compiling.

With an address (or ``RAY_ADDRESS``) the pool joins that cluster; without one it joins the Ray
already running on this machine (``ray start``) when its head answers, else starts a local one.
On a cluster without GPUs the workers run the kernels on the CPU under ``TRITON_INTERPRET=1`` and
nothing is compiled ahead.

Start-up is what a one-shot ``tuner sweep run`` pays before its first trial, so the pool waits
only for what a trial needs: the device workers (their benchmarking children import torch and
open the GPU) start together, and the compile workers warm up (import the kernels) beside them
and beside the first trials, not before them. (Warming them only once the device workers were up
left the device workers' start as slow and slowed the first trials: ``docs/findings.md``.) A Ray
the pool starts itself prestarts no idle workers: the pool's tasks carry a runtime env, so such
workers would go unused. ``timings`` says where the seconds went.
Ray and the workers' modules are imported by ``start``: importing this module (``PoolError``)
costs nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

# Variables the workers need to see as the driver sees them.
FORWARDED_PREFIXES = ("TUNER_", "TRITON_", "PYTHONPATH", "CUDA_LAUNCH_BLOCKING")
START_TIMEOUT_S = 300.0
# Compiling one config takes well under a second, so a few workers out-compile any GPU;
# starting one per core only slows the pool's start (each imports torch and opens CUDA).
MAX_COMPILE_WORKERS = 16
LIVE_HEAD_TIMEOUT_S = 1.0
# Ray's raylet prestarts one idle worker a CPU for the first driver unless this is "0".
NO_PRESTART = "RAY_prestart_worker_first_driver"


class PoolError(RuntimeError):
    """The workers could not be started or disagree on what they run on."""


def _worker_env(interpret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    # Compile tasks ask for no GPU but must see the host's GPUs to know Triton's target.
    env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    return env


def running_local_ray() -> str | None:
    """The address of the Ray head this machine runs (``ray start --head``), when it answers; else None.

    Ray finds that head through the address file it writes in its temp dir, which outlives a head
    that was killed: ``ray.init`` would then wait minutes on a dead address. A head is taken as
    running when its GCS port accepts a connection.
    """
    from ray._private.utils import read_ray_address

    address = read_ray_address()
    if not address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=LIVE_HEAD_TIMEOUT_S):
            return address
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _no_prestarted_workers() -> Iterator[None]:
    """The environment a Ray started here inherits says: prestart no idle workers."""
    saved = os.environ.get(NO_PRESTART)
    os.environ[NO_PRESTART] = "0"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[NO_PRESTART]
        else:
            os.environ[NO_PRESTART] = saved


@dataclass
class WorkerPool:
    """The device workers of one server, with what each reported about itself."""

    workers: list[Any]
    infos: list[dict[str, Any]]
    compile_ahead: bool
    compile_slots: int
    runtime_env: dict[str, Any]  # what every task of the pool runs with, compile tasks included
    started_ray: bool = field(default=False)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per start-up step
    warming: list[Any] = field(default_factory=list)  # the compile workers' warm-ups, still running

    @classmethod
    def start(cls, ray_address: str | None = None, cpu_workers: int = 1, num_cpus: int | None = None) -> WorkerPool:
        """Connect to (or start) Ray and start one device worker per GPU, or ``cpu_workers``."""
        began = time.perf_counter()
        import ray

        from workers.compile_task import warm_up
        from workers.device_worker import DeviceWorker

        timings = {"import_s": time.perf_counter() - began}
        address = ray_address or os.environ.get("RAY_ADDRESS")
        started = not ray.is_initialized()
        if started:
            if address:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            elif not num_cpus and running_local_ray():  # a given CPU count asks for a Ray of this process's own
                ray.init(address="auto", log_to_driver=False, logging_level=logging.WARNING)
            else:
                with _no_prestarted_workers():
                    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                             log_to_driver=False, logging_level=logging.WARNING)  # the commands say what they run on
        timings["ray_s"] = time.perf_counter() - began - timings["import_s"]
        gpus = int(ray.cluster_resources().get("GPU", 0))
        interpret = gpus == 0
        env = _worker_env(interpret)
        options = {"runtime_env": {"env_vars": env}}
        if interpret:
            actors = [DeviceWorker.options(num_cpus=1, **options).remote(env) for _ in range(cpu_workers)]
        else:
            actors = [DeviceWorker.options(num_gpus=1, num_cpus=0, **options).remote(env) for _ in range(gpus)]
        cpus = int(ray.cluster_resources().get("CPU", 1))
        compile_slots = max(min(cpus - (len(actors) if interpret else 0), MAX_COMPILE_WORKERS), 1)
        warming = [] if interpret else [warm_up.options(**options).remote() for _ in range(compile_slots)]
        try:  # compile workers warm up while the device workers' children import torch, and after
            infos = ray.get([a.describe.remote() for a in actors], timeout=START_TIMEOUT_S)
        except Exception as exc:
            for actor in actors:
                ray.kill(actor)
            if started:
                ray.shutdown()
            raise PoolError(f"device workers failed to start: {exc}") from None
        timings["workers_s"] = time.perf_counter() - began - timings["import_s"] - timings["ray_s"]
        pool = cls(actors, infos, compile_ahead=not interpret, compile_slots=compile_slots,
                   runtime_env=options["runtime_env"], started_ray=started, timings=timings, warming=warming)
        pool.arch  # noqa: B018 - fail early on a mixed pool
        return pool

    @property
    def arch(self) -> str:
        archs = {i["arch"] for i in self.infos}
        if len(archs) != 1:
            raise PoolError(f"workers run on several archs {sorted(archs)}; give each arch its own cluster")
        return archs.pop()

    @property
    def toolchain(self) -> dict[str, Any]:
        versions = {tuple(sorted(i["versions"].items())) for i in self.infos}
        if len(versions) != 1:
            raise PoolError(f"workers run different toolchains: {sorted(versions)}")
        return dict(versions.pop())

    def shutdown(self) -> None:
        import ray

        for actor in self.workers:
            ray.kill(actor)
        if self.started_ray:
            ray.shutdown()

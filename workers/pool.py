"""Start the Ray workers of a sweep: one device worker per GPU, CPU slots for compiling.

With an address (or ``RAY_ADDRESS``) the pool joins that cluster; without one it joins the Ray
already running on this machine (``ray start``) when its head answers, else starts a local one.
On a cluster without GPUs the workers run the kernels on the CPU under ``TRITON_INTERPRET=1`` and
nothing is compiled ahead.

Start-up is what a one-shot ``tuner sweep run`` pays before its first trial, so the pool waits
only for what a trial needs: the device workers' benchmarking children (which import torch and
open the GPU) start before Ray is started or this machine's is joined (``PrewarmedChildren``), the device
workers start together and adopt them, and the compile workers warm up (import the kernels)
beside them and beside the first trials, not before them. (Warming them only once the device workers were up
left the device workers' start as slow and slowed the first trials: ``docs/findings.md``.) On a GPU
host a few local compile processes start before Ray too (``workers.local_compilers``): Ray's compile
workers are ready seconds after the first trial, and until then these compile its configs. A Ray
the pool starts itself prestarts no idle workers: the pool's tasks carry a runtime env, so such
workers would go unused. ``timings`` says where the seconds went.
Ray and the workers' modules are imported by ``start``: importing this module (``PoolError``)
costs nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.local_compilers import LocalCompilers, local_compiler_count

# Variables the workers need to see as the driver sees them.
FORWARDED_PREFIXES = ("TUNER_", "TRITON_", "PYTHONPATH", "CUDA_LAUNCH_BLOCKING")
START_TIMEOUT_S = 300.0
# Compiling one config takes well under a second, so a few workers out-compile any GPU;
# starting one per core only slows the pool's start (each imports torch and opens CUDA).
MAX_COMPILE_WORKERS = 16
LIVE_HEAD_TIMEOUT_S = 1.0
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
PREWARM_PREFIX = "tuner-prewarm-"  # + the pool's pid: a folder whose pool is gone is removed
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


def _local_gpu_ids() -> list[str]:
    """The GPUs a Ray started here finds, by the ids it gives them: ``CUDA_VISIBLE_DEVICES``'s entries,
    else one per NVIDIA device the driver lists in /proc (none elsewhere: then nothing is pre-warmed
    for GPUs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [device.strip() for device in visible.split(",") if device.strip()]
    try:
        return [str(i) for i in range(len(os.listdir(NVIDIA_GPUS)))]
    except OSError:
        return []


def _remove_dead_pools_folders() -> None:
    """Remove the pre-warm folders of pools whose process is gone (a killed server leaves its own)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREWARM_PREFIX}*-*"):
        try:
            os.kill(int(folder.name[len(PREWARM_PREFIX):].split("-")[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):
            continue  # not a pool's folder, or another user's pool


@dataclass
class PrewarmedChildren:
    """Benchmarking children started before the pool's own Ray, one per device worker it expects
    (``workers.prewarmed_child``): their imports overlap Ray's start, and each device worker adopts
    the one of its device. The pool ends those nobody adopted once the workers are up, and the rest
    at its shutdown."""

    folder: str
    children: dict[str, subprocess.Popen]  # socket path -> child
    gpu_socket: str | None  # the GPU children's socket path, ``{gpu}`` standing for the device id

    @classmethod
    def start(cls, cpu_workers: int, problem: dict[str, Any] | None = None) -> PrewarmedChildren:
        """One child per local GPU, else ``cpu_workers`` interpreter children; each prepares ``problem``."""
        from workers.prewarmed_child import spawn

        _remove_dead_pools_folders()
        folder = tempfile.mkdtemp(prefix=f"{PREWARM_PREFIX}{os.getpid()}-")
        gpu_ids = _local_gpu_ids()
        if gpu_ids:
            template = os.path.join(folder, "gpu-{gpu}.sock")
            paths = {template.format(gpu=g): {**os.environ, **_worker_env(False), "CUDA_VISIBLE_DEVICES": g}
                     for g in gpu_ids}
        else:
            template = None
            paths = {os.path.join(folder, f"cpu-{i}.sock"): {**os.environ, **_worker_env(True)}
                     for i in range(cpu_workers)}
        return cls(folder, {path: spawn(path, env, problem) for path, env in paths.items()}, template)

    def socket_of(self, interpret: bool, index: int) -> str | None:
        """The socket a device worker adopts its child from: the GPU template for GPU workers, the
        ``index``-th CPU child's for interpreter workers; None when no such child was started."""
        if not interpret:
            return self.gpu_socket
        path = os.path.join(self.folder, f"cpu-{index}.sock")
        return path if path in self.children else None

    def drop_unadopted(self) -> None:
        """End the children no worker adopted (an adopted child removes its socket)."""
        self._end([path for path in self.children if os.path.exists(path)])

    def close(self) -> None:
        self._end(list(self.children))
        shutil.rmtree(self.folder, ignore_errors=True)

    def _end(self, paths: list[str]) -> None:
        children = [self.children.pop(path) for path in paths]
        for child in children:  # all signalled first: their GPU contexts are torn down side by side
            child.kill()
        for child in children:
            child.wait()


def _milestones(infos: list[dict[str, Any]], began_wall: float) -> dict[str, float]:
    """Seconds after ``began_wall`` at which the last actor started and the last adopted child was ready, and
    the longest an adopted child spent importing, opening its device and preparing the sweep's first problem
    (the parts of its readiness)."""
    out = {}
    for key, name in (("actor_started_at", "actors_started_s"), ("child_ready_at", "children_ready_s")):
        stamps = [info[key] for info in infos if info.get(key) is not None]
        if stamps:
            out[name] = max(stamps) - began_wall
    prepared = [info["child_prepared"]["seconds"] for info in infos if "seconds" in (info.get("child_prepared") or {})]
    if prepared:
        out["first_problem_prepared_s"] = max(prepared)
    for phase in ("import", "device"):
        spent = [info["child_phases_s"][phase] for info in infos if phase in (info.get("child_phases_s") or {})]
        if spent:
            out[f"child_{phase}_s"] = max(spent)
    return out


def _stop_autoscaler_monitor() -> None:
    """Kill the autoscaler monitor of the Ray this process started. ``ray.shutdown`` stops its head's
    processes one by one, each given a second to exit on SIGTERM, and the monitor always takes the whole
    second (1.0 of the shutdown's 1.3 s on the CPU machine). A one-host Ray of the pool's own has nothing
    for it to scale and nothing of it to keep. Reached through Ray's private node handle; a Ray without
    one is left to its own shutdown."""
    from ray._private import ray_constants, worker

    node = getattr(worker, "_global_node", None)
    for info in getattr(node, "all_processes", {}).get(ray_constants.PROCESS_TYPE_MONITOR, []):
        info.process.kill()
        info.process.wait()


@dataclass
class WorkerPool:
    """The device workers of one server, with what each reported about itself."""

    workers: list[Any]
    infos: list[dict[str, Any]]
    compile_ahead: bool
    compile_slots: int
    runtime_env: dict[str, Any]  # what every task of the pool runs with, compile tasks included
    started_ray: bool = field(default=False)  # connected by ``start`` (and so disconnected by ``shutdown``)
    own_ray: bool = field(default=False)  # a Ray of this process's own, not one it joined
    timings: dict[str, float] = field(default_factory=dict)  # seconds per start-up step
    warming: list[Any] = field(default_factory=list)  # the compile workers' warm-ups, still running
    prewarmed: PrewarmedChildren | None = None
    local_compilers: LocalCompilers | None = None  # this host's compile processes, started before Ray
    # seconds from the start's beginning to the last device worker's actor starting and to the last
    # adopted child being ready: which of the two the workers' step waited on
    milestones: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default=0.0)  # the wall clock when the start began, which the milestones count from

    @classmethod
    def start(cls, ray_address: str | None = None, cpu_workers: int = 1, num_cpus: int | None = None,
              first_problem: dict[str, Any] | None = None) -> WorkerPool:
        """Connect to (or start) Ray and start one device worker per GPU, or ``cpu_workers``. ``first_problem``
        (kernel, shape, seed: a one-shot sweep's first) is prepared by the pre-warmed children while Ray and
        the workers start (``bench_child.prepare``)."""
        began, began_wall = time.perf_counter(), time.time()
        address = ray_address or os.environ.get("RAY_ADDRESS")
        started = "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
        # this machine's workers' children first, even before Ray's import, their own imports being the
        # longest: for a Ray of our own or this machine's head (a worker placed on another node finds
        # no child to adopt and starts its own)
        prewarmed = PrewarmedChildren.start(cpu_workers, first_problem) if started and not address else None
        # and, on a GPU host, compile processes, ready seconds before Ray's compile workers could be
        local = (LocalCompilers.start(local_compiler_count(), {**os.environ, **_worker_env(False)}, first_problem)
                 if prewarmed is not None and prewarmed.gpu_socket is not None else None)
        import ray

        # a given CPU count asks for a Ray of this process's own
        own_ray = started and not address and (bool(num_cpus) or not running_local_ray())
        timings = {"import_s": time.perf_counter() - began}
        if started:
            if address:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            elif not own_ray:
                ray.init(address="auto", log_to_driver=False, logging_level=logging.WARNING)
            else:
                with _no_prestarted_workers():
                    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                             log_to_driver=False, logging_level=logging.WARNING)  # the commands say what they run on
        timings["ray_s"] = time.perf_counter() - began - timings["import_s"]
        from workers.compile_task import warm_up  # light: the tasks import torch and the kernels, not the driver
        from workers.device_worker import DeviceWorker

        gpus = int(ray.cluster_resources().get("GPU", 0))
        interpret = gpus == 0
        if interpret and local is not None:  # Ray found no GPU after all: nothing to compile ahead
            local.close()
            local = None
        env = _worker_env(interpret)
        options = {"runtime_env": {"env_vars": env}}
        adopt = prewarmed.socket_of if prewarmed is not None else lambda _interpret, _index: None
        if interpret:
            actors = [DeviceWorker.options(num_cpus=1, **options).remote(env, adopt(True, i))
                      for i in range(cpu_workers)]
        else:
            actors = [DeviceWorker.options(num_gpus=1, num_cpus=0, **options).remote(env, adopt(False, i))
                      for i in range(gpus)]
        cpus = int(ray.cluster_resources().get("CPU", 1))
        # one compile process a core in all: the local ones count against Ray's compile slots
        busy = len(actors) if interpret else (local.count if local is not None else 0)
        compile_slots = max(min(cpus - busy, MAX_COMPILE_WORKERS), 1)
        warming = [] if interpret else [warm_up.options(**options).remote() for _ in range(compile_slots)]
        try:  # compile workers warm up while the device workers' children import torch, and after
            infos = ray.get([a.describe.remote() for a in actors], timeout=START_TIMEOUT_S)
        except Exception as exc:
            for actor in actors:
                ray.kill(actor)
            if started:
                ray.shutdown()
            if prewarmed is not None:
                prewarmed.close()
            if local is not None:
                local.close()
            raise PoolError(f"device workers failed to start: {exc}") from None
        if prewarmed is not None:
            prewarmed.drop_unadopted()
        timings["workers_s"] = time.perf_counter() - began - timings["import_s"] - timings["ray_s"]
        pool = cls(actors, infos, compile_ahead=not interpret, compile_slots=compile_slots,
                   runtime_env=options["runtime_env"], started_ray=started, own_ray=own_ray, timings=timings,
                   warming=warming, prewarmed=prewarmed, local_compilers=local,
                   milestones=_milestones(infos, began_wall), started_at=began_wall)
        pool.arch  # noqa: B018 - fail early on a mixed pool
        return pool

    def note_compile_workers_ready(self, timeout_s: float = 60.0) -> None:
        """Wait for the compile workers' warm-ups and add ``compile_workers_ready_s`` to the milestones: when
        the last was ready, counted from the start's beginning (and ``local_compilers_ready_s``, when the
        last local compile process the sweep heard from was). Until then a sweep's benchmarking child
        compiles its configs itself; a benchmark calls this after its sweep, the sweep itself never waits."""
        import ray

        if self.warming:
            ready = ray.get(self.warming, timeout=timeout_s)
            self.milestones["compile_workers_ready_s"] = max(ready) - self.started_at
        if self.local_compilers is not None and self.local_compilers.ready_times:
            self.milestones["local_compilers_ready_s"] = max(self.local_compilers.ready_times) - self.started_at

    @property
    def compile_processes(self) -> int:
        """The processes that compile ahead: Ray's compile slots and this host's local compile processes."""
        return self.compile_slots + (self.local_compilers.count if self.local_compilers is not None else 0)

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

        if self.local_compilers is not None:
            self.local_compilers.kill_all()  # they end while Ray shuts down; reaped below
        for actor in self.workers:
            ray.kill(actor)
        if self.own_ray:
            _stop_autoscaler_monitor()
        if self.started_ray:
            ray.shutdown()
        if self.prewarmed is not None:
            self.prewarmed.close()
        self.prewarmed = None
        if self.local_compilers is not None:
            self.local_compilers.close()
        self.local_compilers = None

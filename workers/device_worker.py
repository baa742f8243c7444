"""The Ray actor that owns one GPU (or, without GPUs, one CPU running the interpreter).

The actor itself never touches the device: it forwards each request to its benchmarking
child process, so a faulting config kills the child and the actor carries on. Every answer
names the Ray node that gave it: after a node dies, Ray restarts the actor elsewhere.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from workers.child_process import BenchProcess

DESCRIBE_TIMEOUT_S = 300.0  # first start of a child imports torch and triton


@ray.remote(max_restarts=-1, max_task_retries=0)
class DeviceWorker:
    """Runs trials and re-timings for the sweep runner on this actor's device."""

    def __init__(self, env: dict[str, str], prewarmed: str | None = None) -> None:
        """``prewarmed``: the socket of a pre-warmed child to adopt (``workers.prewarmed_child``); a
        ``{gpu}`` in it stands for the GPU Ray gave this actor."""
        self._started_at = time.time()  # the pool reports its start against its adopted child's
        if prewarmed is not None and "{gpu}" in prewarmed:
            gpus = ray.get_gpu_ids()
            prewarmed = prewarmed.format(gpu=gpus[0]) if len(gpus) == 1 else None
        self._bench = BenchProcess(env, adopt_from=prewarmed)
        self._node = ray.get_runtime_context().get_node_id()

    def describe(self) -> dict[str, Any]:
        info = self._bench.request({"op": "describe"}, DESCRIBE_TIMEOUT_S)
        if "arch" not in info:
            raise RuntimeError(f"benchmark process failed to start: {info.get('error')}")
        return {**info, "node": self._node, "adopted": self._bench.adopted, "actor_started_at": self._started_at,
                "child_ready_at": self._bench.child_ready_at, "child_prepared": self._bench.child_prepared,
                "child_phases_s": self._bench.child_phases_s}

    def run_trial(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        return {**self._bench.request({"op": "trial", **request}, timeout_s), "node": self._node}

    def retime(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        return self._bench.request({"op": "retime", **request}, timeout_s)

    def restarts(self) -> int:
        return self._bench.restarts

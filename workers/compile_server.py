"""A local compile process of a worker pool, started before Ray so that its imports overlap Ray's start.

The Ray tasks that compile a sweep's configs ahead of its benchmarking child (``workers.compile_task``) can
only start once Ray is up, in worker processes Ray starts then, which import torch, Triton and the kernels
and open the GPU after that: on one H100 they were ready 7.9 s after the pool's start began, 3.2 s after
its device worker, and until then the child compiled every config itself (docs/findings.md). A pool that
starts its own Ray therefore also starts a few of these processes first (``workers.local_compilers``).

``python -m workers.compile_server POOL_PID [PROBLEM]``: imports the kernels and opens the GPU, with
``PROBLEM`` (JSON: the sweep's first kernel and shape) compiles that kernel's heuristic default there, writes
one JSON line ``{"ready_at": <wall clock>}``, then answers each JSON line ``{"kernel", "shape", "config"}`` on stdin
with one line, ``workers.compiler.compile_one``'s result plus the seconds it took. It ends at the end of
its input or when the pool's process dies.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from workers.errors import error_text
from workers.parent_watch import exit_with_parent

NICENESS = 5  # added to the pool's priority: the benchmarking child, at the pool's own, comes first


def serve(parent: int, problem: dict[str, Any] | None = None) -> None:
    """Warm up, then compile what stdin asks, one request at a time. A process's first compile costs
    seconds of Triton's own set-up (hashing its sources, loading its backend, the kernel's dependencies):
    compiling ``problem``'s default pays them before the sweep asks, and puts the config a sweep measures
    first into the cache."""
    exit_with_parent(parent)
    # The pool's benchmarking child starts beside these processes and is what the sweep waits for: they
    # yield it the cores (a lower priority) and keep to one thread each, as Ray's compile workers do (a
    # compile's CPU work is Triton's, single-threaded). With eight of them at torch's default, a thread a
    # core each while they drew their first problem's inputs, the child was ready 1.6 s later than without
    # them (H100, 16 cores: 6.1 against 4.5 s into the pool's start).
    os.nice(NICENESS)  # and OMP_NUM_THREADS=1 from ``LocalCompilers.start``, read by torch's import
    # the answers keep stdout to themselves: whatever the libraries print (a compiler's warnings) goes to stderr
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch

    from kernels import registry
    from kernels.arch import kernel_device
    from workers.compiler import compile_one

    torch.set_num_threads(1)
    registry.names()
    if torch.cuda.is_available():
        torch.empty(1, device=kernel_device())  # the device context, which a compile's inputs need
    if problem is not None:
        try:
            default = registry.get(problem["kernel"]).default_config(problem["shape"])
            compile_one(problem["kernel"], problem["shape"], default)
        except Exception:  # noqa: BLE001, S110 - the sweep's own compiles meet and report what failed here
            pass
    print(json.dumps({"ready_at": time.time()}), file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        began = time.perf_counter()
        try:
            result = compile_one(request["kernel"], request["shape"], request["config"])
        except Exception as exc:  # noqa: BLE001 - a request this process cannot serve is answered, not fatal
            result = {"status": "compile_error", "error": error_text(exc)}
        print(json.dumps({**result, "seconds": time.perf_counter() - began}), file=answers, flush=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]), json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)

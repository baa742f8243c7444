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


def serve(parent: int, problem: dict[str, Any] | None = None) -> None:
    """Warm up, then compile what stdin asks, one request at a time. A process's first compile costs
    seconds of Triton's own set-up (hashing its sources, loading its backend, the kernel's dependencies):
    compiling ``problem``'s default pays them before the sweep asks, and puts the config a sweep measures
    first into the cache."""
    exit_with_parent(parent)
    # the answers keep stdout to themselves: whatever the libraries print (a compiler's warnings) goes to stderr
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch

    from kernels import registry
    from kernels.arch import kernel_device
    from workers.compiler import compile_one

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

"""A benchmarking child started before its worker exists, so its imports overlap Ray's start.

``tuner sweep run`` on one host pays, one after the other, Ray's start and then each device
worker's child importing torch, Triton and the kernels and opening the GPU (about 6 s each on an
H100 host). A pool that starts its own Ray therefore starts these children first, one per device
it will have (``python -m workers.prewarmed_child SOCKET POOL_PID``): each binds ``SOCKET`` at
once, imports ``workers.bench_child`` and opens its GPU while Ray comes up, accepts one connection
(its device worker's), says its pid and when its start was done, and from then on is an ordinary ``bench_child`` whose stdin
and answers are that connection. It unlinks ``SOCKET`` on accepting (a restarted worker finds nothing to adopt and
starts its own child), ends when the connection closes or its parent (the pool's process) dies,
and gives up when nobody connects within ``ACCEPT_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from workers.parent_watch import exit_with_parent

ACCEPT_TIMEOUT_S = 300.0


def stderr_path(socket_path: str) -> str:
    """Where the child at ``socket_path`` writes its stderr (its adopter reads a fault's tail there)."""
    return socket_path + ".stderr"


def spawn(socket_path: str, env: dict[str, str], problem: dict[str, Any] | None = None) -> subprocess.Popen:
    """Start a pre-warmed child that will listen at ``socket_path``, with ``env`` as its whole environment;
    with ``problem`` (kernel, shape, seed), it also prepares that problem (``bench_child.prepare``)."""
    argv = [sys.executable, "-m", "workers.prewarmed_child", socket_path, str(os.getpid())]
    with open(stderr_path(socket_path), "w") as stderr:
        return subprocess.Popen([*argv, json.dumps(problem)] if problem else argv,
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)


def _open_device(torch: Any, opened: list[float]) -> None:
    """Create the CUDA context where there is a GPU, and note when it was done in ``opened``."""
    if torch.cuda.is_available():
        with contextlib.suppress(RuntimeError):  # a device that fails here fails the worker's describe, by name
            torch.empty(1, device="cuda")
    opened.append(time.perf_counter())


def serve(path: str, parent: int, problem: dict[str, Any] | None = None) -> None:
    """Listen at ``path``, import and open the device (and prepare ``problem``: the sweep's first, built in
    the seconds before its worker comes), then serve the first worker that connects."""
    exit_with_parent(parent)  # a pool killed during its start leaves no child waiting for an adopter
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    began = time.perf_counter()
    from workers import bench_child  # the seconds this process exists to spend early

    imported = time.perf_counter()
    opened = [imported]
    # The device context (the rest of a child's start) opens in a thread while the problem's inputs are drawn
    # on the CPU here: both release the GIL, and the inputs' move to the device waits for the context.
    opening = threading.Thread(target=_open_device, args=(bench_child.torch, opened), daemon=True)
    opening.start()
    prepared = bench_child.prepare(problem) if problem else None
    opening.join()
    ready_at = time.time()  # told to the adopter: the pool reports how long its workers waited on this
    phases = {"import": imported - began, "device": opened[-1] - imported}  # the preparation's are in ``prepared``

    listener.settimeout(ACCEPT_TIMEOUT_S)
    try:
        conn, _ = listener.accept()
    except socket.timeout:
        return
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener.close()
    conn.setblocking(True)
    conn.sendall((json.dumps({"pid": os.getpid(), "ready_at": ready_at, "prepared": prepared, "phases_s": phases})
                  + "\n").encode())
    os.dup2(conn.fileno(), sys.stdin.fileno())
    os.dup2(conn.fileno(), sys.stdout.fileno())
    conn.close()
    bench_child.main()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)

"""A pool's local compile processes, forked from one process that imported torch, Triton and the kernels once.

The Ray tasks that compile a sweep's configs ahead of its benchmarking child (``workers.compile_task``) can
only start once Ray is up, in worker processes Ray starts then, which import torch, Triton and the kernels
and open the GPU after that: on one H100 they were ready 7.9 s after the pool's start began, 3.2 s after
its device worker, and until then the child compiled every config itself (docs/findings.md). A pool that
starts its own Ray therefore also starts these processes first (``workers.local_compilers``).

Eight processes that each imported torch on their own paid the same imports eight times while Ray and
the benchmarking child started beside them, and were ready 7.3 s into the pool's start on a 16-core H100
host (docs/findings.md). So one process, the zygote, imports once and forks the compile
processes, before anything opens the GPU (a CUDA context does not survive a fork): each child opens its
own.

Fourteen children that each opened a CUDA context at once made the benchmarking child's own take 1.91 s
to open, against 0.35 s beside none (one H100 host). So on an NVIDIA host the zygote compiles offline
(``kernels.offline``): for the arch ``nvidia-smi`` names, inputs on the host, no GPU context anywhere; and
it compiles the sweep's first config before it forks, so that Triton's own set-up is paid once and every
child is ready the moment it exists. Where ``nvidia-smi`` names no single arch (an AMD host, mixed GPUs),
each child opens the GPU and warms up itself, as before.

``python -m workers.compile_server POOL_PID CHANNELS [PROBLEM]``: ``CHANNELS`` is a JSON list of
``[request_fd, answer_fd]`` pairs, one per compile process, inherited from the pool. The zygote forks a
child per pair and then only reaps its children: it ends with the pool, and they with it; on SIGTERM it
ends them all at once. ``PROBLEM`` (JSON: the sweep's first kernel and shape) is what the warm-up compiles:
that kernel's heuristic default. Each child, once warm, writes ``{"ready_at": <wall clock>, "pid": <its
pid>, "offline_arch": <the arch, or null on the GPU>}``, then answers each JSON line ``{"kernel", "shape",
"config"}`` of its request pipe with one line, ``workers.compiler.compile_one``'s result plus the seconds
it took. It ends at the end of its requests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from typing import Any

from workers.errors import error_text
from workers.parent_watch import exit_with_parent

NICENESS = 5  # added to the pool's priority: the benchmarking child, at the pool's own, comes first
ARCH_QUERY = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]  # opens no CUDA context


def zygote(parent: int, channels: list[tuple[int, int]], problem: dict[str, Any] | None = None) -> None:
    """Import what a compile needs, once, then fork one compile process per channel and reap them."""
    # The pool's benchmarking child starts beside these processes and is what the sweep waits for: they
    # yield it the cores (a lower priority) and keep to one thread each, as Ray's compile workers do (a
    # compile's CPU work is Triton's, single-threaded). With eight of them at torch's default, a thread a
    # core each while they drew their first problem's inputs, the child was ready 1.6 s later than without
    # them (H100, 16 cores: 6.1 against 4.5 s into the pool's start).
    os.nice(NICENESS)  # inherited by the children, as OMP_NUM_THREADS=1 from ``LocalCompilers.start`` is
    os.dup2(2, 1)  # whatever the libraries print (a compiler's warnings) goes to stderr, never to an answer pipe
    sys.stdout = sys.stderr
    arch_query = _start_arch_query()  # beside the imports
    import torch

    from kernels import registry

    torch.set_num_threads(1)
    registry.names()
    arch = _queried_arch(arch_query)
    if arch is not None:
        from kernels.offline import compile_for

        compile_for(arch)
        _warm_up(problem)
    children: list[int] = []
    stopping = False

    def stop(_signum: int, _frame: Any) -> None:
        """The pool's ``LocalCompilers.kill_all``: every child ends now, mid-compile or not."""
        nonlocal stopping
        stopping = True
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    # no thread runs here until every child is forked: only the forking thread survives a fork
    for index, (requests, answers) in enumerate(channels):
        if stopping:
            break
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            for later_requests, later_answers in channels[index + 1:]:  # the pool's to hand to the next children
                os.close(later_requests)
                os.close(later_answers)
            try:
                serve(requests, answers, None if arch is not None else problem)
            except BaseException:  # noqa: BLE001 - said on stderr; the pool meets the end of its answers
                traceback.print_exc()
                os._exit(1)
            os._exit(0)  # not the zygote's loop, nor its interpreter's exit
        children.append(pid)
        os.close(requests)
        os.close(answers)
    exit_with_parent(parent)  # and the children with this process (``serve``)
    while True:
        try:
            os.wait()
        except ChildProcessError:  # every child has ended
            return


def _start_arch_query() -> subprocess.Popen | None:
    """Ask ``nvidia-smi`` for the GPUs' compute capabilities; None where it is not installed."""
    try:
        return subprocess.Popen(ARCH_QUERY, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def _queried_arch(query: subprocess.Popen | None) -> str | None:
    """``sm_90`` where every GPU ``nvidia-smi`` lists has compute capability 9.0; None where it failed,
    listed none, or listed several."""
    if query is None:
        return None
    try:
        listed, _ = query.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        query.kill()
        query.wait()
        return None
    capabilities = set(listed.split())
    if query.returncode or len(capabilities) != 1:
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)", capabilities.pop())
    return f"sm_{match.group(1)}{match.group(2)}" if match else None


def _warm_up(problem: dict[str, Any] | None) -> None:
    """Compile ``problem``'s heuristic default. A process's first compile costs seconds of Triton's own set-up
    (hashing its sources, loading its backend, the kernel's dependencies): this pays them before the sweep
    asks, and puts the config a sweep measures first into the cache."""
    from kernels import registry
    from workers.compiler import compile_one

    if problem is None:
        return
    try:
        default = registry.get(problem["kernel"]).default_config(problem["shape"])
        compile_one(problem["kernel"], problem["shape"], default)
    except Exception:  # noqa: BLE001, S110 - the sweep's own compiles meet and report what failed here
        pass


def serve(requests_fd: int, answers_fd: int, problem: dict[str, Any] | None = None) -> None:
    """Warm up (open the GPU where this process compiles on it, and compile ``problem``'s default), then
    compile what the request pipe asks, one request at a time."""
    exit_with_parent()  # the zygote, which ends with the pool
    import torch

    from kernels.arch import kernel_device, offline_arch
    from workers.compiler import compile_one

    answers = os.fdopen(answers_fd, "w", buffering=1)
    if kernel_device().type == "cuda":
        torch.empty(1, device=kernel_device())  # the device context, which a compile's inputs need
    _warm_up(problem)
    print(json.dumps({"ready_at": time.time(), "pid": os.getpid(), "offline_arch": offline_arch()}),
          file=answers, flush=True)
    for line in os.fdopen(requests_fd):
        request = json.loads(line)
        began = time.perf_counter()
        try:
            result = compile_one(request["kernel"], request["shape"], request["config"])
        except Exception as exc:  # noqa: BLE001 - a request this process cannot serve is answered, not fatal
            result = {"status": "compile_error", "error": error_text(exc)}
        print(json.dumps({**result, "seconds": time.perf_counter() - began}), file=answers, flush=True)


def channels_of(argv: list[str]) -> list[tuple[int, int]]:
    """The ``CHANNELS`` of a command line: the pipes' descriptors, request then answer, one pair a process."""
    return [tuple(pair) for pair in json.loads(argv[2])]


def main(argv: list[str]) -> None:
    """``python -m workers.compile_server POOL_PID CHANNELS [PROBLEM]``."""
    zygote(int(argv[1]), channels_of(argv), json.loads(argv[3]) if len(argv) > 3 else None)


if __name__ == "__main__":
    main(sys.argv)

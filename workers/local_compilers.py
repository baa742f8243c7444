"""The pool's local compile processes (``workers.compile_server``), started before Ray, and the sweep's
view of them: submit a config to an idle one, poll for what finished, give up on one.

They serve one host only: a pool that starts its own Ray (or joins this machine's head) starts them
beside its pre-warmed children; a pool that joins a remote cluster compiles by Ray tasks alone.
Each process compiles one config at a time. Their answers come over pipes read without blocking, so the
sweep's loop polls them between its waits on Ray.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

MAX_LOCAL_COMPILERS = 8  # beside the Ray compile workers, which take over once they are up


def local_compiler_count(cpus: int | None = None) -> int:
    """How many to start: half the host's cores (the device child and Ray start beside them), at most
    ``MAX_LOCAL_COMPILERS``."""
    return max(1, min(MAX_LOCAL_COMPILERS, (cpus or os.cpu_count() or 2) // 2))


@dataclass(eq=False)
class LocalCompile:
    """A config handed to local compile process ``process``: a key of the sweep's map of compiling configs
    beside Ray's task references."""

    process: int


@dataclass
class _Process:
    popen: subprocess.Popen
    state: str = "starting"  # starting | idle | busy | gone
    current: LocalCompile | None = None
    abandoned: bool = False  # the current config went to the benchmarking child: its answer is dropped
    ready_at: float | None = None
    buffer: bytes = b""


class LocalCompilers:
    """A few compile processes of this host, each started with ``env`` as its whole environment."""

    def __init__(self, processes: list[subprocess.Popen]) -> None:
        self._processes = [_Process(p) for p in processes]
        self.answered = 0  # answers handed to the sweep (abandoned configs' not counted)

    @classmethod
    def start(cls, count: int, env: dict[str, str], problem: dict[str, Any] | None = None) -> LocalCompilers:
        """``problem``: the sweep's first (kernel, shape), whose default each process compiles as it warms up."""
        argv = [sys.executable, "-m", "workers.compile_server", str(os.getpid())]
        if problem is not None:
            argv.append(json.dumps({"kernel": problem["kernel"], "shape": problem["shape"]}))
        env = {**env, "OMP_NUM_THREADS": "1"}  # one thread each (``workers.compile_server``: why)
        return cls([subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL) for _ in range(count)])

    @property
    def count(self) -> int:
        return len(self._processes)

    @property
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._processes]

    @property
    def ready_times(self) -> list[float]:
        """The wall clock at which each process that has said so was ready."""
        return [p.ready_at for p in self._processes if p.ready_at is not None]

    def busy(self) -> bool:
        """Whether any process is still starting or compiling: something to poll for."""
        return any(p.state in ("starting", "busy") for p in self._processes)

    def submit(self, kernel: str, shape: dict[str, int], config: dict[str, Any]) -> LocalCompile | None:
        """Hand the config to an idle process; None when none is idle."""
        index = next((i for i, p in enumerate(self._processes) if p.state == "idle"), None)
        if index is None:
            return None
        process = self._processes[index]
        line = json.dumps({"kernel": kernel, "shape": shape, "config": config}) + "\n"
        try:
            process.popen.stdin.write(line.encode())
            process.popen.stdin.flush()
        except OSError:  # it died since its last answer
            self._gone(process)
            return None
        process.state, process.current, process.abandoned = "busy", LocalCompile(index), False
        return process.current

    def abandon(self, handle: LocalCompile) -> None:
        """Drop the answer for ``handle``: the benchmarking child compiles that config itself. The process
        finishes it all the same (the binary lands in the cache) and is then free."""
        process = self._processes[handle.process]
        if process.current is handle:
            process.abandoned = True

    def kill(self, handle: LocalCompile) -> None:
        """End the process compiling ``handle`` (past its time limit); the others go on."""
        process = self._processes[handle.process]
        if process.current is handle:
            process.popen.kill()
            process.popen.wait()
            self._gone(process)

    def poll(self, timeout_s: float) -> list[tuple[LocalCompile, dict[str, Any]]]:
        """The answers that arrived within ``timeout_s`` (0: only those already there), each with its config's
        handle; a process that died while compiling answers ``crash``."""
        watched = {p.popen.stdout.fileno(): p for p in self._processes if p.state in ("starting", "busy")}
        if not watched:
            return []
        readable, _, _ = select.select(list(watched), [], [], timeout_s)
        answers = []
        for fd in readable:
            process = watched[fd]
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                handle, abandoned = process.current, process.abandoned
                self._gone(process)
                if handle is not None and not abandoned:
                    answers.append((handle, {"status": "crash", "error": "the local compile process died "
                                             f"(exit code {process.popen.wait()})"}))
                continue
            process.buffer += chunk
            while b"\n" in process.buffer:
                line, process.buffer = process.buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:  # not an answer: the server sends libraries' output to stderr, but be sure
                    continue
                if process.state == "starting":
                    process.state, process.ready_at = "idle", message["ready_at"]
                elif process.current is not None:
                    handle, abandoned = process.current, process.abandoned
                    process.state, process.current = "idle", None
                    if not abandoned:
                        answers.append((handle, message))
                        self.answered += 1
        return answers

    def kill_all(self) -> None:
        """Signal every process still running to end, mid-compile or not, without waiting: each one's GPU
        context is torn down as it dies, so they end side by side (and beside whatever the caller does
        next) rather than one after the other."""
        for process in self._processes:
            if process.popen.poll() is None:
                process.popen.kill()

    def close(self) -> None:
        """End every process (``kill_all``) and reap them all, those that ended by themselves too."""
        self.kill_all()
        for process in self._processes:
            process.popen.wait()
            if process.state != "gone":
                self._gone(process)

    @staticmethod
    def _gone(process: _Process) -> None:
        process.state, process.current = "gone", None
        for stream in (process.popen.stdin, process.popen.stdout):
            if stream is not None:
                stream.close()

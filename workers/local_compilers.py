"""The pool's local compile processes (``workers.compile_server``), started before Ray, and the sweep's
view of them: submit a config to an idle one, poll for what finished, give up on one.

They serve one host only: a pool that starts its own Ray (or joins this machine's head) starts them
beside its pre-warmed children; a pool that joins a remote cluster compiles by Ray tasks alone.
One zygote process imports torch and the kernels and forks them; each compiles one config at a time.
Each has a request pipe and an answer pipe of its own. The answers are read without blocking, so the
sweep's loop polls them between its waits on Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

# beside the Ray compile workers, which take over once they are up: forked after one import, a compile
# process costs its device context and its first compile, no imports of its own
MAX_LOCAL_COMPILERS = 16
ZYGOTE_EXIT_S = 10.0  # how long ``close`` waits for the zygote to reap its children and end


def local_compiler_count(cpus: int | None = None) -> int:
    """How many to start: a core each, less two for the benchmarking child and Ray's own processes, at
    most ``MAX_LOCAL_COMPILERS``."""
    return max(1, min(MAX_LOCAL_COMPILERS, (cpus or os.cpu_count() or 2) - 2))


@dataclass(eq=False)
class LocalCompile:
    """A config handed to local compile process ``process``: a key of the sweep's map of compiling configs
    beside Ray's task references."""

    process: int


@dataclass
class _Process:
    requests: Any  # the request pipe's writing end (binary file)
    answers: int  # the answer pipe's reading end
    pid: int | None = None  # as it told when ready
    state: str = "starting"  # starting | idle | busy | gone
    current: LocalCompile | None = None
    abandoned: bool = False  # the current config went to the benchmarking child: its answer is dropped
    ready_at: float | None = None
    offline_arch: str | None = None  # the arch it compiles for without the GPU, as it told when ready
    buffer: bytes = b""


class LocalCompilers:
    """A few compile processes of this host, forked by ``zygote``, each with its pipes."""

    def __init__(self, zygote: subprocess.Popen, processes: list[_Process]) -> None:
        self._zygote = zygote
        self._processes = processes
        self.answered = 0  # answers handed to the sweep (abandoned configs' not counted)

    @classmethod
    def start(cls, count: int, env: dict[str, str], problem: dict[str, Any] | None = None,
              server: str = "workers.compile_server") -> LocalCompilers:
        """Start the zygote of ``server`` (a module speaking its protocol) with ``env`` as its whole
        environment; ``problem``: the sweep's first (kernel, shape), whose default each process compiles as
        it warms up."""
        processes, theirs = [], []
        for _ in range(count):
            request_read, request_write = os.pipe()
            answer_read, answer_write = os.pipe()
            processes.append(_Process(os.fdopen(request_write, "wb"), answer_read))
            theirs.append((request_read, answer_write))
        argv = [sys.executable, "-m", server, str(os.getpid()), json.dumps(theirs)]
        if problem is not None:
            argv.append(json.dumps({"kernel": problem["kernel"], "shape": problem["shape"]}))
        # one thread each (``workers.compile_server``: why); and torch's CUDA check by NVML, which leaves the
        # driver unopened: a zygote that opened it would fork children that cannot
        env = {**env, "OMP_NUM_THREADS": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        inherited = [fd for pair in theirs for fd in pair]
        try:
            zygote = subprocess.Popen(argv, env=env, pass_fds=inherited,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:  # theirs alone now: a process's answer pipe ends (EOF) when it dies
            for fd in inherited:
                os.close(fd)
        return cls(zygote, processes)

    @property
    def count(self) -> int:
        return len(self._processes)

    @property
    def pids(self) -> list[int]:
        """The pids of the compile processes that are ready."""
        return [p.pid for p in self._processes if p.pid is not None]

    @property
    def ready_times(self) -> list[float]:
        """The wall clock at which each process that has said so was ready."""
        return [p.ready_at for p in self._processes if p.ready_at is not None]

    @property
    def offline_arch(self) -> str | None:
        """The arch the ready processes compile for without opening the GPU (``workers.compile_server``);
        None while none is ready, or where they compile on the GPU."""
        return next((p.offline_arch for p in self._processes if p.ready_at is not None), None)

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
            process.requests.write(line.encode())
            process.requests.flush()
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
            with contextlib.suppress(ProcessLookupError):  # it ended by itself
                os.kill(process.pid, signal.SIGKILL)  # busy, so ready, so its pid is known
            self._gone(process)

    def poll(self, timeout_s: float) -> list[tuple[LocalCompile, dict[str, Any]]]:
        """The answers that arrived within ``timeout_s`` (0: only those already there), each with its config's
        handle; a process that died while compiling answers ``crash``."""
        watched = {p.answers: p for p in self._processes if p.state in ("starting", "busy")}
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
                    answers.append((handle, {"status": "crash", "error": "the local compile process died"}))
                continue
            process.buffer += chunk
            while b"\n" in process.buffer:
                line, process.buffer = process.buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:  # not an answer: the server sends libraries' output to stderr, but be sure
                    continue
                if process.state == "starting":
                    process.state, process.ready_at, process.pid = "idle", message["ready_at"], message["pid"]
                    process.offline_arch = message.get("offline_arch")
                elif process.current is not None:
                    handle, abandoned = process.current, process.abandoned
                    process.state, process.current = "idle", None
                    if not abandoned:
                        answers.append((handle, message))
                        self.answered += 1
        return answers

    def kill_all(self) -> None:
        """End every compile process, mid-compile or not, without waiting: the zygote signals them all
        (``workers.compile_server``), and each one's GPU context is torn down as it dies, so they end side by
        side (and beside whatever the caller does next) rather than one after the other."""
        if self._zygote.poll() is None:
            self._zygote.terminate()
        for process in self._processes:
            self._gone(process)

    def close(self) -> None:
        """End every process (``kill_all``) and wait for the zygote, which reaps them, to end."""
        self.kill_all()
        try:
            self._zygote.wait(ZYGOTE_EXIT_S)
        except subprocess.TimeoutExpired:  # its children end by their own watch once it is gone
            self._zygote.kill()
            self._zygote.wait()

    @staticmethod
    def _gone(process: _Process) -> None:
        if process.state == "gone":
            return
        process.state, process.current = "gone", None
        with contextlib.suppress(OSError):  # a pipe whose reader died
            process.requests.close()
        os.close(process.answers)

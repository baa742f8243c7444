"""Parent side of the benchmarking child: send a request, survive a crash or a hang.

A config that raises an illegal memory access, segfaults, or never returns must cost one
trial, not the worker. ``BenchProcess.request`` returns the child's answer, or a
``crash``/``timeout`` answer with the error text after killing and forgetting the child;
the next request starts a fresh one.

The first child may be adopted instead of started: a pre-warmed one (``workers.prewarmed_child``)
that the pool started before Ray, reached through its socket. If it cannot be reached, the
worker starts its own, as it does after every fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from workers.prewarmed_child import stderr_path


ADOPT_TIMEOUT_S = 300.0  # the pre-warmed child's imports may still be running


class _AdoptedChild:
    """A pre-warmed child reached through its socket: the part of ``Popen`` that ``BenchProcess`` uses.
    It is the pool's child, not this process's, so its exit code is not known here (None)."""

    def __init__(self, conn: socket.socket, reader: Any, pid: int, ready_at: float | None,
                 prepared: dict[str, Any] | None = None, phases_s: dict[str, float] | None = None) -> None:
        self._conn, self.stdout, self.pid = conn, reader, pid
        self.ready_at = ready_at  # wall clock when its imports, device context and prepared problem were done
        self.prepared = prepared  # what it prepared for the sweep's first trial (``bench_child.prepare``), if asked
        self.phases_s = phases_s or {}  # seconds its start spent importing and opening the device
        self.stdin = conn.makefile("w", encoding="utf-8")
        self._gone = False

    def poll(self) -> int | None:
        return 0 if self._gone else None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._gone = True
        self._conn.close()

    def wait(self) -> None:
        self._gone = True


def adopt(path: str) -> tuple[_AdoptedChild, Any] | None:
    """The pre-warmed child listening at ``path`` and its stderr file, or None when there is none to reach."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(ADOPT_TIMEOUT_S)
        conn.connect(path)
        reader = conn.makefile("r", encoding="utf-8")
        hello = json.loads(reader.readline())
        conn.settimeout(None)
        ready_at = hello.get("ready_at")
        child = _AdoptedChild(conn, reader, int(hello["pid"]), float(ready_at) if ready_at is not None else None,
                              hello.get("prepared"), hello.get("phases_s"))
        return child, open(stderr_path(path))
    except (OSError, ValueError, KeyError, TypeError):
        conn.close()
        return None


class BenchProcess:
    """One long-lived ``workers.bench_child`` process, restarted after every fault."""

    def __init__(self, env: dict[str, str] | None = None, adopt_from: str | None = None) -> None:
        self._env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[str] | _AdoptedChild | None = None
        self._stderr = None
        self._adopt_from = adopt_from  # tried once, by the first start
        self.restarts = 0
        self.adopted = False
        self.child_ready_at: float | None = None  # an adopted child's: when its own start was done
        self.child_prepared: dict[str, Any] | None = None  # an adopted child's prepared problem
        self.child_phases_s: dict[str, float] = {}  # an adopted child's start: import and device seconds

    def _start(self) -> subprocess.Popen[str] | _AdoptedChild:
        path, self._adopt_from = self._adopt_from, None
        if path is not None and (found := adopt(path)) is not None:
            self._proc, self._stderr = found
            self.adopted = True
            self.child_ready_at, self.child_prepared = found[0].ready_at, found[0].prepared
            self.child_phases_s = found[0].phases_s
            return self._proc
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "workers.bench_child"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, bufsize=1, env=self._env,
        )
        return self._proc

    def _stderr_tail(self, limit: int = 3000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-limit:]

    def _discard(self, reason: str, status: str) -> dict[str, Any]:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        detail = self._stderr_tail()
        self.restarts += 1
        return {"status": status, "error": f"{reason}\n{detail}".strip()}

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``message``; the child's JSON answer, or a crash/timeout answer."""
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self._discard("benchmark process died before taking the request", "crash")
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._discard(f"no answer within {timeout_s:.0f} s; benchmark process killed", "timeout")
            ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
            if ready:
                line = proc.stdout.readline()
                if line:
                    answer = json.loads(line)
                    if answer.pop("fatal", False):
                        self._discard("benchmark process exited after an error", "crash")
                    return answer
                code = proc.wait()
                cause = ("its connection closed" if code is None
                         else f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
                return self._discard(f"benchmark process died ({cause})", "crash")

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

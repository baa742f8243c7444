"""Parent side of the benchmarking child: send a request, survive a crash or a hang.

A config that raises an illegal memory access, segfaults, or never returns must cost one
trial, not the worker. ``BenchProcess.request`` returns the child's answer, or a
``crash``/``timeout`` answer with the error text after killing and forgetting the child;
the next request starts a fresh one.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any


class BenchProcess:
    """One long-lived ``workers.bench_child`` process, restarted after every fault."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[str] | None = None
        self._stderr = None
        self.restarts = 0

    def _start(self) -> subprocess.Popen[str]:
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
                cause = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                return self._discard(f"benchmark process died ({cause})", "crash")

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

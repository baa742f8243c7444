"""Ends what a killed server leaves running: the processes it started, down to their grandchildren.

A server that starts its own Ray has it started as its children (GCS, raylet, dashboard), and
the raylet starts agents and workers of its own. SIGKILLed, the server takes the GCS and the
raylet with it, but the raylet's agents were left behind (2 a kill). ``Reaper`` starts
``python -m workers.reaper PID``: a watcher that notes the server's descendants twice a second
and, when its pipe from the server closes without a word (the server is gone), kills the ones
it noted that still run. A server that ends normally tells it to go (``release``).
It ignores SIGINT: a Ctrl-C in the terminal reaches the whole process group, and the watcher must
outlive the server it watches (it printed a traceback and left the agents behind).
Linux only (``/proc``); elsewhere nothing is watched.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

LOOK_EVERY_S = 0.5
RELEASE = "release\n"


def process_table() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, start time)}`` of every process this user can read."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (name) "
        table[int(entry.name)] = (int(fields[1]), fields[19])
    return table


def descendants(root: int, table: dict[int, tuple[int, str]]) -> dict[int, str]:
    """``{pid: start time}`` of every process below ``root``."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found[pid] = table[pid][1]
        stack.extend(children.get(pid, []))
    return found


def watch(server: int) -> None:
    """Note ``server``'s descendants until stdin says ``release`` (leave them) or closes (kill them)."""
    noted: dict[int, str] = {}
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], LOOK_EVERY_S)
        if readable:
            if sys.stdin.readline() == RELEASE:
                return
            break
        noted.update(descendants(server, process_table()))
        noted.pop(os.getpid(), None)
    table = process_table()
    for pid, started in noted.items():
        if table.get(pid, (0, ""))[1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class Reaper:
    """The watcher of this process's descendants (see the module doc); ``release`` before a normal exit."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        if sys.platform.startswith("linux"):
            self._proc = subprocess.Popen([sys.executable, "-m", "workers.reaper", str(os.getpid())],
                                          stdin=subprocess.PIPE, text=True)

    def release(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(RELEASE)
                self._proc.stdin.close()
            except OSError:  # the watcher is gone already
                pass
            self._proc.wait()
        self._proc = None


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]))

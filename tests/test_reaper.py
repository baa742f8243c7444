"""workers.reaper: the watcher outlives a Ctrl-C to its process group and kills what a vanished server left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc")


def _watcher(server: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workers.reaper", str(server)], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_ctrl_c_leaves_the_watcher_running_and_it_still_kills_the_servers_children():
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
    watcher = _watcher(server.pid)
    time.sleep(1.5)  # the watcher notes the server's child
    child = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == server.pid)
    watcher.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert watcher.poll() is None  # still watching
    server.kill()
    server.wait()
    watcher.stdin.close()  # the server's end of the pipe: gone without a word
    assert watcher.wait(timeout=10) == 0 and "Traceback" not in watcher.stderr.read()
    time.sleep(0.2)
    assert _parent(child) is None  # killed


def _parent(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[1])

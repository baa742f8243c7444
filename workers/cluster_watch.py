"""Notices a Ray cluster whose head stopped answering, before Ray ends the driver on its own.

Without GCS fault tolerance, a driver whose head node is gone is terminated by Ray after
``gcs_rpc_server_reconnect_timeout_s`` (60 s) with a log line about the GCS, while the
benchmarks it waits on may still finish on the worker nodes. ``ClusterWatch`` asks the head
for a key every ``every_s`` seconds; after ``grace_s`` seconds without an answer it calls
``on_lost`` with a message that says what happened, so the server can put its job back in
the queue and exit in words of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import ray

PROBE_TIMEOUT_S = 2.0


def head_answers(timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the cluster's head (its GCS) answers a key lookup within ``timeout_s``."""
    client = getattr(ray._private.worker.global_worker, "gcs_client", None)  # noqa: SLF001 - no public probe
    if client is None:
        return True  # nothing to ask through: leave the verdict to Ray
    try:
        client.internal_kv_get(b"tuner-cluster-watch", None, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure to answer is the head not answering
        return False
    return True


class ClusterWatch:
    """A daemon thread that calls ``on_lost(message)`` once the head has not answered for ``grace_s``."""

    def __init__(self, address: str, on_lost: Callable[[str], None], grace_s: float = 10.0,
                 every_s: float = 2.0) -> None:
        self.address, self.on_lost, self.grace_s, self.every_s = address, on_lost, grace_s, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cluster-watch", daemon=True)

    def _watch(self) -> None:
        silent_since: float | None = None
        while not self._stop.wait(self.every_s):
            if head_answers():
                silent_since = None
                continue
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since >= self.grace_s:
                self.on_lost(f"the Ray cluster at {self.address} stopped answering for {self.grace_s:.0f} s "
                             f"(its head node is down or restarting)")
                return

    def start(self) -> ClusterWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

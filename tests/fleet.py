"""Helpers of the fleet tests: a multi-node Ray cluster on this machine, `tuner serve` processes, checks.

``LocalCluster`` starts a head (no GPUs) and worker nodes with one fake GPU each
(``ray.cluster_utils.Cluster``, each node its own raylet); the device workers then run the
kernels under the interpreter. With ``TUNER_TEST_RAY_ADDRESS`` set, the tests use that cluster
instead, and the ones that must kill or restart a node's processes are skipped.

Every server a test starts carries ``TUNER_TEST_TAG=<tag>`` in its environment, which its Ray
workers and benchmarking children inherit; ``tagged_processes`` finds whatever of it still runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from sqlalchemy import select

from db import Sweep, Trial, open_database, session_scope

REAL_CLUSTER = os.environ.get("TUNER_TEST_RAY_ADDRESS")


def new_tag() -> str:
    return uuid.uuid4().hex[:12]


def tagged_processes(tag: str) -> list[int]:
    """Processes of this machine whose environment holds ``TUNER_TEST_TAG=tag``."""
    needle = f"TUNER_TEST_TAG={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = (entry / "environ").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if needle in environ.split(b"\0") and state != "Z":
                found.append(int(entry.name))
    return found


def wait_until_gone(tag: str, timeout_s: float = 60) -> list[int]:
    """Wait for every process tagged ``tag`` to end; those still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def serve(db: str, tag: str, *args: str, address: str | None = None, lease_s: float = 4) -> subprocess.Popen:
    """A `tuner serve` process (``--drain`` unless told otherwise by ``args``)."""
    env = {**os.environ, "TUNER_DB_URL": db, "RAY_ADDRESS": address or "", "TUNER_TEST_TAG": tag}
    return subprocess.Popen([sys.executable, "-m", "tuner.cli", "serve", "--lease-seconds", str(lease_s), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def trials(db: str, sweep_id: int) -> list[Trial]:
    with session_scope(open_database(db)) as session:
        return list(session.scalars(select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.id)).all())


def status(db: str, sweep_id: int) -> str:
    with session_scope(open_database(db)) as session:
        return session.get(Sweep, sweep_id).status


def wait_for_trials(db: str, sweep_id: int, count: int, server: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while len(trials(db, sweep_id)) < count:
        if server.poll() is not None:
            raise AssertionError(f"server exited ({server.returncode}):\n{server.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"fewer than {count} trials of sweep {sweep_id} in {timeout_s} s"
        time.sleep(0.3)


def assert_measured_once(db: str, sweep_id: int, configs: int) -> list[Trial]:
    """The sweep is done, with ``configs`` trials, each config measured (or pruned) exactly once."""
    assert status(db, sweep_id) == "done"
    rows = trials(db, sweep_id)
    per_identity = Counter(r.identity for r in rows)
    assert max(per_identity.values()) == 1, [r.config for r in rows if per_identity[r.identity] > 1]
    assert len(rows) == configs, [r.config for r in rows]
    assert sum(r.is_winner for r in rows) == 1
    return rows


class LocalCluster:
    """A head and ``workers`` nodes with one fake GPU and one CPU each, in a private temp folder."""

    def __init__(self, workers: int = 3) -> None:
        from ray.cluster_utils import Cluster

        # short: Ray's socket paths live under it
        self.temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        # A node is declared dead 2-3 s after its raylet stops answering (Ray's default: about 15 s).
        health = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                  "health_check_initial_delay_ms": 1000}
        self.cluster = Cluster(initialize_head=True, connect=False,
                               head_node_args={"num_cpus": 1, "num_gpus": 0, "temp_dir": self.temp_dir,
                                               "_system_config": health})
        self.address = self.cluster.address
        self._forget_address()
        self.nodes = [self.add_node() for _ in range(workers)]
        self.cluster.wait_for_nodes()

    def _forget_address(self) -> None:
        """Ray's test cluster notes its address for a bare ``ray.init()`` to join; the other tests' local Rays
        must not."""
        from ray._common.utils import get_ray_address_file

        noted = Path(get_ray_address_file(None))
        if noted.exists() and noted.read_text().strip() == self.address:
            noted.unlink()

    def add_node(self):
        return self.cluster.add_node(num_cpus=1, num_gpus=1)

    def kill_raylet(self, node) -> None:
        """SIGKILL the raylet of ``node`` (its workers follow it)."""
        os.kill(node.all_processes["raylet"][0].process.pid, signal.SIGKILL)
        self.nodes.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)  # the rest of its processes; out of the node count

    def shutdown(self) -> None:
        """Stop every process of the cluster, agents included (Ray leaves those of a killed raylet running)."""
        try:
            self.cluster.shutdown()
        except Exception:  # noqa: BLE001 - nodes killed by a test fail their graceful stop
            pass
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if self.temp_dir.encode() in (entry / "cmdline").read_bytes():
                        os.kill(int(entry.name), signal.SIGKILL)
                except OSError:
                    continue
        shutil.rmtree(self.temp_dir, ignore_errors=True)

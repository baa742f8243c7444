"""One sweep over a multi-node Ray cluster, and the cluster's faults: a node's raylet, a device worker
and the head killed while `tuner serve` runs.

The cluster is a head and three worker nodes on this machine, each with one fake GPU (``tests.fleet``),
or the cluster at ``TUNER_TEST_RAY_ADDRESS`` (then the tests that kill a node's processes are skipped).
Every test ends with the sweep done, each config measured exactly once, and nothing of a killed
server left running.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from tests.fleet import (REAL_CLUSTER, LocalCluster, assert_measured_once, new_tag, serve, status,
                         tagged_processes, trials, wait_for_trials, wait_until_gone)
from tests.test_service import FAST_TIMING, queued

local_only = pytest.mark.skipif(bool(REAL_CLUSTER), reason="kills node processes of a cluster on this machine")
SLOW = {**FAST_TIMING, "rep_ms": 100, "retime_top": 2, "retime_rounds": 1}


@pytest.fixture(scope="module")
def cluster():
    if REAL_CLUSTER:
        yield REAL_CLUSTER, None
        return
    local = LocalCluster(workers=3)
    yield local.address, local
    local.shutdown()


def spec_file(tmp_path, name: str, blocks: list[int], modes: list[str] = ("slow",), strategy: str = "grid",
              **extra) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"kernel": "fault_probe", "shapes": [{"n": 100}],
                                    "space": {"MODE": list(modes), "BLOCK": blocks},
                                    "strategy": {"name": strategy, "seed": 1}, "timing": SLOW, **extra}))
    return path


def finish(server, timeout_s: float = 300) -> str:
    out, err = server.communicate(timeout=timeout_s)
    assert server.returncode == 0, err[-3000:]
    return out


def test_one_sweep_runs_on_every_node(tmp_path, cluster):
    address, _ = cluster
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    sweep_id = queued(db, spec_file(tmp_path, "six.yaml", [16, 32, 64, 128, 256, 512]))
    out = finish(serve(db, new_tag(), "--drain", address=address))
    assert f"sweep {sweep_id}: done" in out
    rows = assert_measured_once(db, sweep_id, 6)
    assert len({r.node for r in rows}) >= (2 if REAL_CLUSTER else 3)  # every worker node measured some
    assert all(r.node and len(r.node) == 56 for r in rows)


@local_only
def test_a_worker_nodes_raylet_killed_mid_sweep(tmp_path, cluster):
    """Its in-flight config goes back in line and is measured on the nodes left, once."""
    address, local = cluster
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    sweep_id = queued(db, spec_file(tmp_path, "ten.yaml", [2 ** k for k in range(4, 14)]))
    server = serve(db, new_tag(), "--drain", address=address)
    wait_for_trials(db, sweep_id, 2, server)
    victim = local.nodes[0]
    local.kill_raylet(victim)
    killed_at = datetime.now(timezone.utc)
    out = finish(server)
    assert f"sweep {sweep_id}: done" in out
    rows = assert_measured_once(db, sweep_id, 10)
    # Its worker answers until the head declares the node dead (2-3 s here); the config it held then is
    # measured again on another node, and nothing is started there later.
    requeued = [r for r in rows if r.metrics.get("requeued")]
    assert requeued and victim.node_id not in {r.node for r in requeued}
    late = [r for r in rows if r.started_at.replace(tzinfo=timezone.utc) > killed_at + timedelta(seconds=6)]
    assert victim.node_id not in {r.node for r in late}
    local.nodes.append(local.add_node())  # back to three worker nodes for the tests that follow
    local.cluster.wait_for_nodes()


def test_a_device_worker_killed(tmp_path, cluster):
    """``kill_worker`` SIGKILLs its worker once: Ray restarts the actor, the config is measured again, once."""
    address, _ = cluster
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    sweep_id = queued(db, spec_file(tmp_path, "kill.yaml", [16, 32, 64], modes=["kill_worker", "slow"]))
    tag = new_tag()
    out = finish(serve(db, tag, "--drain", address=address))
    assert f"sweep {sweep_id}: done" in out
    rows = assert_measured_once(db, sweep_id, 6)  # 2 modes x 3 blocks, kill_worker pruned but at BLOCK 16
    killer = [r for r in rows if r.config == {"MODE": "kill_worker", "BLOCK": 16}]
    assert [r.status for r in killer] == ["ok"]
    assert not wait_until_gone(tag)


@local_only
def test_the_head_restarted_while_serve_runs(tmp_path, cluster):
    """The server says the cluster is gone and puts the sweep back; one started on the new cluster resumes it."""
    address, local = cluster
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    sweep_id = queued(db, spec_file(tmp_path, "eight.yaml", [16, 32, 64, 128, 256, 512, 1024, 2048],
                                    strategy="tpe", budget={"max_trials": 8}))  # rounds left when the head goes
    tag = new_tag()
    server = serve(db, tag, address=address)  # not --drain: it would wait for more sweeps
    wait_for_trials(db, sweep_id, 1, server)
    local.shutdown()  # the head and its nodes; a restarted head is a new cluster
    for pid in tagged_processes(tag):  # and the server's workers, which would finish their trials unheaded
        if pid != server.pid:
            os.kill(pid, signal.SIGKILL)
    _, err = server.communicate(timeout=120)
    assert server.returncode == 3, err[-3000:]
    assert "stopped answering" in err and f"sweep(s) {sweep_id} back in the queue" in err
    assert status(db, sweep_id) == "queued"
    before = trials(db, sweep_id)

    fresh = LocalCluster(workers=2)
    try:
        out = finish(serve(db, new_tag(), "--drain", address=fresh.address))
    finally:
        fresh.shutdown()
    assert f"sweep {sweep_id}: done" in out
    rows = assert_measured_once(db, sweep_id, 8)
    assert [r.id for r in rows[: len(before)]] == [r.id for r in before]  # nothing lost
    assert not wait_until_gone(tag)

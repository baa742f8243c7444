"""Faults of one server and of the database: kills at the worst moment, a server killed with SIGKILL,
servers started together, a lease that must outlast a long re-timing or be given up, PostgreSQL
restarted mid-sweep. Each ends with the sweep done and every config measured exactly once.

Most run the runner in this process on the module's local Ray (a CLI subprocess costs seconds of
imports on the CI's 2 cores); the killed server is a real `tuner serve` process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import update

from db import Sweep, SweepStatus, open_database, session_scope
from tests.cli_run import invoke_tuner
from tests.fleet import assert_measured_once, new_tag, serve, trials, wait_for_trials, wait_until_gone
from tests.test_service import FAST_TIMING, queued, write_spec
from tuner.sweep import queue
from tuner.sweep.runner import SweepRunner
from tuner.sweep.serve import optuna_storage, serve as serve_loop
from workers.pool import WorkerPool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = [16, 32, 64, 128, 256, 512, 1024, 2048]
SAMPLED_BUDGET = 3  # of 8 valid configs: random and TPE sample (under half), grid walks all 8


class Killed(BaseException):
    """What a SIGKILL does to the runner, at a chosen point."""


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """For the slower tests: the lease and the kill behave alike on both backends (test_db covers the claims)."""
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@pytest.fixture(scope="module")
def pool(local_ray):
    started = WorkerPool.start(cpu_workers=1)
    yield started
    started.shutdown()


def eight_configs(tmp_path, strategy: str, mode: str = "ok", **timing) -> object:
    budget = {"max_trials": SAMPLED_BUDGET} if strategy != "grid" else {}
    return write_spec(tmp_path, f"{strategy}.yaml", kernel="fault_probe", shapes=[{"n": 100}],
                      space={"MODE": [mode], "BLOCK": BLOCKS}, strategy={"name": strategy, "seed": 2},
                      budget=budget, timing={**FAST_TIMING, "retime_top": 2, **timing})


def runner(db_url: str, sweep_id: int, owner: str, pool: WorkerPool, lease_s: float = 60) -> SweepRunner:
    return SweepRunner(open_database(db_url), optuna_storage(db_url), sweep_id, owner, pool, lease_s=lease_s)


@pytest.mark.parametrize("strategy", ["grid", "random", "tpe"])
def test_a_kill_between_recording_and_telling_measures_nothing_twice(tmp_path, db_url, pool, strategy,
                                                                     monkeypatch):
    """Killed after a trial is committed and before the search hears of it (where TPE measured two
    configs twice): the next server answers that config from the record and measures the rest once."""
    engine = open_database(db_url)
    sweep_id = queued(db_url, eight_configs(tmp_path, strategy))
    assert queue.try_claim(engine, sweep_id, "first")
    first = runner(db_url, sweep_id, "first", pool)
    told = SweepRunner._tell

    def tell_then_die(self, state, proposal, status, median_ms):
        if len(trials(db_url, sweep_id)) >= 2:
            raise Killed()
        told(self, state, proposal, status, median_ms)

    monkeypatch.setattr(SweepRunner, "_tell", tell_then_die)
    with pytest.raises(Killed):
        first.run()
    monkeypatch.setattr(SweepRunner, "_tell", told)
    assert queue.try_claim(engine, sweep_id, "second", lease_s=0)  # the first server is gone
    assert runner(db_url, sweep_id, "second", pool).run() == SweepStatus.done
    assert_measured_once(db_url, sweep_id, 8 if strategy == "grid" else SAMPLED_BUDGET)


def test_a_killed_server_leaves_no_process_and_its_sweep_resumes(tmp_path, sqlite_url, local_ray):
    """SIGKILL of the server alone (not its process group): its local Ray, the Ray agents and the
    benchmarking child all end; a new server finishes the TPE sweep, measuring each config once."""
    sweep_id = queued(sqlite_url, eight_configs(tmp_path, "tpe", mode="slow", rep_ms=100))
    tag = new_tag()
    server = serve(sqlite_url, tag, "--drain")
    wait_for_trials(sqlite_url, sweep_id, 1, server)
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    assert not wait_until_gone(tag, timeout_s=30)
    code, out = invoke_tuner(sqlite_url, "serve", "--drain", "--lease-seconds", "1")
    assert code == 0 and f"sweep {sweep_id}: done" in out, out
    assert_measured_once(sqlite_url, sweep_id, SAMPLED_BUDGET)


def test_servers_started_together_upgrade_the_schema_once(db_url):
    """Each process opens the fresh database and Optuna's storage in it at the same instant; before the
    schema lock, one failed on the version table's unique key."""
    start_at = time.time() + 4
    code = ("import sys, time; from db import open_database; from tuner.sweep.serve import optuna_storage;"
            f"time.sleep(max(0, {start_at} - time.time())); open_database(sys.argv[1]); optuna_storage(sys.argv[1])")
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], cwd=ROOT, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(errors)[-3000:]


def run_in_thread(action) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(action()), daemon=True)
    thread.start()
    return thread, result


def test_a_long_retiming_keeps_the_lease(tmp_path, sqlite_url, pool):
    """A 2 s lease and a re-timing of 12 s or more: a rival server polling all along never gets the sweep."""
    engine = open_database(sqlite_url)
    spec = write_spec(tmp_path, "retime.yaml", kernel="fault_probe", shapes=[{"n": 100}],
                      space={"MODE": ["slow"], "BLOCK": [16, 32, 64]}, strategy={"name": "grid"},
                      timing={**FAST_TIMING, "retime_top": 3, "retime_rounds": 2})
    sweep_id = queued(sqlite_url, spec)
    assert queue.try_claim(engine, sweep_id, "holder", lease_s=2)
    thread, result = run_in_thread(lambda: runner(sqlite_url, sweep_id, "holder", pool, lease_s=2).run())
    rival_claims = []
    while thread.is_alive():
        rival_claims.append(queue.claim_next(engine, "rival", lease_s=2))
        time.sleep(0.2)
    assert result == [SweepStatus.done]
    assert set(rival_claims) == {None}
    assert_measured_once(sqlite_url, sweep_id, 3)


def test_a_lost_lease_stops_the_loser_and_the_sweep_still_finishes(tmp_path, sqlite_url, pool):
    """Another server takes the sweep over: the first stops without closing it, and a server that finds
    the new owner silent takes it over in turn and finishes it; no config is measured twice."""
    engine = open_database(sqlite_url)
    sweep_id = queued(sqlite_url, eight_configs(tmp_path, "grid", mode="slow", rep_ms=100))
    assert queue.try_claim(engine, sweep_id, "first")
    thread, result = run_in_thread(lambda: runner(sqlite_url, sweep_id, "first", pool, lease_s=2).run())
    while len(trials(sqlite_url, sweep_id)) < 1:
        time.sleep(0.2)
    with session_scope(engine) as session:  # "second" took it over, then went silent
        session.execute(update(Sweep).where(Sweep.id == sweep_id).values(owner="second"))
    thread.join(timeout=60)
    assert result == [SweepStatus.running] and len(trials(sqlite_url, sweep_id)) < 8
    time.sleep(1.5)
    ran = serve_loop(engine, sqlite_url, pool, drain=True, lease_s=1, poll_s=1, on_sweep=lambda _: None,
                     on_done=lambda *_: None)
    assert ran == 1
    assert_measured_once(sqlite_url, sweep_id, 8)


def test_postgresql_restarted_mid_sweep(tmp_path, db_url, pool):
    """The server retries with backoff and resumes the sweep; no trial is lost, half-written or doubled."""
    if not db_url.startswith("postgresql"):
        pytest.skip("restarts the PostgreSQL server of tests/start_postgres.sh")
    engine = open_database(db_url)
    sweep_id = queued(db_url, eight_configs(tmp_path, "tpe", mode="slow", rep_ms=100))
    thread, result = run_in_thread(lambda: serve_loop(engine, db_url, pool, drain=True, lease_s=10, poll_s=1,
                                                      on_sweep=lambda _: None, on_done=lambda *_: None))
    while len(trials(db_url, sweep_id)) < 1:
        time.sleep(0.2)
    subprocess.run(["bash", os.path.join(ROOT, "tests", "start_postgres.sh"), "restart"], check=True, timeout=60)
    thread.join(timeout=180)
    assert result == [1]
    rows = assert_measured_once(db_url, sweep_id, SAMPLED_BUDGET)
    assert all(r.status == "ok" and r.median_ms > 0 and r.reps for r in rows)

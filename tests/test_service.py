"""The sweep service end to end on the CPU: queue -> serve (local Ray) -> DB -> export -> lookup.

Sweeps run the real path: a local Ray with 2 CPUs, a device worker with its benchmarking
child under ``TRITON_INTERPRET=1``, the SQL database, the exporter and
``kernels.tuning.resolve``. The killed and the cancelled server are ``tuner serve``
subprocesses with a Ray of their own, and two bad commands run in a real process; every
other command runs in this process, its sweeps on one Ray for the module, since a CLI
subprocess costs 8-10 s of imports and a Ray start 5 s more on the CI's 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from sqlalchemy import select

from db import Sweep, Trial, open_database, session_scope
from kernels import tuning
from tests.cli_run import invoke_tuner
from tuner.sweep.serve import optuna_storage

FAST_TIMING = {"warmup_ms": 1, "rep_ms": 5, "retime_rounds": 2, "retime_top": 3, "trial_timeout_s": 20,
               "retime_warmup_ms": 1, "retime_rep_ms": 5}


def tuner(*args: str, db: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNER_DB_URL": db, "RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"tuner {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_spec(tmp_path: Path, name: str, **spec) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def queued(db: str, spec: Path) -> int:
    """Queue ``spec`` in-process; the sweep's id."""
    code, out = invoke_tuner(db, "sweep", "queue", str(spec))
    assert code == 0, out
    return int(out)


def trials_of(db: str, sweep_id: int) -> list[Trial]:
    with session_scope(open_database(db)) as session:
        return list(session.scalars(select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.id)).all())


def test_faulty_configs_are_recorded_and_the_sweep_completes(tmp_path, db_url, local_ray, monkeypatch):
    """Seed 6 measures the hang last: the fresh benchmarking child that follows the crash starts inside
    the hang's timeout, and the one after the hang inside the re-timing's (two trials' timeouts), so a
    trial's timeout can be short though starting a child takes about 3 s."""
    spec = write_spec(tmp_path, "faults.yaml", kernel="fault_probe", shapes=[{"n": 100}],
                      strategy={"name": "grid", "seed": 6}, timing={**FAST_TIMING, "trial_timeout_s": 4})
    code, out = invoke_tuner(db_url, "sweep", "run", str(spec))
    assert code == 0 and "sweep 1: done" in out, out
    rows = trials_of(db_url, 1)
    by_mode = {(r.config["MODE"], r.config["BLOCK"]): r for r in rows}
    assert len(by_mode) == len(rows) == 8  # the whole 4x2 grid, each config once
    assert [r.config["MODE"] for r in rows if r.status != "pruned"] == ["ok", "wrong", "ok", "crash", "hang"]
    assert by_mode[("crash", 16)].status == "crash" and "SIGSEGV" in by_mode[("crash", 16)].error
    assert by_mode[("hang", 16)].status == "timeout"
    assert by_mode[("wrong", 16)].status == "wrong" and "out of tolerance" in by_mode[("wrong", 16)].error
    assert {by_mode[(m, 32)].status for m in ("crash", "hang", "wrong")} == {"pruned"}
    for block in (16, 32):
        ok = by_mode[("ok", block)]
        assert ok.status == "ok" and ok.median_ms > 0 and ok.p20_ms <= ok.median_ms <= ok.p80_ms and ok.reps >= 3
        assert ok.host and ok.versions["triton"] and len(ok.versions["kernel_source"]) == 12
        phases = ok.metrics["phases_s"]  # where the trial's time went: within what the child was busy
        assert set(phases) == {"inputs", "first_call", "check", "timing"} and phases["timing"] > 0
        assert sum(phases.values()) <= ok.metrics["busy_s"]
    winners = [r for r in rows if r.is_winner]
    assert len(winners) == 1 and winners[0].config["MODE"] == "ok" and winners[0].retime_ms is not None

    # Status and export in-process: a CLI subprocess costs seconds of imports on a 2-core machine.
    code, status = invoke_tuner(db_url, "sweep", "status", "1")
    assert code == 0 and "n=100" in status and "done" in status

    out = tmp_path / "tables"
    assert invoke_tuner(db_url, "export", "--arch", "interp", "--out", str(out))[0] == 0
    table = json.loads((out / "interp.json").read_text())
    assert table["schema_version"] == 1 and table["provenance"]["sweep_ids"] == [1]
    assert table["provenance"]["skipped_kernels"] == []
    for skip, message in (("rmsnorm_fwd", "no ok trials of ['rmsnorm_fwd']"), ("fault_probe", "no ok trials for arch")):
        code, output = invoke_tuner(db_url, "export", "--arch", "interp", "--out", str(out), "--skip-kernel", skip)
        assert code == 2 and message in output, output
    assert json.loads((out / "interp.json").read_text()) == table  # the failed exports wrote nothing
    exported = table["entries"]["fault_probe"]["n=100"]
    assert exported["config"] == winners[0].config and exported["trial_id"] == winners[0].id

    with monkeypatch.context() as patch:  # the run-time lookup reads the exported table
        patch.setenv("TUNER_TABLES_DIR", str(out))
        tuning.clear_cache()
        try:
            looked_up = tuning.resolve("fault_probe", {"n": 100})
        finally:
            tuning.clear_cache()
    assert looked_up == (winners[0].config, "table")

    # The same spec again and a budget of one trial, queued together for one server. The first's times
    # are answered from the database; the crash, the hang and the wrong output (the machine's state,
    # or the tolerance, may have changed) are measured again. The second measures the kernel's
    # heuristic default (random would pick it 1 time in 8).
    one = write_spec(tmp_path, "one.yaml", kernel="fault_probe", shapes=[{"n": 100}],
                     strategy={"name": "random", "seed": 3}, budget={"max_trials": 1}, timing=FAST_TIMING)
    assert invoke_tuner(db_url, "sweep", "queue", str(spec), str(one)) == (0, "2\n3\n")
    code, out = invoke_tuner(db_url, "serve", "--drain")
    assert code == 0 and "sweep 2: done" in out and "sweep 3: done" in out, out
    again = trials_of(db_url, 2)
    assert {r.config["MODE"] for r in again if "reused_from" in r.metrics} == {"ok"}
    assert Counter(r.status for r in again) == Counter(r.status for r in rows)
    [measured] = [r for r in trials_of(db_url, 3) if r.status != "pruned"]
    assert measured.config == {"MODE": "ok", "BLOCK": 32}

    # A sampler's budget of half the shape's valid configs or more (here 10 of 2) walks them as a grid:
    # each once (both answered from the database), no asks spent looking for more, where TPE had asked
    # hundreds of times.
    few = write_spec(tmp_path, "few.yaml", kernel="fault_probe", shapes=[{"n": 100}], space={"MODE": ["ok"]},
                     strategy={"name": "tpe", "seed": 0}, budget={"max_trials": 10}, timing=FAST_TIMING)
    assert queued(db_url, few) == 4
    code, out = invoke_tuner(db_url, "serve", "--drain")
    assert code == 0 and "sweep 4: done" in out, out
    assert sorted(r.config["BLOCK"] for r in trials_of(db_url, 4)) == [16, 32]
    study = optuna.load_study(study_name="sweep-4/fault_probe/n=100", storage=optuna_storage(db_url))
    assert len(study.trials) == 2


def test_a_config_far_slower_than_the_best_stops_after_its_probe(tmp_path, db_url, local_ray):
    """The default (MODE ok) is measured first and whole; the slow config (half a second a launch) is over
    1.25x that best after its probe and stops there, with the probe's figures and no host time. With
    ``probe_cutoff: null`` (another shape, so nothing is reused) it is timed whole. The winner is the same."""
    timing = {**FAST_TIMING, "probe_ms": 2, "retime_top": 1}
    for n, cutoff in ((100, 1.25), (101, None)):
        spec = write_spec(tmp_path, f"probe-{n}.yaml", kernel="fault_probe", shapes=[{"n": n}],
                          space={"MODE": ["ok", "slow"], "BLOCK": [32]}, strategy={"name": "grid"},
                          timing={**timing, "probe_cutoff": cutoff})
        code, out = invoke_tuner(db_url, "sweep", "run", str(spec))
        assert code == 0 and "done" in out, out
    for sweep_id, cutoff in ((1, 1.25), (2, None)):
        rows = {r.config["MODE"]: r for r in trials_of(db_url, sweep_id)}
        ok, slow = rows["ok"], rows["slow"]
        assert ok.status == slow.status == "ok" and ok.is_winner and not slow.is_winner
        assert "stopped_after_probe" not in ok.metrics
        assert slow.median_ms > 1.25 * ok.median_ms
        assert slow.metrics.get("stopped_after_probe", False) == (cutoff is not None)


def test_killed_server_loses_nothing_and_reruns_nothing(tmp_path, db_url, local_ray):
    """Three slow configs (about 2.5 s each): the kill comes after the first, one is in flight and one
    waits, and the restarted server measures only those two."""
    spec = write_spec(tmp_path, "slow.yaml", kernel="fault_probe", shapes=[{"n": 100}], space={"MODE": ["slow"],
                      "BLOCK": [16, 32, 64]}, strategy={"name": "grid"},
                      timing={**FAST_TIMING, "rep_ms": 300, "retime_top": 1})
    sweep_id = queued(db_url, spec)
    env = {**os.environ, "TUNER_DB_URL": db_url, "RAY_ADDRESS": ""}
    server = subprocess.Popen([sys.executable, "-m", "tuner.cli", "serve", "--drain"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not trials_of(db_url, sweep_id):
            assert server.poll() is None and time.monotonic() < deadline, "server finished no trial"
            time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the server, its Ray and its workers, mid-sweep
        server.wait()
    before = trials_of(db_url, sweep_id)
    assert 1 <= len(before) < 3
    with session_scope(open_database(db_url)) as session:
        assert session.get(Sweep, sweep_id).status == "running"

    code, out = invoke_tuner(db_url, "serve", "--drain", "--lease-seconds", "1")  # the restarted server
    assert code == 0 and f"sweep {sweep_id}: done" in out, out
    after = trials_of(db_url, sweep_id)
    assert [r.id for r in after[: len(before)]] == [r.id for r in before]  # nothing lost
    measured = Counter(r.identity for r in after if "reused_from" not in r.metrics)
    assert len(measured) == 3 and max(measured.values()) == 1  # every config measured exactly once
    assert sum(r.is_winner for r in after) == 1


BAD_SPECS = [
    ({"kernel": "nope", "shapes": [{"n": 1}]}, "unknown kernel 'nope'"),
    ({"kernel": "fault_probe", "shapes": "v4-ultra"}, "unknown preset 'v4-ultra'"),
    ({"kernel": "fault_probe", "shapes": [{"m": 3}]}, "shapes[0]"),
    ({"kernel": "fault_probe", "shapes": [{"n": 5}, {"n": -1}]}, "shapes[1].n: every dimension must be >="),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "strategy": {"name": "annealing"}}, "strategy.name"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "strategy": {"name": "tpe"}}, "needs max_trials"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "space": {"BLOCK_Q": [1]}}, "'BLOCK_Q' is not a parameter"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "budget": {"max_trials": -3}}, "budget.max_trials"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "arch": "sm_1"}, "unknown arch 'sm_1'"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "timing": {"rep_ms": "x"}}, "timing.rep_ms"),
    ({"kernel": "fault_probe", "shapes": [{"n": 100}], "timing": {"probe_cutoff": 0.9}}, "timing.probe_cutoff"),
]


@pytest.mark.parametrize("spec,message", BAD_SPECS)
def test_bad_spec_is_rejected_with_field_and_reason(tmp_path, spec, message):
    """In-process (invoke_tuner raises any exception that is not an exit); the next test checks a
    bad spec through a real process."""
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    code, output = invoke_tuner(db, "sweep", "queue", str(write_spec(tmp_path, "bad.yaml", **spec)))
    assert code == 2
    assert message in output and "Traceback" not in output
    with session_scope(open_database(db)) as session:
        assert session.scalars(select(Sweep)).all() == []


def test_several_specs_queue_together_or_not_at_all(tmp_path):
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    good = [str(write_spec(tmp_path, f"good{i}.yaml", kernel="fault_probe", shapes=[{"n": 100 + i}])) for i in range(2)]
    bad = str(write_spec(tmp_path, "bad.yaml", kernel="fault_probe", shapes="v4-ultra"))
    proc = tuner("sweep", "queue", good[0], bad, good[1], db=db, check=False)
    assert proc.returncode == 2 and "bad.yaml" in proc.stderr and "unknown preset" in proc.stderr
    with session_scope(open_database(db)) as session:
        assert session.scalars(select(Sweep)).all() == []
    code, out = invoke_tuner(db, "sweep", "queue", *good)
    assert code == 0, out
    ids = out.split()
    with session_scope(open_database(db)) as session:
        assert sorted(s.id for s in session.scalars(select(Sweep))) == sorted(map(int, ids)) and len(ids) == 2


def test_unreadable_spec_and_bad_arguments_exit_2(tmp_path):
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    (tmp_path / "broken.yaml").write_text("kernel: [unclosed")
    proc = tuner("sweep", "queue", str(tmp_path / "broken.yaml"), db=db, check=False)  # one real process
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for args in (["sweep", "queue", str(tmp_path / "missing.yaml")], ["sweep", "queue", str(tmp_path / "broken.yaml")],
                 ["sweep", "status", "42"], ["sweep", "status", "abc"], ["export", "--arch", "sm_90"]):
        code, output = invoke_tuner(db, *args)
        assert code == 2, (args, output)
        assert "Traceback" not in output


def test_cancel_stops_a_running_sweep(tmp_path, db_url):
    spec = write_spec(tmp_path, "slow.yaml", kernel="fault_probe", shapes=[{"n": 100}],
                      space={"MODE": ["slow"], "BLOCK": [16, 32, 64, 128, 256]}, strategy={"name": "grid"},
                      timing={**FAST_TIMING, "rep_ms": 300})
    sweep_id = queued(db_url, spec)
    env = {**os.environ, "TUNER_DB_URL": db_url, "RAY_ADDRESS": ""}
    server = subprocess.Popen([sys.executable, "-m", "tuner.cli", "serve", "--drain"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 240
    while not trials_of(db_url, sweep_id):
        assert server.poll() is None and time.monotonic() < deadline, "server finished no trial"
        time.sleep(0.5)
    # In-process: a CLI subprocess takes seconds to start on a loaded 2-core machine, while trials finish.
    assert invoke_tuner(db_url, "sweep", "cancel", str(sweep_id)) == (0, f"sweep {sweep_id}: cancelled\n")
    out, _ = server.communicate(timeout=120)
    assert f"sweep {sweep_id}: cancelled" in out
    assert len(trials_of(db_url, sweep_id)) < 5  # it stopped before the grid was done
    code, listing = invoke_tuner(db_url, "sweep", "list")
    assert code == 0 and "fault_probe" in listing and "cancelled" in listing


def test_commands_in_one_process_each_reach_their_own_database(tmp_path):
    """The CLI keeps an engine per URL: a second in-process command with another --db must not reuse
    the first one's (the cancel test above once made a later test's `serve` read its database)."""
    first, second = (f"sqlite:///{tmp_path / name}" for name in ("first.db", "second.db"))
    spec = write_spec(tmp_path, "one.yaml", kernel="fault_probe", shapes=[{"n": 100}], space={"MODE": ["ok"]},
                      strategy={"name": "grid"})
    assert invoke_tuner(first, "sweep", "list")[0] == 0
    assert invoke_tuner(second, "sweep", "queue", str(spec)) == (0, "1\n")
    with session_scope(open_database(first)) as session:
        assert session.scalars(select(Sweep)).all() == []
    with session_scope(open_database(second)) as session:
        assert [s.kernel for s in session.scalars(select(Sweep)).all()] == ["fault_probe"]


def test_a_local_ray_is_joined_only_while_its_head_answers(monkeypatch):
    """Ray's address file outlives a killed head; joining that address would wait for minutes."""
    import socket

    import ray._private.utils as ray_utils

    from workers.pool import running_local_ray

    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        monkeypatch.setattr(ray_utils, "read_ray_address", lambda temp_dir=None: address)
        assert running_local_ray() == address
    assert running_local_ray() is None  # the port closed with the head
    monkeypatch.setattr(ray_utils, "read_ray_address", lambda temp_dir=None: None)
    assert running_local_ray() is None

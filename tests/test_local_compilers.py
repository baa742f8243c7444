"""The pool's local compile processes: their protocol, their faults, and a sweep compiling ahead in them.

On the CPU a compile is a no-op (the interpreter has nothing to compile), so these check what goes where,
not what Triton makes of it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from sqlalchemy import select

from db import Trial, open_database, session_scope
from tests.cli_run import invoke_tuner
from workers.local_compilers import LocalCompile, LocalCompilers, local_compiler_count

INTERPRET = {**os.environ, "TRITON_INTERPRET": "1"}
SHAPE = {"tokens": 16, "hidden": 64}
CONFIG = {"BLOCK_M": 1, "BLOCK_D": 0, "num_warps": 1, "num_stages": 1}


def _answers(compilers: LocalCompilers, wanted: int, timeout_s: float = 120.0) -> list[tuple[LocalCompile, dict]]:
    answers, deadline = [], time.monotonic() + timeout_s
    while len(answers) < wanted and time.monotonic() < deadline:
        answers += compilers.poll(1.0)
    return answers


def _until_ready(compilers: LocalCompilers, count: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(compilers.ready_times) < count and time.monotonic() < deadline:
        assert compilers.poll(1.0) == []  # nothing was asked yet
    assert len(compilers.ready_times) == count


def test_idle_processes_take_configs_and_answer_each_once():
    compilers = LocalCompilers.start(2, INTERPRET)
    try:
        assert compilers.submit("rmsnorm_fwd", SHAPE, CONFIG) is None  # still importing: none is idle
        _until_ready(compilers, 2)
        first = compilers.submit("rmsnorm_fwd", SHAPE, CONFIG)
        second = compilers.submit("rmsnorm_fwd", SHAPE, {**CONFIG, "num_warps": 2})
        assert {first.process, second.process} == {0, 1}
        assert compilers.submit("rmsnorm_fwd", SHAPE, CONFIG) is None  # both busy
        compilers.abandon(second)  # the benchmarking child took it: its answer is dropped
        answers = _answers(compilers, 1)
        assert [handle for handle, _ in answers] == [first] and answers[0][1]["status"] == "ok"
        assert answers[0][1]["seconds"] >= 0
        dropped, deadline = [], time.monotonic() + 120
        while compilers.busy() and time.monotonic() < deadline:
            dropped += compilers.poll(1.0)
        assert dropped == [] and not compilers.busy()  # the abandoned config's answer never surfaced
        unknown = compilers.submit("no_such_kernel", SHAPE, CONFIG)
        [(handle, result)] = _answers(compilers, 1)
        assert handle is unknown and result["status"] == "compile_error" and "no_such_kernel" in result["error"]
    finally:
        compilers.close()
    assert not compilers.busy() and compilers.submit("rmsnorm_fwd", SHAPE, CONFIG) is None


def test_the_processes_yield_the_cores_to_the_benchmarking_child():
    """A lower priority than the pool's, and torch kept to one thread: the environment it was started with."""
    from workers.compile_server import NICENESS

    compilers = LocalCompilers.start(1, INTERPRET)
    try:
        _until_ready(compilers, 1)
        [pid] = compilers.pids
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(os.getpriority(os.PRIO_PROCESS, 0) + NICENESS, 19)
        with open(f"/proc/{pid}/environ", "rb") as environ:
            assert b"OMP_NUM_THREADS=1" in environ.read().split(b"\0")
    finally:
        compilers.close()


def _fake(*behaviours: str) -> LocalCompilers:
    """Stand-in compile processes forked by the real zygote (``tests.fake_compile_server``)."""
    return LocalCompilers.start(len(behaviours), {**INTERPRET, "FAKE_COMPILERS": ",".join(behaviours)},
                                server="tests.fake_compile_server")


def _ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # dead, its parent yet to reap it
    except FileNotFoundError:
        return True


def test_a_process_that_dies_mid_compile_answers_crash_and_a_killed_one_is_gone():
    """Also: a line on an answer pipe that is no answer (a library talking) is passed over."""
    compilers = _fake("die", "wait")
    try:
        _until_ready(compilers, 2)
        assert sorted(compilers.ready_times) == [1.0, 2.0]
        dying = compilers.submit("k", SHAPE, CONFIG)
        hanging = compilers.submit("k", SHAPE, CONFIG)
        [(handle, result)] = _answers(compilers, 1)
        assert handle is dying and result["status"] == "crash" and "died" in result["error"]
        hanging_pid = compilers.pids[1]
        compilers.kill(hanging)  # past its time limit
        assert not compilers.busy() and compilers.submit("k", SHAPE, CONFIG) is None  # neither is left
        deadline = time.monotonic() + 30
        while not _ended(hanging_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ended(hanging_pid)
    finally:
        compilers.close()


def test_a_first_problem_that_fails_to_compile_leaves_the_process_serving():
    compilers = LocalCompilers.start(1, INTERPRET, {"kernel": "no_such_kernel", "shape": SHAPE})
    try:
        _until_ready(compilers, 1)
        handle = compilers.submit("rmsnorm_fwd", SHAPE, CONFIG)
        [(answered, result)] = _answers(compilers, 1)
        assert answered is handle and result["status"] == "ok"
    finally:
        compilers.close()


def _cubins(cache: pathlib.Path) -> set[str]:
    """The compiled kernels in a Triton cache: one folder, named by its key, each."""
    return {path.parent.name for path in cache.rglob("*.cubin")}


def test_on_an_nvidia_host_they_compile_for_its_arch_without_opening_it(tmp_path):
    """``nvidia-smi`` names one arch (a stand-in here, on a host without a GPU): the zygote compiles the
    sweep's first config for it once, before forking, and each process then compiles the configs it is
    handed for that arch into Triton's cache, which a launch on the GPU reads (docs/findings.md)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 9.0\n")
    (tools / "nvidia-smi").chmod(0o755)
    cache = tmp_path / "triton-cache"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "TRITON_CACHE_DIR": str(cache)}
    env.pop("TRITON_INTERPRET", None)
    compilers = LocalCompilers.start(2, env, {"kernel": "rmsnorm_fwd", "shape": SHAPE})
    try:
        _until_ready(compilers, 2)
        assert compilers.offline_arch == "sm_90"
        warmed = _cubins(cache)
        assert len(warmed) == 1  # the first config's, compiled by the zygote alone
        handles = [compilers.submit("rmsnorm_fwd", SHAPE, {**CONFIG, "num_warps": warps}) for warps in (2, 4)]
        answers = _answers(compilers, 2)
        assert {handle.process for handle, _ in answers} == {h.process for h in handles}
        assert [result["status"] for _, result in answers] == ["ok", "ok"]
        assert len(_cubins(cache) - warmed) == 2
    finally:
        compilers.close()


@pytest.mark.parametrize("listed, arch", [("9.0\n", "sm_90"), ("9.0\n9.0\n", "sm_90"), ("9.0\n10.0\n", None),
                                          ("[N/A]\n", None), ("", None)])
def test_the_arch_compiled_for_is_the_one_every_gpu_has(listed: str, arch: str | None) -> None:
    from workers.compile_server import _queried_arch

    query = subprocess.Popen(["printf", listed], stdout=subprocess.PIPE, text=True)
    assert _queried_arch(query) == arch


def test_no_arch_where_nvidia_smi_fails_or_is_missing() -> None:
    from workers.compile_server import _queried_arch

    assert _queried_arch(subprocess.Popen(["false"], stdout=subprocess.PIPE, text=True)) is None
    assert _queried_arch(None) is None


def test_kill_all_ends_every_process_at_once_and_close_reaps_them():
    """Ready or still warming up: the zygote ends them all on the pool's word, and reaps them."""
    compilers = _fake("wait", "wait", "mute")
    _until_ready(compilers, 2)
    pids = compilers.pids
    compilers.kill_all()
    assert not compilers.busy() and compilers.submit("k", SHAPE, CONFIG) is None
    deadline = time.monotonic() + 30
    while not all(map(_ended, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(map(_ended, pids))  # ended by the signal, before close() was called
    compilers.close()
    assert compilers._zygote.returncode == 0  # it reaped every child, the one never ready too, and ended


def test_one_compile_process_a_core_less_two_at_most_sixteen():
    assert [local_compiler_count(cpus) for cpus in (1, 2, 4, 16, 64)] == [1, 1, 2, 14, 16]


def test_a_sweep_compiles_ahead_in_the_local_processes(tmp_path, db_url, local_ray, monkeypatch):
    from tuner.sweep.runner import SweepRunner
    from workers.pool import WorkerPool

    started: list[LocalCompilers] = []
    start = WorkerPool.start.__func__

    def start_with_local_compilers(cls, *args, **kwargs):  # as on a GPU host, which this machine is not
        pool = start(cls, *args, **kwargs)
        pool.local_compilers = LocalCompilers.start(2, INTERPRET, {"kernel": "rmsnorm_fwd", "shape": SHAPE})
        started.append(pool.local_compilers)
        # ready before the sweep, as on a GPU host, where they start before Ray: here they start after the
        # pool, and on a loaded machine a sweep of six interpreted configs could end before they were up
        _until_ready(pool.local_compilers, 2)
        return pool

    monkeypatch.setattr(WorkerPool, "start", classmethod(start_with_local_compilers))
    monkeypatch.setattr(SweepRunner, "_compiles_ahead", lambda self, state: True)
    spec = tmp_path / "grid.yaml"
    spec.write_text(json.dumps({
        "kernel": "rmsnorm_fwd", "shapes": [SHAPE], "strategy": {"name": "grid"},
        "space": {"BLOCK_M": [1, 2, 4], "BLOCK_D": [0], "num_warps": [1, 2], "num_stages": [1]},
        "timing": {"warmup_ms": 1, "rep_ms": 5, "retime_rounds": 1, "retime_top": 2, "trial_timeout_s": 60}}))
    code, out = invoke_tuner(db_url, "sweep", "run", str(spec))
    assert code == 0 and "done" in out, out
    with session_scope(open_database(db_url)) as session:
        rows = session.scalars(select(Trial)).all()
        statuses = [t.status for t in rows]
        compiled_ahead = [t.metrics["compile_s"] for t in rows if "compile_s" in t.metrics]
    assert statuses and set(statuses) <= {"ok", "pruned"} and "ok" in statuses
    [compilers] = started
    assert compilers.answered >= 1  # configs the processes compiled for the sweep
    # each config a compile process answered for keeps the seconds its compile took (or some went to Ray's tasks)
    assert compiled_ahead and all(seconds >= 0 for seconds in compiled_ahead)
    assert not compilers.busy() and compilers.submit("rmsnorm_fwd", SHAPE, CONFIG) is None  # closed with the pool



@pytest.mark.parametrize("result, to_ready, worker_failed", [
    ({"status": "ok"}, True, False),
    ({"status": "compile_error", "error": "out of resources"}, False, False),
    ({"status": "crash", "error": "worker failed: SystemError: bad call flags"}, True, True),
    ({"status": "crash", "error": "the local compile process died (exit code -9)"}, True, True),
])
def test_only_a_compile_error_is_the_configs_own(result, to_ready, worker_failed):
    """A compile worker that died answers for no config: the device worker's child compiles it, and no
    trial is recorded as a crash for it (a cancelled Ray compile task cut short its worker's torch import,
    and a good config was recorded as crashed)."""
    from collections import deque

    from tuner.sweep.runner import route_compiled

    from types import SimpleNamespace

    pending, ready, finished = SimpleNamespace(compile_s=None), deque(), []
    assert route_compiled(pending, {**result, "seconds": 0.25}, ready, finished) is worker_failed
    answer = {**result, "seconds": 0.25}
    assert (list(ready), finished) == (([pending], []) if to_ready else ([], [(pending, answer, None)]))
    assert pending.compile_s == 0.25  # the compile's seconds stay with the config, for its trial's metrics


def test_ray_compile_workers_yield_the_cores_to_the_local_processes_once():
    """A Ray compile worker lowers its priority below the local compile processes' (which are below the
    benchmarking child's), and by that much however many tasks it runs: ``os.nice`` adds at every call."""
    from workers import compile_server, compile_task

    assert compile_task.NICENESS > compile_server.NICENESS
    probe = ("import os; from workers.compile_task import yield_cores; before = os.getpriority(os.PRIO_PROCESS, 0); "
             "yield_cores(); yield_cores(); print(os.getpriority(os.PRIO_PROCESS, 0) - before, before)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    lowered, before = map(int, done.stdout.split())
    assert lowered == min(compile_task.NICENESS, 19 - before)

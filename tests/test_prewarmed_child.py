"""Pre-warmed benchmarking children: started before the pool's Ray, adopted by the device workers,
replaced like any child after a fault, and never left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workers.child_process import BenchProcess
from workers.prewarmed_child import spawn

INTERPRET = {"TRITON_INTERPRET": "1"}


def test_a_worker_adopts_the_prewarmed_child_and_starts_its_own_after_a_fault(tmp_path):
    path = str(tmp_path / "cpu-0.sock")
    child = spawn(path, {**os.environ, **INTERPRET})
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:  # bound at once; a pool's workers
        time.sleep(0.05)                                              # ask seconds later, after Ray's start
    bench = BenchProcess(INTERPRET, adopt_from=path)
    try:
        info = bench.request({"op": "describe"}, 120)
        assert info["arch"] == "interp" and bench.adopted
        assert not os.path.exists(path)  # taken: a restarted worker finds nothing to adopt
        fault = bench.request({"op": "no-such-op"}, 60)  # the child answers a crash and exits
        assert fault["status"] == "crash" and "no-such-op" in fault["error"]
        assert child.wait(timeout=60) in (0, -signal.SIGKILL)  # it exits after a fatal answer, or is ended
        assert bench.request({"op": "describe"}, 120)["arch"] == "interp"  # a child of the worker's own
        assert bench.restarts == 1 and isinstance(bench._proc, subprocess.Popen)
    finally:
        bench.close()
        child.kill()
        child.wait()


def _adopted(path: str, problem: dict | None) -> tuple[subprocess.Popen, BenchProcess]:
    child = spawn(path, {**os.environ, **INTERPRET}, problem)
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return child, BenchProcess(INTERPRET, adopt_from=path)


def test_a_prewarmed_child_prepares_the_sweeps_first_problem_before_it_is_adopted(tmp_path):
    problem = {"kernel": "rmsnorm_fwd", "shape": {"tokens": 33, "hidden": 64}, "seed": 3}
    child, bench = _adopted(str(tmp_path / "cpu-0.sock"), problem)
    try:
        assert bench.request({"op": "describe"}, 120)["arch"] == "interp" and bench.adopted
        assert bench.child_prepared["kernel"] == "rmsnorm_fwd" and bench.child_prepared["seconds"] > 0
        trial = bench.request({"op": "trial", "kernel": "rmsnorm_fwd", "shape": problem["shape"], "seed": 3,
                               "config": {"BLOCK_M": 4, "BLOCK_D": 0, "num_warps": 1, "num_stages": 1},
                               "atol": 1e-2, "rtol": 1e-2, "warmup_ms": 0, "rep_ms": 1}, 120)
        assert trial["status"] == "ok"
    finally:
        bench.close()
        child.kill()
        child.wait()


def test_a_problem_that_fails_to_prepare_leaves_the_child_serving(tmp_path):
    child, bench = _adopted(str(tmp_path / "cpu-0.sock"), {"kernel": "no_such_kernel", "shape": {"n": 1}})
    try:
        assert bench.request({"op": "describe"}, 120)["arch"] == "interp" and bench.adopted
        assert "no_such_kernel" in bench.child_prepared["error"]
    finally:
        bench.close()
        child.kill()
        child.wait()


def test_a_worker_with_no_prewarmed_child_to_reach_starts_its_own(tmp_path):
    bench = BenchProcess(INTERPRET, adopt_from=str(tmp_path / "nobody.sock"))
    try:
        assert bench.request({"op": "describe"}, 120)["arch"] == "interp"
        assert not bench.adopted and bench.restarts == 0
    finally:
        bench.close()


POOL = """
import json, os
from workers.pool import WorkerPool
problem = {"kernel": "rmsnorm_fwd", "shape": {"tokens": 16, "hidden": 32}, "seed": 0}
pool = WorkerPool.start(cpu_workers=2, num_cpus=2, first_problem=problem)  # a Ray of its own: children pre-warmed
children = list(pool.prewarmed.children.values())
folder = pool.prewarmed.folder
adopted = [info["adopted"] for info in pool.infos]
prepared = [info["child_prepared"]["kernel"] for info in pool.infos]
from ray._private import ray_constants, worker
monitor = worker._global_node.all_processes[ray_constants.PROCESS_TYPE_MONITOR][0].process
pool.shutdown()
print(json.dumps({"adopted": adopted, "prepared": prepared, "own_ray": pool.own_ray, "folder_left": os.path.exists(folder),
                  "children_running": [c.poll() is None for c in children], "monitor_running": monitor.poll() is None,
                  "milestones": sorted(pool.milestones), "ready_in_start": 0 < pool.milestones["children_ready_s"] < sum(pool.timings.values())}))
"""


def test_a_pool_with_its_own_ray_hands_each_worker_a_prewarmed_child_and_leaves_none_running(tmp_path):
    env = {**os.environ, **INTERPRET, "RAY_ADDRESS": ""}
    out = subprocess.run([sys.executable, "-c", POOL], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"adopted": [True, True], "prepared": ["rmsnorm_fwd", "rmsnorm_fwd"], "own_ray": True,
                      "folder_left": False, "children_running": [False, False], "monitor_running": False,
                      "milestones": ["actors_started_s", "child_device_s", "child_import_s", "children_ready_s",
                                     "first_problem_prepared_s"],
                      "ready_in_start": True}


def test_a_dead_pools_prewarm_folder_is_removed_by_the_next_pool(tmp_path, monkeypatch):
    import tempfile

    from workers import pool

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{pool.PREWARM_PREFIX}{int(dead.stdout)}-abc"
    alive = tmp_path / f"{pool.PREWARM_PREFIX}{os.getpid()}-def"
    stale.mkdir()
    alive.mkdir()
    children = pool.PrewarmedChildren.start(cpu_workers=1)
    try:
        assert not stale.exists() and alive.exists()
        assert os.path.dirname(children.folder) == str(tmp_path)
    finally:
        children.close()
    assert not os.path.exists(children.folder)


def test_a_prewarmed_child_ends_when_the_pool_that_started_it_dies(tmp_path):
    """A pool killed during its start (before any worker adopts) leaves no child holding a device."""
    path = str(tmp_path / "cpu-0.sock")
    pool = subprocess.Popen([sys.executable, "-c", f"""
import os, sys
from workers.prewarmed_child import spawn
child = spawn({path!r}, {{**os.environ, "TRITON_INTERPRET": "1"}})
print(child.pid, flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child_pid = int(pool.stdout.readline())
    pool.kill()
    pool.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # gone, or a zombie nobody has reaped yet (state Z): it runs no more either way
            if Path(f"/proc/{child_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.2)
    raise AssertionError(f"pre-warmed child {child_pid} outlived its pool by 30 s")


def test_a_sweeps_first_problem_is_its_first_explicit_shape_and_its_input_seed():
    from tuner.sweep.spec import first_problem, parse_spec

    spec = parse_spec({"kernel": "rmsnorm_fwd", "shapes": [{"tokens": 64, "hidden": 128}, {"tokens": 8, "hidden": 64}],
                       "timing": {"input_seed": 7}}, "early")
    assert first_problem(spec) == {"kernel": "rmsnorm_fwd", "shape": {"tokens": 64, "hidden": 128}, "seed": 7}
    assert first_problem(parse_spec({"kernel": "rmsnorm_fwd", "shapes": "v4-flash"}, "early")) is None


def test_the_compile_workers_readiness_is_the_last_warm_up_counted_from_the_pools_start(monkeypatch):
    import ray

    from workers.pool import WorkerPool

    asked = []
    monkeypatch.setattr(ray, "get", lambda refs, timeout: asked.append(refs) or [103.5, 107.25])
    pool = WorkerPool(workers=[], infos=[], compile_ahead=True, compile_slots=2, runtime_env={},
                      warming=["warm-up 1", "warm-up 2"], started_at=100.0)
    pool.note_compile_workers_ready()
    assert asked == [["warm-up 1", "warm-up 2"]] and pool.milestones == {"compile_workers_ready_s": 7.25}
    idle = WorkerPool(workers=[], infos=[], compile_ahead=False, compile_slots=1, runtime_env={})
    idle.note_compile_workers_ready()  # the interpreter's pool warms no compile workers: nothing to wait for
    assert idle.milestones == {}

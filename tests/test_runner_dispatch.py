"""``tuner.sweep.runner.config_for_idle_worker``: what an idle device worker takes while configs compile ahead."""

from __future__ import annotations

from collections import deque

from tuner.sweep.runner import Pending, config_for_idle_worker
from tuner.sweep.strategies import Proposal


def _pending(name: str) -> Pending:
    return Pending(Proposal(config={"name": name}), identity=name)


def test_a_compiled_config_goes_first_and_nothing_is_cancelled() -> None:
    ready, compiling = deque([_pending("compiled")]), {"task-a": _pending("a")}
    pending, task = config_for_idle_worker(ready, compiling, compile_workers_warm=False)
    assert pending.identity == "compiled" and task is None and list(compiling) == ["task-a"]


def test_while_the_compile_workers_warm_up_the_worker_takes_the_newest_config_to_compile_itself() -> None:
    compiling = {"task-a": _pending("a"), "task-b": _pending("b"), "task-c": _pending("c")}
    pending, task = config_for_idle_worker(deque(), compiling, compile_workers_warm=False)
    assert (pending.identity, task) == ("c", "task-c") and list(compiling) == ["task-a", "task-b"]


def test_once_they_are_warm_an_idle_worker_waits_for_their_compiles() -> None:
    compiling = {"task-a": _pending("a")}
    assert config_for_idle_worker(deque(), compiling, compile_workers_warm=True) is None
    assert list(compiling) == ["task-a"]
    assert config_for_idle_worker(deque(), {}, compile_workers_warm=False) is None

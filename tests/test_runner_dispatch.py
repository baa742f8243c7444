"""``tuner.sweep.runner``: what an idle device worker takes while configs compile ahead (``config_for_idle_worker``),
and which trials the log names as holding their worker (``overdue``)."""

from __future__ import annotations

from collections import deque

from tuner.sweep.runner import SLOW_TRIAL_S, Pending, config_for_idle_worker, overdue
from tuner.sweep.strategies import Proposal


def _pending(name: str) -> Pending:
    return Pending(Proposal(config={"name": name}), identity=name)


def test_a_compiled_config_goes_first_and_nothing_is_cancelled() -> None:
    ready, compiling = deque([_pending("compiled")]), {"task-a": _pending("a")}
    pending, task = config_for_idle_worker(ready, compiling)
    assert pending.identity == "compiled" and task is None and list(compiling) == ["task-a"]


def test_with_nothing_compiled_the_worker_takes_the_newest_config_and_its_task_is_cancelled() -> None:
    compiling = {"task-a": _pending("a"), "task-b": _pending("b"), "task-c": _pending("c")}
    pending, task = config_for_idle_worker(deque(), compiling)
    assert (pending.identity, task) == ("c", "task-c") and list(compiling) == ["task-a", "task-b"]
    assert config_for_idle_worker(deque(), {}) is None


def test_a_trial_benchmarking_past_the_threshold_is_named_once() -> None:
    quick, slow, queued = _pending("quick"), _pending("slow"), _pending("queued")
    quick.dispatched, slow.dispatched = 100.0, 100.0 - SLOW_TRIAL_S  # queued was never dispatched
    assert overdue([quick, slow, queued], now=100.0 + 1.0) == [slow]
    assert overdue([quick, slow, queued], now=100.0 + 2.0) == []  # reported already
    assert overdue([quick, slow, queued], now=100.0 + SLOW_TRIAL_S + 1.0) == [quick]

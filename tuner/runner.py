"""Run one claimed sweep on a worker pool: ask Optuna, prune, compile ahead, benchmark, record.

For each shape the runner keeps every device worker busy: it asks Optuna for configs
ahead of time, prunes those that violate the space's constraints, reuses results whose
identity was measured before, compiles the rest on CPU workers, and hands compiled configs
to idle device workers. Every finished trial is committed at once, so a killed server
loses nothing it measured; a restarted one re-runs only the trials that were in flight.
When a shape is done, its best configs are re-timed together on every device worker and
the winner is taken from that re-timing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
import ray
from sqlalchemy import Engine, select, update

from db import Sweep, SweepStatus, Trial, TrialStatus, session_scope
from db.models import utcnow
from kernels import registry
from tuner import queue
from tuner.identity import config_identity
from tuner.spec import SweepSpec
from tuner.strategies import make_sampler, suggest_config
from workers.compile_task import compile_config
from workers.pool import WorkerPool

HEARTBEAT_EVERY_S = 5.0
MEASURED = [s.value for s in TrialStatus if s is not TrialStatus.pruned]
ProgressFn = Callable[[str, int, int, float | None], None]


@dataclass
class Pending:
    """A config on its way through compile and benchmark."""

    number: int
    config: dict[str, Any]
    identity: str
    submitted: float = field(default_factory=time.monotonic)
    started_at: datetime | None = None


@dataclass
class ShapeState:
    shape: dict[str, int]
    key: str
    study: optuna.Study
    dimensions: dict[str, list[Any]]
    evaluated: int = 0
    pruned: int = 0
    asked: int = 0
    best_ms: float | None = None


class SweepStopped(Exception):
    """The sweep was cancelled or taken over by another server."""


class SweepRunner:
    """Runs one sweep that ``owner`` has claimed."""

    def __init__(self, engine: Engine, storage: optuna.storages.BaseStorage, sweep_id: int,
                 owner: str, pool: WorkerPool, on_progress: ProgressFn | None = None) -> None:
        self.engine, self.storage, self.sweep_id, self.owner, self.pool = engine, storage, sweep_id, owner, pool
        self.on_progress = on_progress or (lambda *_: None)
        sweep = queue.get_sweep(engine, sweep_id)
        self.spec = SweepSpec.model_validate(sweep.spec)
        self.kernel = registry.get(self.spec.kernel)
        self.arch = pool.arch
        if self.spec.arch not in ("auto", self.arch):
            raise ValueError(f"sweep {sweep_id} asks for arch {self.spec.arch} but the workers run {self.arch}")
        self.space = self.spec.search_space()
        self.toolchain = pool.toolchain
        self.atol, self.rtol = self.spec.tolerances()
        self.deadline = (time.monotonic() + self.spec.budget.max_minutes * 60) if self.spec.budget.max_minutes else None
        self._last_beat = 0.0

    # -- the sweep ---------------------------------------------------------------------
    def run(self) -> SweepStatus:
        """Run every shape, then mark the sweep done; ``cancelled`` if it was stopped."""
        with session_scope(self.engine) as session:
            session.execute(update(Sweep).where(Sweep.id == self.sweep_id).values(arch=self.arch))
        try:
            for shape in self.spec.resolved_shapes():
                state = self._open_shape(shape)
                self._search(state)
                self._retime(state)
        except SweepStopped:
            return SweepStatus.cancelled
        queue.finish(self.engine, self.sweep_id, self.owner, SweepStatus.done)
        return SweepStatus.done

    def _beat(self) -> None:
        if time.monotonic() - self._last_beat < HEARTBEAT_EVERY_S:
            return
        self._last_beat = time.monotonic()
        if not queue.heartbeat(self.engine, self.sweep_id, self.owner):
            raise SweepStopped()

    def _open_shape(self, shape: dict[str, int]) -> ShapeState:
        key = self.kernel.shape_key(shape)
        dimensions = self.space.dimensions(self.arch)
        sampler = make_sampler(self.spec.strategy.name, dimensions, self.spec.strategy.seed)
        study = optuna.create_study(storage=self.storage, sampler=sampler, direction="minimize",
                                    study_name=f"sweep-{self.sweep_id}/{self.kernel.name}/{key}", load_if_exists=True)
        state = ShapeState(shape, key, study, dimensions)
        with session_scope(self.engine) as session:
            rows = session.scalars(select(Trial).where(Trial.sweep_id == self.sweep_id, Trial.shape_key == key)).all()
            state.pruned = sum(r.status == TrialStatus.pruned.value for r in rows)
            state.evaluated = len(rows) - state.pruned
            ok = [r.median_ms for r in rows if r.status == TrialStatus.ok.value]
            state.best_ms = min(ok) if ok else None
        state.asked = len(study.get_trials(deepcopy=False))
        return state

    # -- search loop -------------------------------------------------------------------
    def _budget_total(self, state: ShapeState) -> int:
        return self.spec.trial_budget(self.arch)

    def _may_ask(self, state: ShapeState, inflight: int) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            return False
        if state.evaluated + inflight >= self._budget_total(state):
            return False
        grid = self.space.size(self.arch)
        if self.spec.strategy.name == "grid":
            return state.asked < grid
        return state.asked < 20 * self._budget_total(state) + grid

    def _search(self, state: ShapeState) -> None:
        ready: deque[Pending] = deque()
        compiling: dict[Any, Pending] = {}
        benching: dict[Any, tuple[Pending, int]] = {}
        idle = list(range(len(self.pool.workers)))
        lookahead = 2 * len(idle) + (min(self.pool.compile_slots, 16) if self.pool.compile_ahead else 0)
        timeout_s = self.spec.timing.trial_timeout_s
        compile_env = self.pool.compile_runtime_env()

        def admit(pending: Pending) -> None:
            if self.pool.compile_ahead:
                ref = compile_config.options(runtime_env=compile_env).remote(self.kernel.name, state.shape, pending.config)
                compiling[ref] = pending
            else:
                ready.append(pending)

        for pending in self._resume_running(state):
            admit(pending)
        self._report(state)
        while True:
            self._beat()
            while len(ready) + len(compiling) + len(benching) < lookahead and self._may_ask(
                state, len(ready) + len(compiling) + len(benching)
            ):
                pending = self._ask(state)
                if pending is not None:
                    admit(pending)
            while idle and ready:
                pending, worker = ready.popleft(), idle.pop()
                pending.started_at = utcnow()
                request = {"kernel": self.kernel.name, "shape": state.shape, "config": pending.config,
                           "seed": self.spec.timing.input_seed, "atol": self.atol, "rtol": self.rtol,
                           "warmup_ms": self.spec.timing.warmup_ms, "rep_ms": self.spec.timing.rep_ms}
                benching[self.pool.workers[worker].run_trial.remote(request, timeout_s)] = (pending, worker)
            if not (ready or compiling or benching):
                return
            done, _ = ray.wait([*compiling, *benching], num_returns=1, timeout=1.0)
            for ref in done:
                if ref in compiling:
                    pending = compiling.pop(ref)
                    result = self._get(ref)
                    if result["status"] == "ok":
                        ready.append(pending)
                    else:
                        self._record(state, pending, result, worker=None)
                else:
                    pending, worker = benching.pop(ref)
                    idle.append(worker)
                    self._record(state, pending, self._get(ref), worker)
            for ref, pending in list(compiling.items()):
                if time.monotonic() - pending.submitted > timeout_s:
                    ray.cancel(ref, force=True)
                    del compiling[ref]
                    self._record(state, pending, {"status": "compile_error",
                                                  "error": f"compilation took over {timeout_s:.0f} s"}, worker=None)

    @staticmethod
    def _get(ref: Any) -> dict[str, Any]:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            return {"status": "crash", "error": f"worker failed: {exc}"[:4000]}

    def _resume_running(self, state: ShapeState) -> list[Pending]:
        """Trials a killed server left running: tell those already recorded, re-run the rest."""
        pending = []
        for trial in state.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if set(trial.params) != set(state.dimensions):
                state.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                continue
            identity = config_identity(self.kernel.name, state.key, self.arch, trial.params, self.toolchain)
            if not self._reuse(state, trial.number, trial.params, identity, this_sweep_only=True):
                pending.append(Pending(trial.number, dict(trial.params), identity))
        return pending

    def _ask(self, state: ShapeState) -> Pending | None:
        """Ask Optuna for one config; None when it was pruned or answered from the database."""
        trial = state.study.ask()
        state.asked += 1
        config = suggest_config(trial, state.dimensions)
        identity = config_identity(self.kernel.name, state.key, self.arch, config, self.toolchain)
        reason = self.space.violation(config, state.shape, self.arch)
        if reason:
            self._write_row(state, Pending(trial.number, config, identity), {"status": "pruned", "error": reason}, None)
            state.pruned += 1
            state.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self._report(state)
            return None
        if self._reuse(state, trial.number, config, identity, this_sweep_only=False):
            return None
        return Pending(trial.number, config, identity)

    def _reuse(self, state: ShapeState, number: int, config: dict[str, Any], identity: str, this_sweep_only: bool) -> bool:
        """Answer a trial from an earlier measurement of the same identity; True if one existed."""
        with session_scope(self.engine) as session:
            query = select(Trial).where(Trial.identity == identity, Trial.status.in_(MEASURED))
            if this_sweep_only:
                query = query.where(Trial.sweep_id == self.sweep_id)
            previous = session.scalars(query.order_by(Trial.id).limit(1)).first()
            if previous is None:
                return False
            if previous.sweep_id != self.sweep_id or previous.shape_key != state.key:
                session.add(Trial(
                    sweep_id=self.sweep_id, kernel=self.kernel.name, shape_key=state.key, arch=self.arch,
                    config=config, identity=identity, status=previous.status, median_ms=previous.median_ms,
                    p20_ms=previous.p20_ms, p80_ms=previous.p80_ms, reps=previous.reps,
                    metrics={**previous.metrics, "reused_from": previous.id}, error=previous.error,
                    host=previous.host, gpu_name=previous.gpu_name, sm_count=previous.sm_count,
                    versions=previous.versions, started_at=None))
                state.evaluated += 1
            status, median = previous.status, previous.median_ms
        self._tell(state, number, status, median)
        return True

    def _tell(self, state: ShapeState, number: int, status: str, median_ms: float | None) -> None:
        if status == TrialStatus.ok.value:
            state.study.tell(number, median_ms)
            state.best_ms = median_ms if state.best_ms is None else min(state.best_ms, median_ms)
        else:
            state.study.tell(number, state=optuna.trial.TrialState.FAIL)
        self._report(state)

    def _write_row(self, state: ShapeState, pending: Pending, result: dict[str, Any], worker: int | None) -> None:
        info = self.pool.infos[worker] if worker is not None else {}
        with session_scope(self.engine) as session:
            session.add(Trial(
                sweep_id=self.sweep_id, kernel=self.kernel.name, shape_key=state.key, arch=self.arch,
                config=pending.config, identity=pending.identity, status=result["status"],
                median_ms=result.get("median_ms"), p20_ms=result.get("p20_ms"), p80_ms=result.get("p80_ms"),
                reps=result.get("reps"), error=result.get("error"),
                metrics={**result.get("metrics", {}), **({"busy_s": result["busy_s"]} if "busy_s" in result else {})},
                host=info.get("host"), gpu_name=info.get("gpu_name"), sm_count=info.get("sm_count"),
                versions=self.toolchain, started_at=pending.started_at))

    def _record(self, state: ShapeState, pending: Pending, result: dict[str, Any], worker: int | None) -> None:
        """Commit a finished trial, then tell Optuna (a kill in between only repeats the tell)."""
        self._write_row(state, pending, result, worker)
        state.evaluated += 1
        self._tell(state, pending.number, result["status"], result.get("median_ms"))

    def _report(self, state: ShapeState) -> None:
        done = state.evaluated + (state.pruned if self.spec.budget_counts_pruned else 0)
        self.on_progress(state.key, done, self._budget_total(state), state.best_ms)

    # -- re-timing of the best configs -------------------------------------------------
    def _retime(self, state: ShapeState) -> None:
        """Time the best few configs together on every device worker; mark the winner."""
        with session_scope(self.engine) as session:
            rows = session.scalars(
                select(Trial).where(Trial.sweep_id == self.sweep_id, Trial.shape_key == state.key,
                                    Trial.status == TrialStatus.ok.value).order_by(Trial.median_ms)
            ).all()
            best: dict[str, Trial] = {}
            for row in rows:
                best.setdefault(row.identity, row)
            candidates = list(best.values())[: self.spec.timing.retime_top]
            if not candidates:
                return
            per_worker: list[list[float]] = []
            if len(candidates) > 1:
                request = {"kernel": self.kernel.name, "shape": state.shape, "configs": [c.config for c in candidates],
                           "seed": self.spec.timing.input_seed, "rounds": self.spec.timing.retime_rounds,
                           "warmup_ms": self.spec.timing.warmup_ms, "rep_ms": self.spec.timing.rep_ms}
                timeout = self.spec.timing.trial_timeout_s * len(candidates)
                answers = [self._get(r) for r in [w.retime.remote(request, timeout) for w in self.pool.workers]]
                per_worker = [a["medians_ms"] for a in answers if a.get("status") == "ok"]
            session.execute(update(Trial).where(Trial.sweep_id == self.sweep_id, Trial.shape_key == state.key)
                            .values(is_winner=False))
            for i, row in enumerate(candidates):
                samples = sorted(w[i] for w in per_worker)
                if samples:
                    row.retime_ms = samples[len(samples) // 2]
                    row.metrics = {**row.metrics, "retime_per_worker_ms": samples}
            winner = min(candidates, key=lambda r: r.retime_ms if r.retime_ms is not None else r.median_ms)
            winner.is_winner = True

"""Run one claimed sweep on a worker pool: propose, prune, compile ahead, benchmark, record.

For each shape the runner keeps every device worker busy. It takes configs from the
strategy ahead of time, prunes those that violate the space's constraints, answers those
whose identity was measured before from the database, compiles the rest on CPU workers and
hands compiled configs to idle device workers; a worker that falls idle with nothing compiled
takes the newest config waiting for them and compiles it itself (``config_for_idle_worker``). Finished
benchmarks free their worker before any bookkeeping, and every finished trial is committed
at once, so a killed server loses nothing it measured and a restarted one re-runs only the
trials that were in flight. When a shape is done, its best configs are re-timed together
on every device worker with the longer re-timing settings, and the winner is taken from
that re-timing.

A worker that dies under a trial (its node lost, its process killed) is a fault of the
cluster, not of the config: the config goes back to the front of the line for another
worker (``MAX_REQUEUES`` times), and the dead worker gets trials again once Ray has
restarted it. The claim's lease is renewed from a thread (``queue.Lease``) through every
phase; a runner whose lease is gone stops. A proposal whose identity this sweep recorded
already (a server killed between recording a trial and telling the search) is answered
from the record, never measured again.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
import ray
from sqlalchemy import Engine, case, select, update
from sqlalchemy.orm import Session

from db import Sweep, SweepStatus, Trial, TrialStatus, retrying, session_scope
from db.models import utcnow
from tuner.sweep import queue
from tuner.sweep.identity import config_identity
from tuner.sweep.ranking import pick, screening_time, trial_time
from tuner.sweep.kernel_facts import KernelFacts, ShapeFacts
from tuner.sweep.spec import stored_spec
from tuner.sweep.strategies import ConfigSource, GridSource, OptunaSource, Proposal, default_in_space, make_sampler
from workers.compile_task import compile_config
from workers.local_compilers import LocalCompile
from workers.pool import WorkerPool

# Times a config goes back in line after the worker measuring it died, before it is recorded as a crash.
MAX_REQUEUES = 2
PING_EVERY_S = 2.0  # how often a dead worker is asked whether Ray has restarted it
# Compile workers hold a copy of the inputs on the GPU; all of them together may use this
# share of its memory, else the benchmarking children compile for themselves.
COMPILE_MEMORY_SHARE = 0.25
# Verdicts another sweep may reuse: a time, and a compiler's refusal, are fixed by the identity.
# A wrong output depends on the tolerance, and a crash, a timeout or an out-of-memory compile
# can be the machine's state rather than the config's, so those are measured again.
REUSABLE = (TrialStatus.ok.value, TrialStatus.compile_error.value)
ProgressFn = Callable[[str, int, int, float | None], None]
log = logging.getLogger(__name__)


def _screening_metrics(trial: Trial) -> dict[str, Any]:
    """A trial's metrics without its re-timing's: a reuse is measured beside other rivals, if at all."""
    return {k: v for k, v in trial.metrics.items() if not k.startswith("retime_")}


def reusable_trial(session: Session, identity: str, own_sweep: int | None = None) -> Trial | None:
    """The first stored trial of ``identity`` whose verdict another sweep may take (see ``REUSABLE``);
    before any of them, ``own_sweep``'s own trial of it, whatever its verdict (one query for both)."""
    reusable = Trial.status.in_(REUSABLE) & (Trial.error.is_(None) | Trial.error.not_like("%OutOfMemoryError%"))
    own = Trial.sweep_id == (own_sweep if own_sweep is not None else -1)
    return session.scalars(
        select(Trial).where(Trial.identity == identity, reusable | own)
        .order_by(case((own, 0), else_=1), Trial.id).limit(1)
    ).first()


@dataclass
class Pending:
    """A proposal on its way through compile and benchmark."""

    proposal: Proposal
    identity: str
    submitted: float = field(default_factory=time.monotonic)
    started_at: datetime | None = None
    requeues: int = 0
    dispatched: float | None = None  # monotonic time its benchmark was handed to a device worker
    reported_slow: bool = False
    compile_s: float | None = None  # what its compile ahead took, where a compile process answered

    @property
    def config(self) -> dict[str, Any]:
        return self.proposal.config


LOCAL_POLL_S = 0.02  # how long the loop waits on Ray while a local compile process may answer
SLOW_TRIAL_S = 30.0  # a trial benchmarking this long is named in the log (its timeout is the spec's)


def overdue(pendings: list[Pending], now: float, after_s: float = SLOW_TRIAL_S) -> list[Pending]:
    """The trials benchmarking for over ``after_s`` seconds at monotonic time ``now`` that were not reported
    yet; each is returned once, so that a log names a trial that holds its worker, and only once."""
    late = [p for p in pendings if p.dispatched is not None and not p.reported_slow and now - p.dispatched > after_s]
    for pending in late:
        pending.reported_slow = True
    return late


def config_for_idle_worker(ready: deque[Pending], compiling: dict[Any, Pending]) -> tuple[Pending, Any] | None:
    """What an idle device worker takes, and the compile task to cancel when it takes a config to compile itself.

    A compiled config first. Else the newest config submitted to the compile workers, which most likely
    still waits in Ray's queue, compiled by the worker's benchmarking child itself: the compile workers
    do not keep one H100 fed, so waiting for them left it idle (83% busy against 95%), and the oldest
    config, which a child used to take, is the one a compile worker is about to finish
    (``docs/findings.md``).
    """
    if ready:
        return ready.popleft(), None
    if compiling:
        task = next(reversed(compiling))
        return compiling.pop(task), task
    return None


def route_compiled(pending: Pending, result: dict[str, Any], ready: deque[Pending], finished: list) -> bool:
    """Where a compile's answer sends its config: compiled, to the device workers (``ready``); a compile
    error, the config's own, to ``finished``. A compile worker that died or failed outside the compile (a
    cancel that cut its import short, the OS) says nothing of the config, which goes to the device workers
    too: their child compiles it and answers for it. True in that last case. The compile's seconds, where
    the answer has them, stay with the config (``compile_s`` in its trial's metrics)."""
    pending.compile_s = result.get("seconds")
    if result["status"] == "compile_error":
        finished.append((pending, result, None))
        return False
    ready.append(pending)
    return result["status"] != "ok"


@dataclass
class ShapeState:
    facts: ShapeFacts  # the shape, its key and what its kernel says of it
    source: ConfigSource
    budget: int  # trials to evaluate: the sweep's budget, or every valid config where there are fewer
    evaluated: int = 0
    pruned: int = 0
    best_ms: float | None = None

    @property
    def shape(self) -> dict[str, int]:
        return self.facts.shape

    def note(self, result: dict[str, Any]) -> None:
        """Keep the best time of the shape's ok results (a trial's, or one reused)."""
        if result["status"] == TrialStatus.ok.value:
            median = result["median_ms"]
            self.best_ms = median if self.best_ms is None else min(self.best_ms, median)

    @property
    def key(self) -> str:
        return self.facts.key


class SweepStopped(Exception):
    """The sweep was cancelled or taken over by another server."""


class SweepRunner:
    """Runs one sweep that ``owner`` has claimed."""

    def __init__(self, engine: Engine, storage: optuna.storages.BaseStorage, sweep_id: int,
                 owner: str, pool: WorkerPool, on_progress: ProgressFn | None = None,
                 lease_s: float = queue.DEFAULT_LEASE_S, facts: KernelFacts | None = None) -> None:
        """``facts``: the kernel's, when the caller read them already (else read here, importing the kernels)."""
        self.engine, self.storage, self.sweep_id, self.owner, self.pool = engine, storage, sweep_id, owner, pool
        self.lease_s = lease_s
        self.lease: queue.Lease | None = None
        # Dead workers: a ping of each -> its index, back in use when it answers; a worker whose ping
        # failed (Ray has not restarted it yet) waits in ``resting`` until its next ping is due.
        self.down: dict[Any, int] = {}
        self.resting: dict[int, float] = {}
        self.on_progress = on_progress or (lambda *_: None)
        sweep = queue.get_sweep(engine, sweep_id)
        self.spec = stored_spec(sweep.spec, sweep_id)  # checked against its kernel when it was queued
        self.facts = facts or KernelFacts.of(self.spec)
        self.arch = pool.arch
        if self.spec.arch not in ("auto", self.arch):
            raise ValueError(f"sweep {sweep_id} asks for arch {self.spec.arch} but the workers run {self.arch}")
        self.space = self.spec.search_space()
        self.dimensions = self.space.dimensions(self.arch)
        self.budget = self.spec.trial_budget(self.arch)
        # the kernel's code is part of what a stored timing measured (see tuner.sweep.identity)
        self.toolchain = {**pool.toolchain, "kernel_source": self.facts.source_version}
        self.atol, self.rtol = self.facts.tolerances(self.spec)
        self.timing = self.spec.timing
        self.deadline = (time.monotonic() + self.spec.budget.max_minutes * 60) if self.spec.budget.max_minutes else None

    # -- the sweep ---------------------------------------------------------------------
    def run(self) -> SweepStatus:
        """Run every shape, then mark the sweep done; ``cancelled`` if it was stopped."""
        with session_scope(self.engine) as session:
            session.execute(update(Sweep).where(Sweep.id == self.sweep_id).values(arch=self.arch))
        try:
            with queue.Lease(self.engine, self.sweep_id, self.owner, self.lease_s) as self.lease:
                for shape_facts in self.facts.shapes:
                    state = self._open_shape(shape_facts)
                    self._search(state)
                    self._retime(state)
                self._beat()
        except SweepStopped:
            return self._stopped()
        if not queue.finish(self.engine, self.sweep_id, self.owner, SweepStatus.done):
            return self._stopped()
        return SweepStatus.done

    def _stopped(self) -> SweepStatus:
        """The status of a sweep this runner no longer holds: cancelled, or run on by the server that took it."""
        sweep = queue.get_sweep(self.engine, self.sweep_id)
        if sweep.status == SweepStatus.running.value:
            log.warning("sweep %s: taken over by %s after this server's lease lapsed; stopped here", self.sweep_id,
                        sweep.owner)
        return SweepStatus(sweep.status)

    def _beat(self) -> None:
        """Stop when the lease is gone (the renewals run on the lease's own thread)."""
        if self.lease is not None and self.lease.lost:
            raise SweepStopped()

    def _identity(self, key: str, config: dict[str, Any]) -> str:
        return config_identity(self.facts.name, key, self.arch, config, self.toolchain, self.timing.method)

    def _open_shape(self, shape_facts: ShapeFacts) -> ShapeState:
        """Load what this sweep already recorded for the shape and set up its strategy."""
        shape, key = shape_facts.shape, shape_facts.key
        name = self.spec.strategy.name
        verdicts = [(config, self.space.violation(config, shape, self.arch)) for config in self.space.grid(self.arch)]
        valid_configs = [config for config, reason in verdicts if reason is None]
        sampled = name != "grid" and bool(valid_configs)  # else walked as a grid, below
        study = optuna.create_study(
            storage=self.storage, direction="minimize", load_if_exists=True,
            sampler=make_sampler(name, self.spec.strategy.seed, valid_configs, self.dimensions) if sampled else None,
            study_name=f"sweep-{self.sweep_id}/{self.facts.name}/{key}")
        with session_scope(self.engine) as session:
            rows = session.scalars(select(Trial).where(Trial.sweep_id == self.sweep_id, Trial.shape_key == key)).all()
            recorded = {r.identity for r in rows}
            ok = [r.median_ms for r in rows if r.status == TrialStatus.ok.value]
            pruned = sum(r.status == TrialStatus.pruned.value for r in rows)
            evaluated = len(rows) - pruned
        valid = len(valid_configs)
        # A budget of half the shape's valid configs or more walks them as a grid does, in shuffled
        # order: a sampler would spend most of it on the few configs it models worst. An uncapped
        # grid counts its pruned points too, so its budget stays the whole grid.
        budget = self.budget if self.spec.budget_counts_pruned else min(self.budget, valid)
        if name == "grid" or 2 * budget >= valid:
            remaining, newly_pruned = [], []
            for config, reason in verdicts:
                identity = self._identity(key, config)
                if identity in recorded:
                    continue
                if reason:
                    newly_pruned.append((config, identity, reason))
                else:
                    remaining.append(config)
            self._write_pruned(key, newly_pruned)
            pruned += len(newly_pruned)
            source: ConfigSource = GridSource(study, self.dimensions, remaining, self.spec.strategy.seed,
                                              first=default_in_space(shape_facts.default, self.space, shape, self.arch))
        else:
            source = OptunaSource(study, self.dimensions, max_asks=20 * self.budget + self.space.size(self.arch))
            default = default_in_space(shape_facts.default, self.space, shape, self.arch)
            if default is not None and not study.get_trials(deepcopy=False):
                study.enqueue_trial(default)
        return ShapeState(shape_facts, source, budget, evaluated=evaluated, pruned=pruned,
                          best_ms=min(ok) if ok else None)

    # -- search loop -------------------------------------------------------------------
    def _stop_over_ms(self, state: ShapeState) -> float | None:
        """The probe median over which a trial stops after its probe: the spec's cut-off times the shape's
        best so far (``workers.timing.screen``). None before a best, without a cut-off, and under rank eager."""
        cutoff = self.timing.probe_cutoff
        if cutoff is None or state.best_ms is None or self.timing.rank == "eager":
            return None
        return cutoff * state.best_ms

    def _may_propose(self, state: ShapeState, inflight: int) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            return False
        return state.evaluated + inflight < state.budget

    def _compiles_ahead(self, state: ShapeState) -> bool:
        """Whether CPU workers compile ahead: a GPU pool, and every worker's inputs fit beside the sweep."""
        if not self.pool.compile_ahead or not self.facts.compiles:
            return False
        memory = min(i.get("memory_bytes") or 0 for i in self.pool.infos)
        return state.facts.bytes_moved * self.pool.compile_processes <= COMPILE_MEMORY_SHARE * memory

    def _search(self, state: ShapeState) -> None:
        ready: deque[Pending] = deque()
        compiling: dict[Any, Pending] = {}
        benching: dict[Any, tuple[Pending, int]] = {}
        idle = self._live_workers()
        compile_ahead = self._compiles_ahead(state)
        local = self.pool.local_compilers if compile_ahead else None
        lookahead = 2 * len(self.pool.workers) + (self.pool.compile_processes if compile_ahead else 0)
        timeout_s = self.timing.trial_timeout_s
        exhausted = False

        def admit(pending: Pending) -> None:
            """To a local compile process if one is idle, else to Ray's compile workers, else (nothing
            compiles ahead) straight to the device workers."""
            if not compile_ahead:
                ready.append(pending)
                return
            handle = local.submit(self.facts.name, state.shape, pending.config) if local is not None else None
            if handle is None:
                task = compile_config.options(runtime_env=self.pool.runtime_env)
                handle = task.remote(self.facts.name, state.shape, pending.config)
            compiling[handle] = pending

        def feed_local() -> None:
            """Hand an idle local compile process the newest config queued for Ray's compile workers, which
            most likely has not started (they warm up seconds after the local ones)."""
            while local is not None:
                queued = next((ref for ref in reversed(compiling) if not isinstance(ref, LocalCompile)), None)
                if queued is None:
                    return
                handle = local.submit(self.facts.name, state.shape, compiling[queued].config)
                if handle is None:
                    return
                ray.cancel(queued)
                compiling[handle] = compiling.pop(queued)

        def compiled(pending: Pending, result: dict[str, Any], finished: list) -> None:
            if route_compiled(pending, result, ready, finished):
                log.warning("sweep %s %s %s: a compile worker failed (%s); the device worker compiles %s itself",
                            self.sweep_id, self.facts.name, state.key, result.get("error", "")[:200], pending.config)

        def dispatch() -> None:
            while idle:
                taken = config_for_idle_worker(ready, compiling)
                if taken is None:
                    return
                pending, compile_task = taken
                if isinstance(compile_task, LocalCompile):
                    local.abandon(compile_task)  # it finishes into the cache; the child may find it there
                elif compile_task is not None:
                    ray.cancel(compile_task)  # most likely still queued: its slot goes to the next config
                worker = idle.pop()
                pending.started_at, pending.dispatched = utcnow(), time.monotonic()
                request = {"kernel": self.facts.name, "shape": state.shape, "config": pending.config,
                           "seed": self.timing.input_seed, "atol": self.atol, "rtol": self.rtol,
                           "warmup_ms": self.timing.warmup_ms, "rep_ms": self.timing.rep_ms,
                           "probe_ms": self.timing.probe_ms, "stop_over_ms": self._stop_over_ms(state),
                           "method": self.timing.method, "host_time": self.timing.rank == "eager"}
                benching[self.pool.workers[worker].run_trial.remote(request, timeout_s)] = (pending, worker)

        for proposal in state.source.resume():
            if (pending := self._screen(state, proposal)) is not None:
                admit(pending)
        self._report(state)
        while True:
            self._beat()
            while not exhausted and len(ready) + len(compiling) + len(benching) < lookahead and self._may_propose(
                state, len(ready) + len(compiling) + len(benching)
            ):
                proposal = state.source.propose()
                if proposal is None:
                    exhausted = True
                elif (pending := self._screen(state, proposal)) is not None:
                    admit(pending)
            feed_local()
            dispatch()
            if not (ready or compiling or benching):
                return
            self._ping_resting()
            waiting = [*(ref for ref in compiling if not isinstance(ref, LocalCompile)), *benching, *self.down]
            polling = local is not None and local.busy()
            done = []
            if waiting:
                done, _ = ray.wait(waiting, num_returns=1, timeout=LOCAL_POLL_S if polling else 1.0)
                if done:
                    done, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
            finished: list[tuple[Pending, dict[str, Any], int | None]] = []
            for handle, result in local.poll(0.0 if waiting else 1.0) if polling else []:
                if (pending := compiling.pop(handle, None)) is None:
                    continue  # the child took it meanwhile
                compiled(pending, result, finished)
            for ref in done:
                if ref in self.down:
                    if self._revived(ref):
                        idle.append(self.down.pop(ref))
                elif ref in compiling:
                    compiled(compiling.pop(ref), self._get(ref), finished)
                elif ref in benching:
                    pending, worker = benching.pop(ref)
                    result = self._answer(ref)
                    if result is not None:
                        idle.append(worker)
                        finished.append((pending, result, worker))
                        continue
                    self._ping(worker)
                    if pending.requeues < MAX_REQUEUES:
                        pending.requeues += 1
                        ready.appendleft(pending)
                    else:
                        finished.append((pending, {"status": "crash", "error": f"the worker measuring it died "
                                                   f"{pending.requeues + 1} times"}, worker))
            for _, result, _ in finished:  # the next trials' probe cut-off knows of the best just measured
                state.note(result)
            dispatch()  # workers first, bookkeeping after
            for pending, result, worker in finished:
                self._record(state, pending, result, worker)
            for pending in overdue([p for p, _ in benching.values()], time.monotonic()):
                log.warning("sweep %s %s %s: a trial has been benchmarking for %.0f s: %s", self.sweep_id,
                            self.facts.name, state.key, time.monotonic() - pending.dispatched, pending.config)
            for ref, pending in list(compiling.items()):
                if time.monotonic() - pending.submitted > timeout_s:
                    if isinstance(ref, LocalCompile):
                        local.kill(ref)
                    else:
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

    def _answer(self, ref: Any) -> dict[str, Any] | None:
        """A device worker's answer to a trial; None when the worker itself died (not the config's doing:
        the benchmarking child absorbs the config's faults)."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError:
            return None
        except ray.exceptions.RayError as exc:
            return {"status": "crash", "error": f"worker failed: {exc}"[:4000]}

    def _ping(self, worker: int) -> None:
        """Take ``worker`` out of use until it answers a ping: Ray restarts a dead worker on its node, or
        wherever a device is free."""
        self.down[self.pool.workers[worker].restarts.remote()] = worker

    def _revived(self, ping: Any) -> bool:
        """Whether the worker answered its ping; one that is not back yet rests before the next ping."""
        try:
            ray.get(ping)
            return True
        except ray.exceptions.RayError:
            self.resting[self.down.pop(ping)] = time.monotonic() + PING_EVERY_S
            return False

    def _ping_resting(self) -> None:
        for worker, due in list(self.resting.items()):
            if time.monotonic() >= due:
                del self.resting[worker]
                self._ping(worker)

    def _live_workers(self) -> list[int]:
        return [i for i in range(len(self.pool.workers)) if i not in self.down.values() and i not in self.resting]

    def _screen(self, state: ShapeState, proposal: Proposal) -> Pending | None:
        """A proposal that must be measured, or None when it was pruned or answered from the DB."""
        identity = self._identity(state.key, proposal.config)
        reason = self.space.violation(proposal.config, state.shape, self.arch)
        if reason:
            self._write_pruned(state.key, [(proposal.config, identity, reason)])
            state.pruned += 1
            self._tell(state, proposal, TrialStatus.pruned.value, None)
            return None
        if self._reuse(state, proposal, identity):
            return None
        return Pending(proposal, identity)

    def _reuse(self, state: ShapeState, proposal: Proposal, identity: str) -> bool:
        """Answer a proposal from this sweep's own record of its identity (any verdict), or from an
        earlier sweep's reusable one; True if either existed."""
        with session_scope(self.engine) as session:
            previous = reusable_trial(session, identity, own_sweep=self.sweep_id)
            if previous is None:
                return False
            if previous.sweep_id != self.sweep_id:
                session.add(self._trial(
                    state.key, proposal.config, identity, status=previous.status, median_ms=previous.median_ms,
                    p20_ms=previous.p20_ms, p80_ms=previous.p80_ms, reps=previous.reps,
                    metrics={**_screening_metrics(previous), "reused_from": previous.id}, error=previous.error,
                    host=previous.host, gpu_name=previous.gpu_name, sm_count=previous.sm_count,
                    versions=previous.versions))
                state.evaluated += 1
            status, median = previous.status, previous.median_ms
        self._tell(state, proposal, status, median)
        return True

    def _tell(self, state: ShapeState, proposal: Proposal, status: str, median_ms: float | None) -> None:
        """Report a measured config to the search: its device time (host times are too noisy to steer it)."""
        state.source.report(proposal, status, median_ms)
        state.note({"status": status, "median_ms": median_ms})
        self._report(state)

    def _recorded(self, session: Session, identity: str) -> Trial | None:
        """This sweep's trial of ``identity``, if it recorded one."""
        return session.scalars(select(Trial).where(Trial.sweep_id == self.sweep_id, Trial.identity == identity)
                               .limit(1)).first()

    def _trial(self, key: str, config: dict[str, Any], identity: str, **measured: Any) -> Trial:
        """A trial row of this sweep; ``measured`` holds the status and what was measured."""
        return Trial(sweep_id=self.sweep_id, kernel=self.facts.name, shape_key=key, arch=self.arch,
                     config=config, identity=identity, **measured)

    def _write_pruned(self, key: str, pruned: list[tuple[dict[str, Any], str, str]]) -> None:
        with session_scope(self.engine) as session:
            session.add_all(self._trial(key, config, identity, status=TrialStatus.pruned.value, error=reason,
                                        versions=self.toolchain, metrics={})
                            for config, identity, reason in pruned)

    def _record(self, state: ShapeState, pending: Pending, result: dict[str, Any], worker: int | None) -> None:
        """Commit a finished trial, then report it (a kill in between only repeats the report)."""
        info = self.pool.infos[worker] if worker is not None else {}
        metrics = {**result.get("metrics", {}), **({"busy_s": result["busy_s"]} if "busy_s" in result else {}),
                   **({"requeued": pending.requeues} if pending.requeues else {}),
                   **({"compile_s": pending.compile_s} if pending.compile_s is not None else {})}

        attempts = 0

        def write() -> None:  # retried while the database is out of reach: at most one row per identity
            nonlocal attempts
            attempts += 1
            with session_scope(self.engine) as session:
                if attempts > 1 and self._recorded(session, pending.identity) is not None:
                    return  # the failed attempt's commit went through before the connection broke
                session.add(self._trial(
                    state.key, pending.config, pending.identity, status=result["status"],
                    median_ms=result.get("median_ms"), p20_ms=result.get("p20_ms"), p80_ms=result.get("p80_ms"),
                    reps=result.get("reps"), error=result.get("error"), metrics=metrics,
                    host=info.get("host"), node=result.get("node", info.get("node")), gpu_name=info.get("gpu_name"),
                    sm_count=info.get("sm_count"), versions=self.toolchain, started_at=pending.started_at))

        retrying(write, f"recording a trial of sweep {self.sweep_id}")
        state.evaluated += 1
        self._tell(state, pending.proposal, result["status"], result.get("median_ms"))

    def _report(self, state: ShapeState) -> None:
        done = state.evaluated + (state.pruned if self.spec.budget_counts_pruned else 0)
        total = state.budget
        self.on_progress(state.key, min(done, total), total, state.best_ms)

    # -- re-timing of the best configs -------------------------------------------------
    def _retime(self, state: ShapeState) -> None:
        """Time the best few configs together on every device worker (the best by device time, and by
        eager time where the rank is eager); mark the fastest under the sweep's rank. No transaction
        stays open while the workers time."""
        with session_scope(self.engine) as session:
            rows = session.scalars(
                select(Trial).where(Trial.sweep_id == self.sweep_id, Trial.shape_key == state.key,
                                    Trial.status == TrialStatus.ok.value)
            ).all()
        rank = self.timing.rank
        orders: list[Callable[[Trial], float]] = [lambda r: r.median_ms]
        if rank == "eager":  # the best by device time may all be host-bound
            orders.append(lambda r: screening_time(r).ms(rank))
        best: dict[str, Trial] = {}
        for order in orders:
            distinct: dict[str, Trial] = {}
            for row in sorted(rows, key=order):
                distinct.setdefault(row.identity, row)
            for identity, row in list(distinct.items())[: self.timing.retime_top]:
                best.setdefault(identity, row)
        candidate_ids = [row.id for row in best.values()]
        if not candidate_ids:
            return
        answers: list[dict[str, Any]] = []
        if len(candidate_ids) > 1:
            request = {"kernel": self.facts.name, "shape": state.shape,
                       "configs": [row.config for row in best.values()],
                       "seed": self.timing.input_seed, "rounds": self.timing.retime_rounds,
                       "warmup_ms": self.timing.retime_warmup_ms, "rep_ms": self.timing.retime_rep_ms,
                       "method": self.timing.method}
            answers = self._retime_on_live_workers(request, self.timing.trial_timeout_s * len(candidate_ids))
        per_worker = [a["medians_ms"] for a in answers if a.get("status") == "ok"]
        host_per_worker = [a["host_least_ms"] for a in answers if "host_least_ms" in a]
        self._beat()  # a runner that lost its lease marks no winner

        def write() -> None:
            with session_scope(self.engine) as session:
                session.execute(update(Trial).where(Trial.sweep_id == self.sweep_id, Trial.shape_key == state.key)
                                .values(is_winner=False))
                candidates = [session.get(Trial, trial_id) for trial_id in candidate_ids]
                for i, row in enumerate(candidates):
                    samples = sorted(w[i] for w in per_worker)
                    if samples:
                        row.retime_ms = statistics.median(samples)
                        row.metrics = {**row.metrics, "retime_per_worker_ms": samples}
                    if host_per_worker:
                        row.metrics = {**row.metrics, "retime_host_ms": min(w[i] for w in host_per_worker)}
                winner = pick(candidates, trial_time, rank)
                winner.is_winner = True
                if per_worker:
                    winner.metrics = {**winner.metrics, "retime_busy_s": [a.get("busy_s", 0.0) for a in answers]}

        retrying(write, f"marking the winner of sweep {self.sweep_id}")

    def _retime_on_live_workers(self, request: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        """Every live worker's re-timing answer; a worker that dies or outlasts its timeout is left out.
        The lease is checked while they run (a re-timing takes minutes on a GPU)."""
        refs = [self.pool.workers[i].retime.remote(request, timeout_s) for i in self._live_workers()]
        deadline = time.monotonic() + timeout_s + 30  # the worker's own timeout, and its child's restart
        pending = list(refs)
        while pending and time.monotonic() < deadline:
            self._beat()
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
        return [self._get(ref) for ref in refs if ref not in pending]

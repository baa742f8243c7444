"""The job queues in SQL (sweeps, and training runs in ``tuner.train.queue``): enqueue, claim
atomically, heartbeat, finish, cancel.

A claim is one conditional UPDATE (queued, or running with a heartbeat older than the
lease), so two servers never take the same job, on SQLite and PostgreSQL alike. A
server that was killed leaves its job ``running`` with a stale heartbeat; the next
server to look takes it over and resumes it. Both job tables share the lease columns
(status, owner, heartbeat_at, started_at, finished_at, error) and status names.

A ``Lease`` renews a claim from a thread of its own, so that no phase of a job (a long
re-timing, a slow compile) outlasts it unrenewed; a server that finds its lease gone
stops the job. Every statement here is retried while the database is out of reach.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any

from sqlalchemy import ColumnElement, Engine, or_, select, update

from db import DatabaseError, Sweep, SweepStatus, retrying, session_scope
from db.models import LeasedJob, utcnow
from db.training import TrainStatus
from tuner.sweep.spec import SweepSpec

DEFAULT_LEASE_S = 60.0
# A lease is renewed this many times within its length (and at most every HEARTBEAT_MAX_S).
BEATS_PER_LEASE = 4
HEARTBEAT_MAX_S = 5.0
log = logging.getLogger(__name__)
Job = type[LeasedJob]
QUEUED, RUNNING, CANCELLED = SweepStatus.queued.value, SweepStatus.running.value, SweepStatus.cancelled.value
assert (QUEUED, RUNNING, CANCELLED) == (TrainStatus.queued.value, TrainStatus.running.value,
                                         TrainStatus.cancelled.value)


class SweepNotFound(LookupError):
    pass


def enqueue(engine: Engine, spec: SweepSpec) -> int:
    """Store a validated spec as a ``queued`` sweep; its id."""
    with session_scope(engine) as session:
        sweep = Sweep(kernel=spec.kernel, arch=spec.arch, spec=spec.model_dump(mode="json"),
                      status=SweepStatus.queued.value)
        session.add(sweep)
        session.flush()
        return sweep.id


def _claimable(job: Job, lease_s: float) -> ColumnElement[bool]:
    """Queued, or running under a lease nobody renewed for ``lease_s`` seconds."""
    stale_before = datetime.now(timezone.utc) - timedelta(seconds=lease_s)
    return or_(job.status == QUEUED, (job.status == RUNNING) & (job.heartbeat_at < stale_before))


def _held(job: Job, job_id: int, owner: str) -> tuple[ColumnElement[bool], ...]:
    return job.id == job_id, job.owner == owner, job.status == RUNNING


def try_claim(engine: Engine, job_id: int, owner: str, lease_s: float = DEFAULT_LEASE_S, job: Job = Sweep) -> bool:
    """Take ``job_id`` for ``owner`` if it is queued or abandoned; True when taken."""
    def claim() -> bool:
        now = utcnow()
        with session_scope(engine) as session:
            result = session.execute(
                update(job)
                .where(job.id == job_id)
                .where(_claimable(job, lease_s))
                .values(status=RUNNING, owner=owner, heartbeat_at=now, started_at=now)
            )
            return result.rowcount == 1

    return retrying(claim, f"claiming job {job_id}")


def claim_next(engine: Engine, owner: str, lease_s: float = DEFAULT_LEASE_S, job: Job = Sweep) -> int | None:
    """Claim the oldest claimable job; its id, or None when the queue is empty."""
    def candidates() -> list[int]:
        with session_scope(engine) as session:
            return list(session.scalars(select(job.id).where(_claimable(job, lease_s)).order_by(job.id)))

    return next((job_id for job_id in retrying(candidates, "reading the queue")
                 if try_claim(engine, job_id, owner, lease_s, job)), None)


def heartbeat(engine: Engine, job_id: int, owner: str, job: Job = Sweep) -> bool:
    """Renew the lease; False when the job was cancelled or taken by someone else."""
    def beat() -> bool:
        with session_scope(engine) as session:
            held = update(job).where(*_held(job, job_id, owner)).values(heartbeat_at=utcnow())
            return session.execute(held).rowcount == 1

    return retrying(beat, f"renewing the lease of job {job_id}")


def finish(engine: Engine, job_id: int, owner: str, status: SweepStatus | TrainStatus, error: str | None = None,
           job: Job = Sweep, **figures: Any) -> bool:
    """Close a job this owner runs, storing ``figures`` with it; False when it was cancelled or taken over."""
    def close() -> bool:
        with session_scope(engine) as session:
            return session.execute(
                update(job).where(*_held(job, job_id, owner))
                .values(status=status.value, finished_at=utcnow(), error=error, **figures)
            ).rowcount == 1

    return retrying(close, f"closing job {job_id}")


def release(engine: Engine, owner: str, job: Job = Sweep) -> list[int]:
    """Put every job ``owner`` runs back in the queue (its server is going away); their ids."""
    def put_back() -> list[int]:
        with session_scope(engine) as session:
            ids = list(session.scalars(select(job.id).where(job.owner == owner, job.status == RUNNING)))
            session.execute(update(job).where(job.owner == owner, job.status == RUNNING)
                            .values(status=QUEUED, owner=None, heartbeat_at=None))
            return ids

    return retrying(put_back, "putting jobs back in the queue")


class Lease:
    """Renews ``owner``'s claim on a job from a daemon thread while the ``with`` block runs.

    ``lost`` turns True when a renewal finds the job no longer held (cancelled, or taken over); the
    runner reads it between steps. A database out of reach is not a lost lease: the renewal is
    retried, and holds again if nobody took the job.
    """

    def __init__(self, engine: Engine, job_id: int, owner: str, lease_s: float, job: Job = Sweep) -> None:
        self.engine, self.job_id, self.owner, self.job = engine, job_id, owner, job
        self.every_s = min(lease_s / BEATS_PER_LEASE, HEARTBEAT_MAX_S)
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"lease-{job_id}", daemon=True)

    def _renew(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                held = heartbeat(self.engine, self.job_id, self.owner, self.job)
            except DatabaseError as exc:
                log.warning("lease of job %s not renewed: %s", self.job_id, exc)
                continue
            if not held:
                self.lost = True
                return

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()


def _stored(session: Any, job_id: int, job: Job, not_found: type[LookupError] | None) -> Any:
    row = session.get(job, job_id)
    if row is None:
        raise (not_found or SweepNotFound)(f"no {'sweep' if job is Sweep else 'training run'} with id {job_id}")
    return row


def cancel(engine: Engine, job_id: int, job: Job = Sweep, not_found: type[LookupError] | None = None) -> str:
    """Cancel a queued or running job (a running one stops at its next heartbeat); the status it ends with."""
    with session_scope(engine) as session:
        row = _stored(session, job_id, job, not_found)
        if row.status in (QUEUED, RUNNING):
            row.status = CANCELLED
            row.finished_at = utcnow()
        return row.status


def get(engine: Engine, job_id: int, job: Job = Sweep, not_found: type[LookupError] | None = None) -> Any:
    """The stored job (detached); ``not_found`` (default ``SweepNotFound``) when there is none."""
    with session_scope(engine) as session:
        return _stored(session, job_id, job, not_found)


def get_sweep(engine: Engine, sweep_id: int) -> Sweep:
    return get(engine, sweep_id)

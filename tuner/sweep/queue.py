"""The job queues in SQL (sweeps, and training runs in ``tuner.train.queue``): enqueue, claim
atomically, heartbeat, finish, cancel.

A claim is one conditional UPDATE (queued, or running with a heartbeat older than the
lease), so two servers never take the same job, on SQLite and PostgreSQL alike. A
server that was killed leaves its job ``running`` with a stale heartbeat; the next
server to look takes it over and resumes it. Both job tables share the lease columns
(status, owner, heartbeat_at, started_at, finished_at, error) and status names.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import ColumnElement, Engine, or_, select, update

from db import Sweep, SweepStatus, session_scope
from db.models import LeasedJob, utcnow
from db.training import TrainStatus
from tuner.sweep.spec import SweepSpec

DEFAULT_LEASE_S = 60.0
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
    now = utcnow()
    with session_scope(engine) as session:
        result = session.execute(
            update(job)
            .where(job.id == job_id)
            .where(_claimable(job, lease_s))
            .values(status=RUNNING, owner=owner, heartbeat_at=now, started_at=now)
        )
        return result.rowcount == 1


def claim_next(engine: Engine, owner: str, lease_s: float = DEFAULT_LEASE_S, job: Job = Sweep) -> int | None:
    """Claim the oldest claimable job; its id, or None when the queue is empty."""
    with session_scope(engine) as session:
        candidates = session.scalars(select(job.id).where(_claimable(job, lease_s)).order_by(job.id)).all()
    return next((job_id for job_id in candidates if try_claim(engine, job_id, owner, lease_s, job)), None)


def heartbeat(engine: Engine, job_id: int, owner: str, job: Job = Sweep) -> bool:
    """Renew the lease; False when the job was cancelled or taken by someone else."""
    with session_scope(engine) as session:
        return session.execute(update(job).where(*_held(job, job_id, owner)).values(heartbeat_at=utcnow())).rowcount == 1


def finish(engine: Engine, job_id: int, owner: str, status: SweepStatus | TrainStatus, error: str | None = None,
           job: Job = Sweep, **figures: Any) -> bool:
    """Close a job this owner runs, storing ``figures`` with it; False when it was cancelled or taken over."""
    with session_scope(engine) as session:
        return session.execute(
            update(job).where(*_held(job, job_id, owner))
            .values(status=status.value, finished_at=utcnow(), error=error, **figures)
        ).rowcount == 1


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

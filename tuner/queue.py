"""The sweep queue in SQL: enqueue, claim atomically, heartbeat, finish, cancel.

A claim is one conditional UPDATE (queued, or running with a heartbeat older than the
lease), so two servers never take the same sweep, on SQLite and PostgreSQL alike. A
server that was killed leaves its sweep ``running`` with a stale heartbeat; the next
server to look takes it over and resumes it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import ColumnElement, Engine, or_, select, update

from db import Sweep, SweepStatus, session_scope
from db.models import utcnow
from tuner.spec import SweepSpec

DEFAULT_LEASE_S = 60.0


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


def _claimable(lease_s: float) -> ColumnElement[bool]:
    """Queued, or running under a lease nobody renewed for ``lease_s`` seconds."""
    stale_before = datetime.now(timezone.utc) - timedelta(seconds=lease_s)
    return or_(Sweep.status == SweepStatus.queued.value,
               (Sweep.status == SweepStatus.running.value) & (Sweep.heartbeat_at < stale_before))


def try_claim(engine: Engine, sweep_id: int, owner: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
    """Take ``sweep_id`` for ``owner`` if it is queued or abandoned; True when taken."""
    now = utcnow()
    with session_scope(engine) as session:
        result = session.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id)
            .where(_claimable(lease_s))
            .values(status=SweepStatus.running.value, owner=owner, heartbeat_at=now, started_at=now)
        )
        return result.rowcount == 1


def claim_next(engine: Engine, owner: str, lease_s: float = DEFAULT_LEASE_S) -> int | None:
    """Claim the oldest claimable sweep; its id, or None when the queue is empty."""
    with session_scope(engine) as session:
        candidates = session.scalars(
            select(Sweep.id)
            .where(_claimable(lease_s))
            .order_by(Sweep.id)
        ).all()
    for sweep_id in candidates:
        if try_claim(engine, sweep_id, owner, lease_s):
            return sweep_id
    return None


def heartbeat(engine: Engine, sweep_id: int, owner: str) -> bool:
    """Renew the lease; False when the sweep was cancelled or taken by someone else."""
    with session_scope(engine) as session:
        result = session.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.owner == owner, Sweep.status == SweepStatus.running.value)
            .values(heartbeat_at=utcnow())
        )
        return result.rowcount == 1


def finish(engine: Engine, sweep_id: int, owner: str, status: SweepStatus, error: str | None = None) -> bool:
    """Close a sweep this owner runs; False when it was cancelled or taken over meanwhile."""
    with session_scope(engine) as session:
        return session.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.owner == owner, Sweep.status == SweepStatus.running.value)
            .values(status=status.value, finished_at=utcnow(), error=error)
        ).rowcount == 1


def cancel(engine: Engine, sweep_id: int) -> str:
    """Cancel a queued or running sweep; the status it ends with."""
    with session_scope(engine) as session:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            raise SweepNotFound(f"no sweep with id {sweep_id}")
        if sweep.status in (SweepStatus.queued.value, SweepStatus.running.value):
            sweep.status = SweepStatus.cancelled.value
            sweep.finished_at = utcnow()
        return sweep.status


def get_sweep(engine: Engine, sweep_id: int) -> Sweep:
    with session_scope(engine) as session:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            raise SweepNotFound(f"no sweep with id {sweep_id}")
        return sweep

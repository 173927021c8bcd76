"""Work that any of several daemons may do, decided in the shared PostgreSQL store.

- :func:`claim_input`: an inbox input becomes a job exactly once, whichever daemons see it.  The
  claim is a row ``input_claims(key, job_id, holder)`` inserted under ``PRIMARY KEY (key)`` and
  ``UNIQUE (job_id)``: of several daemons inserting the same key, one wins (no file lock, no
  move decides it).  The winner takes the job's lease in the same transaction and then moves
  the input and appends ``JobAccepted``.  A claimant that dies before ``JobAccepted`` leaves a
  claim whose job lease lapses: the next daemon to claim the key resumes it (same job id, next
  fence) instead of starting a second job.
- :func:`claim_control`: a control request (``bgctl cancel`` / ``retry``: a file in the shared
  home's ``control/`` that every daemon sees) is applied exactly once: the event it appends
  carries, in its append's transaction, the insert of the request's name into
  ``control_claims``; a daemon whose insert finds the name taken gets :class:`ControlApplied`
  and its event is not appended.
- :func:`working`: a job lease held around a step's local work (prepare, merge, write the
  result): taken at the start (or None while another daemon works on the job), renewed by
  :meth:`Working.keep` from the step's heartbeat, its events appended only while it is held
  (:meth:`Working.append`), released at the end.

On the SQLite file neither is needed: one daemon serves a home, under the home's lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from batchgrader.core.log.events import Event, NewEvent
from batchgrader.store.leases import Lease, Leases, job_lease


@dataclass(frozen=True)
class Claim:
    """An input claimed by this daemon: the job it becomes, under that job's lease.
    ``resumed``: an earlier claimant died before accepting it; the caller carries its claim on
    (the input is in the inbox or already in the job's work folder)."""

    key: str
    job_id: str
    lease: Lease
    resumed: bool = False


def _accepted(conn: Any, job_id: str) -> bool:
    return conn.execute("SELECT 1 FROM events WHERE job_id = %s LIMIT 1", (job_id,)).fetchone() is not None


def claim_input(leases: Leases, key: str, job_ids: Iterable[str], ttl: float, now: float | None = None) -> Claim | None:
    """Claim the input ``key`` (its identity: e.g. the inbox fingerprint, or bucket, key and
    ETag) for a new job, the first of ``job_ids`` not taken by another input or job (``job_ids``
    is read lazily: ``abc``, ``abc-2``, ...).  Returns the :class:`Claim`, or None when another
    daemon claimed it first (and still holds its job lease, or has accepted the job)."""
    with leases.store.write() as conn:
        found = conn.execute("SELECT job_id FROM input_claims WHERE key = %s FOR UPDATE", (key,)).fetchone()
        if found is None:
            for job_id in job_ids:
                if _accepted(conn, job_id):
                    continue  # an id the log already has (an older job, a rejected file)
                row = conn.execute(
                    "INSERT INTO input_claims (key, job_id, holder, claimed_at) "
                    "VALUES (%s, %s, %s, extract(epoch FROM clock_timestamp())) ON CONFLICT DO NOTHING RETURNING job_id",
                    (key, job_id, leases.holder),
                ).fetchone()
                if row is not None:
                    lease = leases._acquire(conn, job_lease(job_id), ttl, now)
                    assert lease is not None, "a new job's lease is free"
                    return Claim(key, job_id, lease)
                found = conn.execute("SELECT job_id FROM input_claims WHERE key = %s FOR UPDATE", (key,)).fetchone()
                if found is not None:
                    break  # another daemon inserted this key meanwhile (its commit ended our wait)
            else:
                raise ValueError(f"no free job id for input {key!r}")
        job_id = found[0]
        if _accepted(conn, job_id):
            return None
        lease = leases._acquire(conn, job_lease(job_id), ttl, now)
        return None if lease is None else Claim(key, job_id, lease, resumed=True)


class ControlApplied(RuntimeError):
    """Another daemon applied this control request: nothing was appended."""


def claim_control(name: str, holder: str) -> Callable[[Any], None]:
    """What an append that applies the control request ``name`` also writes (its ``also``): the
    request claimed for ``holder``, or :class:`ControlApplied` (the append is rolled back) when
    another daemon claimed it first."""

    def insert(conn: Any) -> None:
        row = conn.execute(
            "INSERT INTO control_claims (name, holder, claimed_at) "
            "VALUES (%s, %s, extract(epoch FROM clock_timestamp())) ON CONFLICT DO NOTHING RETURNING name",
            (name, holder),
        ).fetchone()
        if row is None:
            raise ControlApplied(f"control request {name} was applied by another daemon")

    return insert


def control_claimed(leases: Leases, name: str) -> str | None:
    """The daemon that applied the control request ``name``, or None."""
    with leases.store.pool.connection() as conn:
        row = conn.execute("SELECT holder FROM control_claims WHERE name = %s", (name,)).fetchone()
        conn.rollback()
    return None if row is None else str(row[0])


def claimed(leases: Leases, key: str) -> tuple[str, str] | None:
    """``(job_id, first claimant)`` of a claimed input, or None."""
    with leases.store.pool.connection() as conn:
        row = conn.execute("SELECT job_id, holder FROM input_claims WHERE key = %s", (key,)).fetchone()
        conn.rollback()
    return None if row is None else (row[0], row[1])


class Working:
    """A job lease held around a step's work (see :func:`working`)."""

    def __init__(self, leases: Leases, lease: Lease, ttl: float) -> None:
        self.leases = leases
        self.lease = lease
        self.ttl = ttl
        self._renewed = time.monotonic()

    def keep(self, now: float | None = None) -> Lease:
        """Renew the lease once a third of its lifetime has passed since it was last taken or
        renewed (on the monotonic clock; with ``now``, by the lease's own expiry); cheap to call
        from every heartbeat.  :class:`~batchgrader.store.leases.LeaseLost` once it is not ours:
        the step stops, writing nothing more."""
        due = (
            self.lease.expires_at - now <= self.ttl * 2 / 3
            if now is not None
            else time.monotonic() - self._renewed >= self.ttl / 3
        )
        if due:
            self.lease = self.leases.renew(self.lease, self.ttl, now)
            self._renewed = time.monotonic()
        return self.lease

    def append(
        self, job_id: str, events: Sequence[NewEvent], expected_version: int, now: float | None = None, also: Any = None
    ) -> list[Event]:
        """Append the step's events only while the lease is still ours (:meth:`Leases.append_held`)."""
        return self.leases.append_held(self.lease, job_id, events, expected_version, now=now, also=also)


@contextmanager
def working(leases: Leases, job_id: str, ttl: float, now: float | None = None) -> Iterator[Working | None]:
    """The job's lease around a step's work::

        with working(leases, job.job_id, ttl) as w:
            if w is None:
                return  # another daemon works on this job
            ...  # w.keep() from the heartbeat; w.append(...) for the step's events

    None while another daemon holds it.  Released at the end (also after an error), so the next
    step may run on any daemon; a lease lost meanwhile is left to its new holder."""
    lease = leases.acquire(job_lease(job_id), ttl, now)
    if lease is None:
        yield None
        return
    w = Working(leases, lease, ttl)
    try:
        yield w
    finally:
        leases.release(w.lease)

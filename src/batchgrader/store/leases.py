"""Leases with fencing numbers, decided in the PostgreSQL store that several daemons share.

A lease is a row ``leases(name, holder, fence, expires_at)``: one per provider account
(:func:`account_lease`: every provider call of that account is made by its holder alone) and one
per job being worked on (:func:`job_lease`: prepare, merge, write the result), and one per
running daemon (:func:`daemon_lease`: which daemons are live, :meth:`Leases.helpers`).  Every
decision is one statement in the database, against a clock the caller passes in (seconds; None:
the database's own clock), so two daemons can never both believe they hold a lease:

- :meth:`Leases.acquire`: take a free or expired lease; the fence goes up by one whenever the
  holder changes (or a lapsed holder takes it again), never when a holder renews;
- :meth:`Leases.renew`: push the expiry out; refused (:class:`LeaseLost`) once the lease has
  lapsed or been taken over;
- :meth:`Leases.release`: give it up (the next holder gets the next fence at once); a hand-over
  is announced (``NOTIFY bg_leases`` in the same transaction), so the daemon it is meant for,
  waiting in :meth:`Leases.wait_released`, wakes and asks again for what it was refused
  (:meth:`Leases.free`: which of the leases it was refused are free now, in one query);
- :meth:`Leases.append_intent`: append an intent event (upload, create, cancel, delete) only if
  the lease is still this holder's, with this fence, and has at least ``bound`` seconds left
  (the longest the call may take): the check (``FOR SHARE`` on the lease row, so no takeover
  commits meanwhile) and the record of the fence (``intent_fences``) are in the append's
  transaction.  A holder whose lease is shorter than a request's bound makes no call.

The provider cannot check a fence: a new holder treats the old holder's open intents as unknown
outcomes and reconciles them from the provider's records before sending anything (the daemon's
``bg_key`` reconcile); :meth:`Leases.fences_of` says which holder's fence each intent was made under.

Only the PostgreSQL store has leases: the SQLite file serves one daemon, under the home's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from batchgrader.core.log.events import Event, NewEvent
from batchgrader.store.pgstore import PostgresEventStore, _psycopg, one

#: the channel a released lease is announced on (its name as the payload)
RELEASED = "bg_leases"

DDL = (
    """CREATE TABLE IF NOT EXISTS leases (
        name        TEXT COLLATE "C" PRIMARY KEY,  -- account:<provider>:<account> or job:<job_id>
        holder      TEXT COLLATE "C",           -- the daemon holding it; NULL: released
        fence       BIGINT NOT NULL,            -- +1 at each change of holder
        expires_at  DOUBLE PRECISION NOT NULL,  -- seconds (the callers' clock)
        acquired_at DOUBLE PRECISION NOT NULL
    )""",
    # an inbox input claimed for a job: the first daemon to insert its key wins (claim_input)
    """CREATE TABLE IF NOT EXISTS input_claims (
        key        TEXT COLLATE "C" PRIMARY KEY,         -- the input's identity (claim_input's caller)
        job_id     TEXT COLLATE "C" NOT NULL UNIQUE,     -- the job it becomes
        holder     TEXT COLLATE "C" NOT NULL,            -- the daemon that claimed it first
        claimed_at DOUBLE PRECISION NOT NULL
    )""",
    # a control request (bgctl cancel / retry, a file in the shared home's control/) applied: the
    # first daemon to insert its name, in the transaction of the event it appends, applies it (claim_control)
    """CREATE TABLE IF NOT EXISTS control_claims (
        name       TEXT COLLATE "C" PRIMARY KEY,  -- the request's file name (time, action, random suffix)
        holder     TEXT COLLATE "C" NOT NULL,     -- the daemon that applied it
        claimed_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS intent_fences (
        seq    BIGINT PRIMARY KEY REFERENCES events (seq),  -- the intent event
        job_id TEXT COLLATE "C" NOT NULL,
        lease  TEXT COLLATE "C" NOT NULL,
        holder TEXT COLLATE "C" NOT NULL,
        fence  BIGINT NOT NULL
    )""",
)
COLUMNS = "name, holder, fence, expires_at, acquired_at"


class LeaseLost(RuntimeError):
    """The lease is no longer this holder's (lapsed, taken over or released)."""


class LeaseTooShort(LeaseLost):
    """The lease is still held but would lapse before the call could end: no call is made."""


@dataclass(frozen=True)
class Lease:
    name: str
    holder: str
    fence: int
    expires_at: float
    acquired_at: float

    def remaining(self, now: float) -> float:
        return self.expires_at - now

    def may_call(self, now: float, bound: float) -> bool:
        """Whether a call that may take ``bound`` seconds ends before the lease lapses."""
        return self.remaining(now) > bound


def account_lease(provider: str, account: str) -> str:
    """The lease of a provider account (organisation, project, workspace or deployment)."""
    return f"account:{provider}:{account}"


def job_lease(job_id: str) -> str:
    return f"job:{job_id}"


def daemon_lease(holder: str) -> str:
    """The lease a daemon holds while it runs (renewed with its others): which daemons are live."""
    return f"daemon:{holder}"


def _lease(row: Sequence[Any] | None) -> Lease | None:
    return None if row is None else Lease(row[0], row[1], int(row[2]), float(row[3]), float(row[4]))


class Leases:
    """The leases of one PostgreSQL store, as one daemon (``holder``) sees them."""

    def __init__(self, store: PostgresEventStore, holder: str) -> None:
        self.store = store
        self.holder = holder
        self._listen: Any = None  # the connection wait_released listens on
        with store.write() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('batchgrader leases schema'))")
            for stmt in DDL:
                conn.execute(stmt)

    @staticmethod
    def _now(conn: Any, now: float | None) -> float:
        return float(now) if now is not None else float(one(conn, "SELECT extract(epoch FROM clock_timestamp())"))

    def acquire(self, name: str, ttl: float, now: float | None = None) -> Lease | None:
        """The lease, now this daemon's for ``ttl`` seconds, or None while another holds it."""
        with self.store.write() as conn:
            return self._acquire(conn, name, ttl, now)

    def _acquire(self, conn: Any, name: str, ttl: float, now: float | None) -> Lease | None:
        t = self._now(conn, now)
        row = conn.execute(
            f"""INSERT INTO leases AS l ({COLUMNS}) VALUES (%(name)s, %(me)s, 1, %(until)s, %(now)s)
            ON CONFLICT (name) DO UPDATE SET
                holder = EXCLUDED.holder,
                fence = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > %(now)s THEN l.fence ELSE l.fence + 1 END,
                expires_at = EXCLUDED.expires_at,
                acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > %(now)s THEN l.acquired_at ELSE %(now)s END
            WHERE l.holder IS NULL OR l.expires_at <= %(now)s OR l.holder = EXCLUDED.holder
            RETURNING {COLUMNS}""",
            {"name": name, "me": self.holder, "until": t + ttl, "now": t},
        ).fetchone()
        return _lease(row)

    def acquire_any(self, names: Iterable[str], ttl: float, now: float | None = None) -> Lease | None:
        """The first of ``names`` this daemon can take (a job to work on), or None."""
        for name in names:
            lease = self.acquire(name, ttl, now)
            if lease is not None:
                return lease
        return None

    def renew(self, lease: Lease, ttl: float, now: float | None = None) -> Lease:
        """The lease pushed out to ``now + ttl``; :class:`LeaseLost` when it is no longer ours."""
        with self.store.write() as conn:
            t = self._now(conn, now)
            row = conn.execute(
                f"""UPDATE leases SET expires_at = %s WHERE name = %s AND holder = %s AND fence = %s AND expires_at > %s
                RETURNING {COLUMNS}""",
                (t + ttl, lease.name, self.holder, lease.fence, t),
            ).fetchone()
        if row is None:
            raise LeaseLost(f"lease {lease.name} (fence {lease.fence}) is no longer held by {self.holder}")
        return _lease(row)  # type: ignore[return-value]

    def release(self, lease: Lease, announce: str | None = None) -> bool:
        """Give the lease up (True) unless it is no longer ours (False).  ``announce``: a hand-over
        the other daemons are told of in the same transaction (:data:`RELEASED`, the payload
        ``"<announce> <holder>"``: ``call`` for a daemon holding an account, ``work`` for one
        holding none; see :meth:`wait_released`)."""
        with self.store.write() as conn:
            cur = conn.execute(
                "UPDATE leases SET holder = NULL, expires_at = 0 WHERE name = %s AND holder = %s AND fence = %s",
                (lease.name, self.holder, lease.fence),
            )
            if cur.rowcount == 1 and announce is not None:
                conn.execute("SELECT pg_notify(%s, %s)", (RELEASED, f"{announce} {self.holder}"))
            return cur.rowcount == 1

    def free(self, names: Sequence[str], now: float | None = None) -> set[str]:
        """Which of ``names`` nobody holds now (released, lapsed or never taken): one query."""
        if not names:
            return set()
        with self.store.pool.connection() as conn:
            t = self._now(conn, now)
            rows = conn.execute(
                "SELECT name FROM leases WHERE name = ANY(%s) AND holder IS NOT NULL AND expires_at > %s", (list(names), t)
            ).fetchall()
            conn.rollback()
        return set(names) - {r[0] for r in rows}

    def wait_released(self, timeout: float) -> list[tuple[str, str]]:
        """Wait up to ``timeout`` seconds for announced releases (:meth:`release`): each as
        (``call`` or ``work``, the releasing daemon), none when the time ran out; on a listening
        connection of this object's own (made at the first call; :meth:`close`)."""
        psycopg = _psycopg()
        try:
            if self._listen is None or self._listen.closed:
                self._listen = psycopg.connect(self.store.url, autocommit=True)
                self._listen.execute(f"LISTEN {RELEASED}")
            for n in self._listen.notifies(timeout=timeout, stop_after=1):
                kind, _, holder = n.payload.partition(" ")
                return [(kind, holder)]
        except psycopg.OperationalError:  # the connection went: listen again at the next call
            self.close()
        return []

    def close(self) -> None:
        """Close the listening connection of :meth:`wait_released`, if any."""
        conn, self._listen = self._listen, None
        if conn is not None:
            conn.close()

    def current(self, name: str) -> Lease | None:
        """The lease row as it is (whoever holds it, lapsed or not)."""
        with self.store.pool.connection() as conn:
            row = conn.execute(f"SELECT {COLUMNS} FROM leases WHERE name = %s", (name,)).fetchone()
            conn.rollback()
        return _lease(row)

    def all(self) -> list[Lease]:
        """Every lease row, by name (for ``bgctl status``: which daemon holds what)."""
        with self.store.pool.connection() as conn:
            rows = conn.execute(f"SELECT {COLUMNS} FROM leases ORDER BY name").fetchall()
            conn.rollback()
        return [lease for r in rows if (lease := _lease(r)) is not None]

    def helpers(self, now: float | None = None) -> int:
        """How many other daemons are live (their :func:`daemon_lease` unexpired) and hold no
        provider account's lease: the daemons free for a job's local work."""
        with self.store.pool.connection() as conn:
            t = self._now(conn, now)
            n = one(
                conn,
                """SELECT count(*) FROM leases d WHERE d.name LIKE 'daemon:%%' AND d.holder <> %s AND d.expires_at > %s
                AND NOT EXISTS (SELECT 1 FROM leases a WHERE a.name LIKE 'account:%%' AND a.holder = d.holder
                                AND a.expires_at > %s)""",
                (self.holder, t, t),
            )
            conn.rollback()
        return int(n)

    # --- intents under a lease --------------------------------------------------------------------
    def append_intent(
        self,
        lease: Lease,
        job_id: str,
        events: Sequence[NewEvent],
        expected_version: int,
        bound: float,
        now: float | None = None,
        also: Callable[[Any], None] | None = None,
    ) -> list[Event]:
        """Append an intent under ``lease`` (see the module docstring): refused with
        :class:`LeaseLost` (or :class:`LeaseTooShort`) when the call must not be made; then
        nothing is appended.  ``also`` writes more in the same transaction, after the check
        (as :meth:`~batchgrader.store.backend.EventLog.append`'s)."""

        def check_and_record(conn: Any) -> None:
            self._check(conn, lease, bound, now)
            conn.execute(
                "INSERT INTO intent_fences (seq, job_id, lease, holder, fence) "
                "SELECT seq, job_id, %s, %s, %s FROM events WHERE job_id = %s AND job_seq > %s",
                (lease.name, self.holder, lease.fence, job_id, expected_version),
            )
            if also is not None:
                also(conn)

        return self.store.append(job_id, events, expected_version=expected_version, also=check_and_record)

    def append_held(
        self,
        lease: Lease,
        job_id: str,
        events: Sequence[NewEvent],
        expected_version: int,
        now: float | None = None,
        also: Callable[[Any], None] | None = None,
    ) -> list[Event]:
        """Append what local work under ``lease`` (a job lease: prepare, merge, write) recorded,
        only while the lease is still this holder's (checked ``FOR SHARE`` in the append's
        transaction, as :meth:`append_intent` checks; no fence recorded: these are not calls)."""

        def check(conn: Any) -> None:
            self._check(conn, lease, 0.0, now)
            if also is not None:
                also(conn)

        return self.store.append(job_id, events, expected_version=expected_version, also=check)

    def _check(self, conn: Any, lease: Lease, bound: float, now: float | None) -> None:
        t = self._now(conn, now)
        row = conn.execute("SELECT holder, fence, expires_at FROM leases WHERE name = %s FOR SHARE", (lease.name,)).fetchone()
        if row is None or row[0] != self.holder or int(row[1]) != lease.fence or float(row[2]) <= t:
            raise LeaseLost(f"lease {lease.name} (fence {lease.fence}) is no longer held by {self.holder}: no call is made")
        if bound > 0 and float(row[2]) - t <= bound:
            raise LeaseTooShort(
                f"lease {lease.name} has {float(row[2]) - t:.1f}s left, less than the call's bound of {bound:.1f}s: "
                "no call is made until it is renewed"
            )

    def fences_of(self, job_id: str) -> dict[int, tuple[str, str, int]]:
        """The intents of a job made under a lease: event seq -> (lease, holder, fence)."""
        with self.store.pool.connection() as conn:
            rows = conn.execute("SELECT seq, lease, holder, fence FROM intent_fences WHERE job_id = %s", (job_id,)).fetchall()
            conn.rollback()
        return {int(r[0]): (r[1], r[2], int(r[3])) for r in rows}

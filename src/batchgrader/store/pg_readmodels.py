"""The read models of a PostgreSQL event log: the same tables and rows as the SQLite file's.

``job_status``, ``usage`` (the costs), ``queue_limits``, ``savings``, ``batch_runs`` and
``projection_state`` have the columns of :mod:`batchgrader.store.readmodel_schema` and their rows
come from the same pure functions (:func:`~batchgrader.store.readmodels.job_row`, ``usage_row``,
``saving_row``, ``batch_run_row``), so both backends show the same figures.  The
:class:`PgStatusProjector` writes them inside each append's transaction (the append holds the
``events`` table lock, so projections never interleave), and ``projection_state.last_seq``
records the last event reflected.  Whenever that is not where this projector left it (another
daemon appended, or an append of ours was rolled back), it catches up from the log first: the
jobs touched since are folded again from their events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from batchgrader.core.log.state import State, fold
from batchgrader.store.eventstore import Event, events_from_rows
from batchgrader.store.readmodels import SAVING_EVENTS, fold_before, job_row, saving_row, usage_row
from batchgrader.store.readside import PROJECTION
from batchgrader.store.readtables import TABLES
from batchgrader.store.runtimes import batch_run_row

EVENT_COLUMNS = "seq, job_id, job_seq, type, version, ts, payload"
BULK_CATCH_UP = 200  # more jobs to catch up than this: one fold of the whole log

INDEXES = (
    "CREATE INDEX IF NOT EXISTS job_status_state_created ON job_status (state, created_ts)",
    "CREATE INDEX IF NOT EXISTS usage_day ON usage (day)",
    "CREATE INDEX IF NOT EXISTS usage_job ON usage (job_id)",
    "CREATE INDEX IF NOT EXISTS savings_day ON savings (day)",
    "CREATE INDEX IF NOT EXISTS batch_runs_model_ts ON batch_runs (model, ts)",
)


def _write(conn: Any, name: str, rows: Iterable[dict[str, Any]]) -> None:
    values = [tuple(r.values()) for r in rows]
    if values:
        with conn.cursor() as cur:
            cur.executemany(TABLES[name].upsert(name), values)


def write_rows(conn: Any, events: Sequence[Event], jobs: dict[str, Any]) -> None:
    """The read-model rows of ``events`` (``jobs``: job_id -> its folded state after them)."""
    _write(conn, "job_status", (job_row(j) for j in jobs.values()))
    _write(conn, "usage", (usage_row(e, jobs[e.job_id].sandbox) for e in events if e.type == "TokensUsed" and e.job_id in jobs))
    _write(
        conn,
        "queue_limits",
        (
            {
                "base_url": e.payload.get("base_url") or "",
                "model": e.payload.get("model") or "",
                "limit_tokens": int(e.payload.get("limit") or 0),
                "exact": int(bool(e.payload.get("exact"))),
                "source": e.payload.get("source"),
                "ts": e.ts,
            }
            for e in events
            if e.type == "QueueLimitLearned"
        ),
    )
    _write(conn, "savings", (saving_row(e, jobs[e.job_id]) for e in events if e.type in SAVING_EVENTS and e.job_id in jobs))
    runs = (batch_run_row(e, jobs[e.job_id]) for e in events if e.type == "BatchStatusChanged" and e.job_id in jobs)
    _write(conn, "batch_runs", (r for r in runs if r is not None))


def _events(conn: Any, sql: str, args: Sequence[Any]) -> list[Event]:
    return events_from_rows(conn.execute(f"SELECT {EVENT_COLUMNS} FROM events WHERE {sql} ORDER BY seq", args).fetchall())


def projection_last_seq(conn: Any) -> int | None:
    row = conn.execute("SELECT last_seq FROM projection_state WHERE name = %s", (PROJECTION,)).fetchone()
    return None if row is None else row[0]


def _set_last_seq(conn: Any, seq: int) -> None:
    _write(conn, "projection_state", [{"name": PROJECTION, "last_seq": seq}])


class PgStatusProjector:
    """Keeps the read-side tables of a PostgreSQL log current (see the module docstring)."""

    name = PROJECTION

    def __init__(self) -> None:
        self.last_seq: int | None = None
        self.jobs: dict[str, State] = {}  # job_id -> the fold of that job's events (unfinished jobs)

    def setup(self, conn: Any) -> None:
        for name, table in TABLES.items():
            conn.execute(table.ddl(name))
        for stmt in INDEXES:
            conn.execute(stmt)
        conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")  # no append between the catch-up's reads
        self._catch_up(conn)

    def apply(self, conn: Any, events: Sequence[Event]) -> None:
        """Called inside the append transaction, after the inserts (the table lock is held)."""
        if not events:
            return
        if self.last_seq is None or projection_last_seq(conn) != self.last_seq:
            self._catch_up(conn)  # the new events are in the log already
            return
        touched: dict[str, State] = {}
        for e in events:
            st = touched.get(e.job_id) or self._job(conn, e)
            st.apply(e)
            touched[e.job_id] = st
        write_rows(conn, events, {j: st.jobs[j] for j, st in touched.items()})
        _set_last_seq(conn, events[-1].seq)
        self.last_seq = events[-1].seq
        for j, st in touched.items():
            if st.jobs[j].terminal:
                self.jobs.pop(j, None)
            else:
                self.jobs[j] = st

    def _job(self, conn: Any, e: Event) -> State:
        """The fold of ``e``'s job up to just before ``e`` (:func:`~batchgrader.store.readmodels.fold_before`)."""
        return fold_before(self.jobs, e, lambda: _events(conn, "job_id = %s AND seq < %s", (e.job_id, e.seq)))

    def _catch_up(self, conn: Any) -> None:
        """Bring the tables from ``projection_state.last_seq`` up to the log."""
        (log_last,) = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        start = projection_last_seq(conn) or 0
        if start > log_last:  # tables of some other log: start again
            for name in TABLES:
                conn.execute(f"DELETE FROM {name}")
            start = 0
        if start < log_last:
            touched = [r[0] for r in conn.execute("SELECT DISTINCT job_id FROM events WHERE seq > %s", (start,))]
            if len(touched) > BULK_CATCH_UP:
                everything = fold(_events(conn, "TRUE", ()))
                jobs = {j: everything.jobs[j] for j in touched}
            else:
                jobs = {j: fold(_events(conn, "job_id = %s", (j,))).jobs[j] for j in touched}
            write_rows(conn, _events(conn, "seq > %s AND type = ANY(%s)", (start, list(_PROJECTED_TYPES))), jobs)
            for j in touched:
                self.jobs.pop(j, None)
        _set_last_seq(conn, log_last)
        self.last_seq = log_last


_PROJECTED_TYPES = ("TokensUsed", "QueueLimitLearned", "BatchStatusChanged", *SAVING_EVENTS)


def projectors() -> list[PgStatusProjector]:
    """The read models a daemon keeps on a PostgreSQL log."""
    return [PgStatusProjector()]


def rebuild(store: Any) -> dict[str, int]:
    """Empty the read-side tables of a PostgreSQL store and fill them again from the log."""
    with store.write() as conn:
        conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")
        for name in TABLES:
            conn.execute(f"DELETE FROM {name}")
        p = PgStatusProjector()
        p._catch_up(conn)
        (jobs,) = conn.execute("SELECT COUNT(*) FROM job_status").fetchone()
        (usage,) = conn.execute("SELECT COUNT(*) FROM usage").fetchone()
    return {"last_seq": p.last_seq or 0, "jobs": jobs, "usage_rows": usage}


def fold_state(store: Any) -> State:
    """The fold of a store's whole log."""
    return fold(store.read())

"""Read models of the event log for ``bgctl``: ``job_status``, ``usage`` and ``projection_state``.

The daemon attaches :func:`projectors` to its store (``EventStore(db, projectors=projectors())``);
the store applies them to every append *inside the append transaction*, so the tables are never
ahead of or behind the log.  ``projection_state.last_seq`` records the last event reflected in the
tables (the tracking record): a reader compares it with ``MAX(events.seq)`` to know the tables are
current.

Design: for each append the :class:`StatusProjector` applies the new events to the folded state
of their job (kept in memory for unfinished jobs, else folded from that job's events) and rewrites
the job's row from :class:`~batchgrader.state.JobState` with :func:`job_row` - so a job's
``state`` column is exactly what the fold says.  ``usage`` gets one row per ``TokensUsed`` event
(billed figures, never re-estimated).

The read-side tables are created and changed only by the migrations of
:mod:`batchgrader.store.readmodel_schema` (SQL statements, recorded in ``_sqlite_migrations`` under
the set ``batchgrader.readmodels`` as sqlite-utils ``Migrations`` records them), which also holds their columns; the
``events`` table is never touched.  :func:`rebuild` drops them and recreates them from the log.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from batchgrader.core.log.route_state import answered_in_job, route_summary, shown_route
from batchgrader.core.log.state import TERMINAL_BATCH, ChunkState, JobState, State, fold
from batchgrader.store.eventstore import EVENT_COLUMNS, Event, EventStore, Projector, events_from_rows, read_events
from batchgrader.store.figures import own_figures, row_values
from batchgrader.store.readmodel_schema import (  # noqa: F401 - re-exported: the tables' columns live there
    JOB_STATUS_COLUMNS,
    QUEUE_LIMIT_COLUMNS,
    SAVINGS_COLUMNS,
    USAGE_COLUMNS,
    migrate,
)
from batchgrader.store.readside import (  # noqa: F401 - re-exported: the cheap freshness check lives there
    MIGRATION_NAMES,
    MIGRATION_SET,
    MIGRATIONS_TABLE,
    PROJECTION,
    READ_TABLES,
    log_last_seq,
    projection_last_seq,
)
from batchgrader.store.runtimes import BATCH_RUN_COLUMNS, batch_run_row

# the events of a row of ``savings``: money not spent because an answer was reused
SAVING_EVENTS = ("RequestsReused", "DuplicatesAnswered")


# --- rows ----------------------------------------------------------------------------------------


def chunk_label(c: ChunkState) -> str:
    """One word for where a chunk is (for display; the job label is :attr:`JobState.state`)."""
    if c.done:
        return "failed" if c.failure else "done"
    if (c.failure and c.failure.get("retryable")) or (c.staged and c.upload == "done"):
        return "waiting"  # resubmitted later (token limit), or uploaded ahead of queue room
    if c.create == "done" and c.status:
        return "downloading" if c.status in TERMINAL_BATCH else c.status
    if c.create == "requested":
        return "submitting"
    if c.upload == "started":
        return "uploading"
    if c.upload == "done":
        return "uploaded"
    if c.upload == "failed":
        return "upload_failed"
    return "pending"


def chunk_row(c: ChunkState) -> dict[str, Any]:
    """A chunk in ``job_status.chunks`` (and ``bgctl status``'s ``batches``): kept small, since
    ``bgctl status`` decodes it for every job."""
    return {
        "chunk": c.index,
        "status": chunk_label(c),
        "batch_id": c.batch_id,
        "request_counts": dict(c.request_counts),
        "requested_ts": c.requested_ts,  # when its batch's create was asked: the start of its run (the ETA)
    }


def chunk_detail(c: ChunkState) -> dict[str, Any]:
    """A chunk in full, for ``bgctl status JOB``."""
    return {
        "index": c.index,
        "status": chunk_label(c),
        "batch_id": c.batch_id,
        "batch_status": c.status,
        "request_counts": dict(c.request_counts),
        "requests": c.requests,
        "input_tokens": c.input_tokens,
        "attempt": c.attempt,
        "retry": c.custom_ids is not None,
        "succeeded": c.succeeded,
        "failed": c.failed,
        "error": c.last_error,
    }


def job_row(job: JobState) -> dict[str, Any]:
    """The ``job_status`` row of a job: a pure function of its folded state.  Its figures (rows,
    answered and failed, tokens, cost, model) are :func:`~batchgrader.store.figures.own_figures`';
    a panel's row is given its judges' figures when read (``store/queries.py``)."""
    err = job.error or {}
    held = job.held or {}
    figures = row_values(own_figures(job, sources=False))
    return {
        "job_id": job.job_id,
        "file": job.file,
        "profile": job.profile,
        "model": figures["model"],
        "state": job.state,
        "sandbox": int(job.sandbox),
        "rows": figures["rows"],
        "requests": figures["requests"],
        "chunks_total": job.chunks_total,
        "chunks_done": job.chunks_done,
        "input_tokens": figures["input_tokens"],
        "prompt_tokens": figures["prompt_tokens"],
        "cached_tokens": figures["cached_tokens"],
        "output_tokens": figures["output_tokens"],
        "reasoning_tokens": figures["reasoning_tokens"],
        "cost_usd": figures["cost_usd"],
        "estimate_usd": figures["estimate_usd"],
        "succeeded": figures["succeeded"],
        "failed": figures["failed"],
        "error_code": err.get("code"),
        "error": err.get("error"),
        "error_stage": err.get("stage"),
        "error_hint": err.get("hint"),
        "last_error": job.last_error,
        "held_code": held.get("code"),
        "held_reason": held.get("reason"),
        "cancel_requested": int(job.cancel_requested),
        "result_path": job.result_path,
        "error_path": job.error_path,
        "archived_path": job.archived_path,
        "created_ts": job.created_ts,
        "updated_ts": job.updated_ts,
        "version": job.version,
        "cached_rows": job.cached_rows + job.duplicates_answered,
        "duplicate_rows": job.duplicates_answered + job.copied_rows,  # the file's repeats (core/route_state.requests_by_source)
        "saved_usd": figures["saved_usd"],
        "input_tokens_exact": int(job.input_tokens_exact),
        "cache_write_tokens": figures["cache_write_tokens"],
        "cache_saved_usd": figures["cache_saved_usd"],
        "route": json.dumps(route_summary(job), sort_keys=True) if shown_route(job) else None,
        "chunks": json.dumps(
            [chunk_row(c) for c in sorted(job.chunks.values(), key=lambda c: c.index)],
            ensure_ascii=False,
            sort_keys=True,
            separators=(",", ":"),
        ),
    }


def usage_row(e: Event, sandbox: bool) -> dict[str, Any]:
    """The ``usage`` row of a ``TokensUsed`` event (the day rule is the fold's)."""
    p = e.payload
    return {
        "seq": e.seq,
        "job_id": e.job_id,
        "chunk": p.get("chunk"),
        "batch_id": p.get("batch_id"),
        "model": p.get("model"),
        "day": p.get("day") or e.ts[:10],
        "ts": e.ts,
        "prompt_tokens": int(p.get("prompt_tokens", 0) or 0),
        "cached_tokens": int(p.get("cached_tokens", 0) or 0),
        "completion_tokens": int(p.get("completion_tokens", 0) or 0),
        "reasoning_tokens": int(p.get("reasoning_tokens", 0) or 0),
        "cost_usd": float(p.get("cost_usd") or 0.0),
        "sandbox": int(sandbox),
        "cache_write_tokens": int(p.get("cache_write_tokens") or 0),
        "cache_saved_usd": float(p.get("cache_saved_usd") or 0.0),
        "route": usage_route(p.get("route"), p.get("chunk")),
    }


def usage_route(route: str | None, chunk: int | None) -> str:
    """The route a ``TokensUsed`` paid for: its ``route`` (flex, online), else the preflight
    (chunk -1) or a batch."""
    return route or ("preflight" if chunk == -1 else "batch")


def saving_row(e: Event, job: JobState) -> dict[str, Any]:
    """The ``savings`` row of a ``RequestsReused`` or ``DuplicatesAnswered`` event."""
    p = e.payload
    if e.type == "RequestsReused":  # less the rows the job answered itself (preflight, synchronous route)
        rows = max(0, int(p.get("cached_rows") or 0) - answered_in_job(job))
    else:
        rows = p.get("succeeded", p.get("rows", 0))
    return {
        "seq": e.seq,
        "job_id": e.job_id,
        "model": job.model,
        "day": e.ts[:10],
        "ts": e.ts,
        "rows": int(rows or 0),
        "saved_usd": float(p.get("saved_usd") or 0.0),
        "sandbox": int(job.sandbox),
    }


_BATCH_RUN_SQL = (
    f"INSERT OR REPLACE INTO batch_runs ({', '.join(BATCH_RUN_COLUMNS)}) VALUES ({', '.join('?' * len(BATCH_RUN_COLUMNS))})"
)


def _write_batch_runs(conn: sqlite3.Connection, events: Iterable[Event], jobs: Any) -> None:
    """``jobs``: job_id -> the job's folded state after ``events``."""
    rows = (batch_run_row(e, jobs[e.job_id]) for e in events if e.type == "BatchStatusChanged" and e.job_id in jobs)
    conn.executemany(_BATCH_RUN_SQL, (tuple(r.values()) for r in rows if r is not None))


_JOB_SQL = (
    f"INSERT OR REPLACE INTO job_status ({', '.join(JOB_STATUS_COLUMNS)}) VALUES ({', '.join('?' * len(JOB_STATUS_COLUMNS))})"
)
_USAGE_SQL = f"INSERT OR REPLACE INTO usage ({', '.join(USAGE_COLUMNS)}) VALUES ({', '.join('?' * len(USAGE_COLUMNS))})"


def _write_jobs(conn: sqlite3.Connection, jobs: Iterable[JobState]) -> None:
    conn.executemany(_JOB_SQL, (tuple(job_row(j).values()) for j in jobs))


def _write_usage(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]]) -> None:
    conn.executemany(_USAGE_SQL, (tuple(r.values()) for r in rows))


def _write_queue_limits(conn: sqlite3.Connection, events: Iterable[Event]) -> None:
    conn.executemany(
        "INSERT OR REPLACE INTO queue_limits (base_url, model, limit_tokens, exact, source, ts) VALUES (?, ?, ?, ?, ?, ?)",
        (
            (
                e.payload.get("base_url") or "",
                e.payload.get("model") or "",
                int(e.payload.get("limit") or 0),
                int(bool(e.payload.get("exact"))),
                e.payload.get("source"),
                e.ts,
            )
            for e in events
            if e.type == "QueueLimitLearned"
        ),
    )


_SAVINGS_SQL = f"INSERT OR REPLACE INTO savings ({', '.join(SAVINGS_COLUMNS)}) VALUES ({', '.join('?' * len(SAVINGS_COLUMNS))})"


def _write_savings(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]]) -> None:
    conn.executemany(_SAVINGS_SQL, (tuple(r.values()) for r in rows))


def _write_events(conn: sqlite3.Connection, events: Sequence[Event], jobs: dict[str, JobState]) -> None:
    """The rows of an append's ``events`` (``jobs``: job_id -> its folded state after them)."""
    _write_jobs(conn, jobs.values())
    _write_usage(conn, (usage_row(e, jobs[e.job_id].sandbox) for e in events if e.type == "TokensUsed"))
    _write_queue_limits(conn, events)
    _write_savings(conn, (saving_row(e, jobs[e.job_id]) for e in events if e.type in SAVING_EVENTS))
    _write_batch_runs(conn, events, jobs)


def _set_last_seq(conn: sqlite3.Connection, seq: int) -> None:
    conn.execute("INSERT OR REPLACE INTO projection_state (name, last_seq) VALUES (?, ?)", (PROJECTION, seq))


# --- reading the log on a raw connection ----------------------------------------------------------


def iter_events(conn: sqlite3.Connection, after: int = 0, until: int | None = None, job_id: str | None = None) -> Iterator[Event]:
    """Events with ``after < seq [<= until]`` in order, upcast (same as :meth:`EventStore.read`)."""
    return read_events(conn, after=after, job_id=job_id, until=until)


def fold_connection(conn: sqlite3.Connection, job_id: str | None = None) -> State:
    """The fold of the whole log (or of one job's events) read through ``conn``."""
    return fold(iter_events(conn, job_id=job_id))


# --- the projector --------------------------------------------------------------------------------


def fold_before(remembered: dict[str, State], e: Event, events: Callable[[], Iterable[Event]]) -> State:
    """A projector's fold of ``e``'s job up to just before ``e``: the one it remembers, unless
    another writer appended to the job since (its version is not the one before ``e``), else
    folded again from the job's ``events`` before ``e``."""
    st = remembered.get(e.job_id)
    if st is None or st.jobs[e.job_id].version != e.job_seq - 1:
        st = fold(events())
    return st


class StatusProjector:
    """Maintains ``job_status``, ``usage`` and ``projection_state`` (see the module docstring).

    It keeps in memory the folded state of the unfinished jobs it has written since it was set
    up (one :class:`State` per job, folded from that job's events on first use), so neither
    set-up nor an append folds the whole log: when the tables are current at start-up there is
    nothing to read.  ``projection_state.last_seq`` is the truth; whenever it is not the seq just
    before the events being applied (another writer appended, or an append this projector had
    applied was rolled back), the projector catches up from the log instead.
    """

    name = PROJECTION
    BULK_CATCH_UP = 200  # more jobs to catch up than this: one fold of the whole log

    def __init__(self) -> None:
        self.last_seq: int | None = None  # the last event applied (None: not set up)
        self.jobs: dict[str, State] = {}  # job_id -> the fold of that job's events

    def setup(self, conn: sqlite3.Connection) -> None:
        """Called by :class:`EventStore` inside its set-up write transaction."""
        migrate(conn)
        self._catch_up(conn)

    def apply(self, conn: sqlite3.Connection, events: Sequence[Event]) -> None:
        """Called by :meth:`EventStore.append` inside the append transaction, after the inserts."""
        if not events:
            return
        last = projection_last_seq(conn)
        if self.last_seq is None or last != self.last_seq or events[0].seq != last + 1:
            self._resync(conn, last)  # the new events are in the log already
            return
        touched: dict[str, State] = {}
        for e in events:
            st = touched.get(e.job_id) or self._job(conn, e)
            st.apply(e)
            touched[e.job_id] = st
        try:
            _write_events(conn, events, {j: st.jobs[j] for j, st in touched.items()})
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            self.jobs.clear()  # a read-side table was dropped under us: recreate and refill it
            migrate(conn)
            self._catch_up(conn)
            return
        _set_last_seq(conn, events[-1].seq)
        self.last_seq = events[-1].seq
        for j, st in touched.items():
            if st.jobs[j].terminal:
                self.jobs.pop(j, None)  # finished: folded again if it is ever reopened
            else:
                self.jobs[j] = st

    def _resync(self, conn: sqlite3.Connection, last: int | None) -> None:
        """The tables are not where this projector left them (``last``: their last seq, None when
        they are gone): catch up from the log."""
        if self.last_seq is None or last is None or self.last_seq > last:
            self.jobs.clear()  # memory ran ahead of the log (a rolled-back append), or tables gone
        if last is None:
            migrate(conn)  # the tables were dropped under us
        self._catch_up(conn)

    def _job(self, conn: sqlite3.Connection, e: Event) -> State:
        """The fold of ``e``'s job up to just before ``e``."""
        return fold_before(self.jobs, e, lambda: iter_events(conn, job_id=e.job_id, until=e.seq - 1))

    def _catch_up(self, conn: sqlite3.Connection) -> None:
        """Bring the tables from ``projection_state.last_seq`` up to the log as ``conn`` sees it."""
        log_last = log_last_seq(conn)
        last = projection_last_seq(conn)
        if last is not None and last > log_last:  # tables from some other log: start again
            conn.execute("DELETE FROM job_status")
            conn.execute("DELETE FROM usage")
            conn.execute("DELETE FROM queue_limits")
            conn.execute("DELETE FROM savings")
            conn.execute("DELETE FROM batch_runs")
            last = None
        start = last or 0
        if last is None or start < log_last:
            touched = [r[0] for r in conn.execute("SELECT DISTINCT job_id FROM events WHERE seq > ?", (start,))]
            if len(touched) > self.BULK_CATCH_UP:
                everything = fold(iter_events(conn))
                jobs = {j: everything.jobs[j] for j in touched}
            else:
                jobs = {j: fold(iter_events(conn, job_id=j)).jobs[j] for j in touched}
            _write_jobs(conn, jobs.values())
            _write_usage(conn, (usage_row(e, jobs[e.job_id].sandbox) for e in _tokens_used(conn, start)))
            _write_queue_limits(conn, _of_type(conn, start, "QueueLimitLearned"))
            _write_savings(conn, (saving_row(e, jobs[e.job_id]) for e in _of_types(conn, start, SAVING_EVENTS)))
            _write_batch_runs(conn, _of_type(conn, start, "BatchStatusChanged"), jobs)
            _set_last_seq(conn, log_last)
            for j in touched:
                self.jobs.pop(j, None)
        self.last_seq = log_last


def _tokens_used(conn: sqlite3.Connection, after: int) -> list[Event]:
    return _of_type(conn, after, "TokensUsed")


def _of_type(conn: sqlite3.Connection, after: int, type_: str) -> list[Event]:
    rows = conn.execute(f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > ? AND type = ? ORDER BY seq", (after, type_)).fetchall()
    return events_from_rows(rows)


def _of_types(conn: sqlite3.Connection, after: int, types: Sequence[str]) -> list[Event]:
    rows = conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > ? AND type IN ({', '.join('?' * len(types))}) ORDER BY seq",
        (after, *types),
    ).fetchall()
    return events_from_rows(rows)


def projectors() -> list[Projector]:
    """The read models the daemon maintains: ``EventStore(db, projectors=projectors())``."""
    return [StatusProjector()]


# --- rebuild --------------------------------------------------------------------------------------


def rebuild(db_path: str | Path) -> dict[str, int]:
    """Drop the read-side tables and recreate them from the log alone (``bgctl rebuild``).

    The log is folded in a read transaction (no lock: a running daemon goes on), then one
    ``BEGIN IMMEDIATE`` transaction replaces the tables and catches up with whatever the daemon
    appended meanwhile; readers see the old tables or the new ones.  Returns counts.
    """
    path = Path(db_path)
    if not path.exists():
        raise FileNotFoundError(f"no database at {path} (has the daemon run yet?)")
    with EventStore(path) as store:
        conn = store.conn
        tokens_used: list[Event] = []
        queue_limits: list[Event] = []
        savings: list[Event] = []
        status_changes: list[Event] = []

        def log() -> Iterator[Event]:
            for e in iter_events(conn):
                if e.type == "TokensUsed":
                    tokens_used.append(e)
                elif e.type == "BatchStatusChanged" and e.payload.get("status") == "completed":
                    status_changes.append(e)
                elif e.type == "QueueLimitLearned":
                    queue_limits.append(e)
                elif e.type in SAVING_EVENTS:
                    savings.append(e)
                yield e

        conn.execute("BEGIN")  # a read snapshot
        try:
            state = fold(log())
        finally:
            conn.execute("COMMIT")
        with store.write() as conn:
            for t in READ_TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {t}")
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MIGRATIONS_TABLE,)).fetchone():
                conn.execute(f"DELETE FROM {MIGRATIONS_TABLE} WHERE migration_set = ?", (MIGRATION_SET,))
            migrate(conn)
            _write_jobs(conn, state.jobs.values())
            _write_usage(conn, (usage_row(e, state.jobs[e.job_id].sandbox) for e in tokens_used))
            _write_queue_limits(conn, queue_limits)
            _write_savings(conn, (saving_row(e, state.jobs[e.job_id]) for e in savings))
            _write_batch_runs(conn, status_changes, state.jobs)
            _set_last_seq(conn, state.last_seq)
            projector = StatusProjector()
            projector.setup(conn)  # the events appended since the snapshot, if any
            (jobs,) = conn.execute("SELECT COUNT(*) FROM job_status").fetchone()
            (usage,) = conn.execute("SELECT COUNT(*) FROM usage").fetchone()
            last = projector.last_seq or 0
    return {"last_seq": last, "jobs": jobs, "usage_rows": usage}

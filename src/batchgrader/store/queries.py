"""What ``bgctl status`` and ``costs`` ask: plain functions returning dicts and lists (``bgctl events``:
:mod:`batchgrader.store.log_queries`).

Every function opens the database read-only (``mode=ro``, see :func:`batchgrader.store.connect`)
and reads in one short read transaction, so it sees one consistent snapshot and never takes the
write lock: the daemon is never blocked.  When the home's ``store_url`` names a PostgreSQL store,
the same queries read its tables (the same read models) in one ``REPEATABLE READ`` read-only
transaction (:func:`batchgrader.store.pgstore.reading`), and :func:`leases` says which daemon
holds which lease.  Status and costs come from the read models
(:mod:`batchgrader.readmodels`); when those tables are missing or behind the log, the answer is
folded from the log instead and says so (``source == "log"`` and a ``note``).

Job ids may be given as a unique prefix (:func:`resolve_job`).
"""

from __future__ import annotations

import gc
import json
import operator
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchgrader.core.host.home import Home
from batchgrader.core.log.route_state import route_summary
from batchgrader.store import readside

if TYPE_CHECKING:
    from batchgrader.core.log.state import JobState
from batchgrader.store.eventstore import EVENT_COLUMNS, connect, events_from_rows, json_loads_many
from batchgrader.store.runtimes import attach_progress

HomeLike = Home | str | os.PathLike[str]

SOURCE_READ_MODEL = "read_model"
SOURCE_LOG = "log"


class QueryError(Exception):
    """A question that cannot be answered as asked (unknown or ambiguous job, bad argument)."""


class UnknownJob(QueryError, LookupError):
    pass


class AmbiguousJob(QueryError, LookupError):
    def __init__(self, prefix: str, candidates: list[str]):
        self.prefix, self.candidates = prefix, candidates
        more = ", ..." if len(candidates) > 5 else ""
        super().__init__(
            f"job id prefix {prefix!r} matches several jobs ({', '.join(candidates[:5])}{more}); give more characters"
        )


# --- plumbing --------------------------------------------------------------------------------------


def db_path(home: HomeLike) -> Path:
    """The database of a home (a :class:`Home`, its root directory, or the .db file itself)."""
    if isinstance(home, Home):
        return home.db
    p = Path(home)
    return p if p.suffix == ".db" or p.is_file() else Home.resolve(p).db


def store_url(home: HomeLike) -> str | None:
    """The PostgreSQL store a home's commands read (its ``store_url``), or None: the SQLite file.
    A path given instead of a :class:`Home` is always an SQLite file."""
    if not isinstance(home, Home):
        return None
    from batchgrader.store.backend import configured_store_url

    return configured_store_url(home)


@contextmanager
def pg_reading(url: str, snapshot: bool = True) -> Iterator[Any]:
    from batchgrader.store.pgstore import reading as pg_reading

    try:
        with pg_reading(url, snapshot=snapshot) as conn:
            yield conn
    except ConnectionError as exc:
        raise QueryError(str(exc)) from None


def log_exists(home: HomeLike) -> bool:
    """Whether the home has an event log to read: the database file with its ``events`` table.
    False before the daemon first ran, and while it is creating the database (the file is there,
    its tables not yet): both mean "no jobs yet".  With ``store_url``: whether the PostgreSQL
    database has its ``events`` table (:class:`QueryError` when it cannot be reached)."""
    url = store_url(home)
    if url:
        from batchgrader.store.pgstore import has_log

        with pg_reading(url) as conn:
            return has_log(conn)
    path = db_path(home)
    if not path.exists():
        return False
    try:
        conn = connect(path, readonly=True)
    except (FileNotFoundError, sqlite3.DatabaseError):
        return False
    try:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events'").fetchone() is not None
    except sqlite3.DatabaseError:  # not a database yet (being written), or locked past the busy timeout
        return False
    finally:
        conn.close()


@contextmanager
def reading(home: HomeLike) -> Iterator[sqlite3.Connection]:
    """A read-only connection inside one read transaction (a consistent snapshot); on a
    PostgreSQL store (``store_url``), one that takes the same queries (``?`` placeholders)."""
    url = store_url(home)
    if url:
        with pg_reading(url) as pg:
            yield pg
        return
    conn = connect(db_path(home), readonly=True)
    try:
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")
    finally:
        conn.close()


def resolve_job(conn: sqlite3.Connection, job_id: str) -> str:
    """The job id that ``job_id`` names exactly or as a unique prefix (two index seeks)."""
    if not job_id:
        raise UnknownJob("empty job id")
    if conn.execute("SELECT 1 FROM events WHERE job_id = ? LIMIT 1", (job_id,)).fetchone():
        return job_id
    candidates: list[str] = []
    cur = job_id
    while len(candidates) < 6:
        row = conn.execute("SELECT job_id FROM events WHERE job_id > ? ORDER BY job_id LIMIT 1", (cur,)).fetchone()
        if row is None or not row[0].startswith(job_id):
            break
        candidates.append(row[0])
        cur = row[0]
    if not candidates:
        raise UnknownJob(f"no job {job_id!r} (bgctl status lists the jobs)")
    if len(candidates) > 1:
        raise AmbiguousJob(job_id, candidates)
    return candidates[0]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Building ten thousand row dicts triggers many needless cyclic-GC passes; pause it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# The columns of the job list (bgctl status); job_detail() has every column and more.  "chunks"
# must stay last: it becomes "batches".
STATUS_COLUMNS = (
    "job_id",
    "file",
    "profile",
    "model",
    "state",
    "sandbox",
    "rows",
    "chunks_total",
    "chunks_done",
    "input_tokens",
    "prompt_tokens",
    "output_tokens",
    "cost_usd",
    "succeeded",
    "failed",
    "error_code",
    "error",
    "last_error",
    "held_reason",
    "cancel_requested",
    "result_path",
    "created_ts",
    "updated_ts",
    "requests",  # rows sent (planned requests)
    "cached_rows",  # rows answered without a request of their own (stored answers, duplicates)
    "duplicate_rows",  # of them, repeats of an earlier row of the file (answered_by: duplicate)
    "saved_usd",
    "input_tokens_exact",  # 1: exact input tokens; 0: estimates (InputTokensCounted); NULL: before it existed
    "route",  # flex/online jobs: their route and rows and cost by route (JSON); NULL: batch
    "chunks",
)
_ORDER_KEY = operator.itemgetter(STATUS_COLUMNS.index("created_ts"), 0)  # (created_ts, job_id)


def _present(
    rows: list[tuple], now: float, source: str, note: str | None, columns: tuple[str, ...] = STATUS_COLUMNS
) -> list[dict[str, Any]]:
    """Rows (tuples of ``columns``, ending with ``chunks``) as bgctl shows them."""
    cols = list(columns)
    assert cols[-1] == "chunks"
    cols.pop()  # zip() below stops before the last column
    batches = json_loads_many([r[-1] or "[]" for r in rows])
    out = []
    fromiso = datetime.fromisoformat
    for r, b in zip(rows, batches):
        d = dict(zip(cols, r))
        d["sandbox"] = bool(d["sandbox"])
        d["cancel_requested"] = bool(d["cancel_requested"])
        d["input_tokens_exact"] = d.get("input_tokens_exact") != 0  # NULL (older rows) counts as exact
        d["route_summary"] = json.loads(d["route"]) if d.get("route") else None  # "route" keeps the column's JSON
        created, updated = d["created_ts"], d["updated_ts"]
        d["age_seconds"] = max(0.0, now - fromiso(created).timestamp()) if created else None
        d["idle_seconds"] = max(0.0, now - fromiso(updated).timestamp()) if updated else None
        d["batches"] = b
        d["source"] = source
        d["note"] = note
        out.append(d)
    return out


def _sandbox_queue(base_url: str | None) -> bool:
    """Whether a learned limit is the sandbox's (its queue is ``sandbox`` or ``sandbox:<provider>``)."""
    return (base_url or "").startswith("sandbox")


def queue_limits(conn: sqlite3.Connection) -> dict[tuple[bool, str], dict[str, Any]]:
    """The latest learned queue limit per (sandbox or not, model) (read model ``queue_limits``)."""
    out: dict[tuple[bool, str], dict[str, Any]] = {}
    try:
        rows = conn.execute("SELECT base_url, model, limit_tokens, exact, source, ts FROM queue_limits ORDER BY ts").fetchall()
    except sqlite3.OperationalError:  # an older read model: no such table
        return out
    for base_url, model, limit, exact, source, ts in rows:
        out[(_sandbox_queue(base_url), model)] = {
            "base_url": base_url,
            "limit": limit,
            "exact": bool(exact),
            "source": source,
            "ts": ts,
        }
    return out


def _limits_of_state(state: Any) -> dict[tuple[bool, str], dict[str, Any]]:
    out: dict[tuple[bool, str], dict[str, Any]] = {}
    for (base_url, model), q in sorted(state.queue_limits.items(), key=lambda kv: kv[1].get("ts") or ""):
        out[(_sandbox_queue(base_url), model)] = {
            "base_url": base_url,
            **{k: q.get(k) for k in ("limit", "exact", "source", "ts")},
        }
    return out


WAITING_CHUNKS = ("waiting", "pending")


def _attach_queue(jobs: list[dict[str, Any]], limits: dict[tuple[bool, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Each job's ``queue``: the learned limit of its model (the sandbox's for a sandbox job, a
    real provider's for another) and whether it waits for room, or None."""
    for d in jobs:
        q = limits.get((bool(d.get("sandbox")), d.get("model") or ""))
        if q is None:
            d["queue"] = None
            continue
        waiting = d["state"] in ("queued", "submitting", "running") and any(
            b.get("status") in WAITING_CHUNKS for b in d.get("batches") or []
        )
        d["queue"] = {"model": d["model"], **q, "waiting": waiting}
    return jobs


#: the chunk steps that hold one of ``max_simultaneous_batches`` (as core/decide.batches_in_use counts)
SLOT_STEPS = ("uploading", "uploaded", "submitting", "validating", "in_progress", "finalizing", "cancelling")


def _batch_cap(home: HomeLike) -> int | None:
    """``max_simultaneous_batches`` as the daemon loads it (None: unset, or the configuration
    cannot be read here: ``bgctl config show`` says why)."""
    if not isinstance(home, Home):
        return None
    from batchgrader.core.configuration.config import load_config

    try:
        return load_config(home).default.max_simultaneous_batches
    except Exception:  # noqa: BLE001 - status answers whatever the configuration's state
        return None


def _attach_batch_slots(jobs: list[dict[str, Any]], cap: int | None) -> list[dict[str, Any]]:
    """Each job's ``waiting_for``: ``{code: max_simultaneous_batches, limit, in_use}`` when it has
    batches still to send while its queue (the emulator's for a sandbox job, the provider's for
    a real one) has every batch slot taken, else None."""
    in_use = {False: 0, True: 0}
    for d in jobs:
        in_use[bool(d.get("sandbox"))] += sum(1 for b in d.get("batches") or () if b.get("status") in SLOT_STEPS)
    for d in jobs:
        used = in_use[bool(d.get("sandbox"))]
        waits = (
            cap is not None
            and used >= cap
            and d["state"] in ("queued", "submitting", "running")
            and any(b.get("status") == "pending" for b in d.get("batches") or ())
        )
        d["waiting_for"] = {"code": "max_simultaneous_batches", "limit": cap, "in_use": used} if waits else None
    return jobs


def read_model_problem(conn: Any) -> str | None:
    """Why the read-side tables cannot answer for the log (None: they can), in either backend."""
    from batchgrader.store.pgstore import QmarkConnection

    if isinstance(conn, QmarkConnection):
        return readside.pg_read_model_problem(conn)
    return readside.read_model_problem(conn)


def fallback_note(problem: str) -> str:
    return f"{problem}; this answer was folded from the event log (`bgctl rebuild` restores the read model)"


# --- status ----------------------------------------------------------------------------------------


def status(home: HomeLike, job_id: str | None = None, now: float | None = None) -> list[dict[str, Any]]:
    """One dict per job (oldest first), or the one job named by ``job_id`` (a unique prefix works).

    Keys: the :data:`STATUS_COLUMNS` of ``job_status`` (``sandbox`` and ``cancel_requested`` as
    booleans; ``chunks`` becomes ``batches``; :func:`job_detail` has every column) plus ``age_seconds``,
    ``idle_seconds``, ``batches`` (a list of ``{chunk, batch_id, status, request_counts}``, one per
    chunk; ``status`` is the chunk's step: pending, uploading, validating, in_progress, ..., done,
    failed), ``source`` (``"read_model"`` or ``"log"``), ``note`` (why the log was folded, else None)
    and ``daemon`` (on a shared PostgreSQL store, the daemon holding the job's lease, else None).
    """
    lease_now, now = now, time.time() if now is None else now
    with reading(home) as conn, gc_paused():
        jid = resolve_job(conn, job_id) if job_id is not None else None
        problem = read_model_problem(conn)
        if problem is None:
            sql = f"SELECT {', '.join(STATUS_COLUMNS)} FROM job_status"
            if jid is None:
                # a table scan and a sort here: ~25% faster than walking the created_ts index
                rows = conn.execute(sql).fetchall()
                rows.sort(key=_ORDER_KEY)
            else:
                rows = conn.execute(sql + " WHERE job_id = ?", (jid,)).fetchall()
            found = _attach_queue(_present(rows, now, SOURCE_READ_MODEL, None), queue_limits(conn))
            found = attach_progress(_attach_batch_slots(found, _batch_cap(home)), conn, now)
            return panel_sums(_attach_daemons(found, conn, home, lease_now), _judge_rows(conn, found, now))
        from batchgrader.store import readmodels as rm  # the fold: only when the read model cannot answer

        state = rm.fold_connection(conn, job_id=jid)
        jobs = sorted(state.jobs.values(), key=lambda j: (j.created_ts, j.job_id))
        found = _present([_pick(rm.job_row(j)) for j in jobs], now, SOURCE_LOG, fallback_note(problem))
        found = _attach_batch_slots(_attach_queue(found, _limits_of_state(state)), _batch_cap(home))
        return panel_sums(_attach_daemons(attach_progress(found, conn, now), conn, home, lease_now))


def panel_sums(rows: list[dict[str, Any]], more: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each judge panel's row (a job whose judges' jobs, ``<id>-j1``, ``-j2``, ..., are among
    ``rows`` or ``more``) given its judges' figures by :func:`~batchgrader.store.figures.panel_row`
    (the same :func:`~batchgrader.store.figures.panel_figures` that ``status JOB`` and ``report``
    use): their tokens, cost, estimate and models, and ``judges``; the judges' rows stay as they
    are (totals count each cost once: from the judges' jobs)."""
    from batchgrader.core.rules.panel import judge_job_id
    from batchgrader.store.figures import panel_row

    by_id = {r["job_id"]: r for r in [*(more or ()), *rows]}
    for r in rows:
        judges: list[dict[str, Any]] = []
        while (judge := by_id.get(judge_job_id(r["job_id"], len(judges) + 1))) is not None:
            judges.append(judge)
        if judges:
            panel_row(r, judges)
    return rows


def _judge_rows(conn: sqlite3.Connection, rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The ``job_status`` rows of the judges (``<id>-j…``) of ``rows`` that ``rows`` do not hold
    (one primary-key range per row)."""
    shown = {r["job_id"] for r in rows}
    sql = f"SELECT {', '.join(STATUS_COLUMNS)} FROM job_status WHERE job_id >= ? AND job_id < ?"
    found = []
    for r in rows:
        found += [x for x in conn.execute(sql, (r["job_id"] + "-j", r["job_id"] + "-k")).fetchall() if x[0] not in shown]
    return _present(found, now, SOURCE_READ_MODEL, None) if found else []


FINISHED_STATES = ("completed", "completed_with_errors", "failed", "cancelled")


def status_overview(home: HomeLike, active_limit: int = 50, finished_limit: int = 30, now: float | None = None) -> dict[str, Any]:
    """What the `bgctl status` table shows: the newest ``active_limit`` unfinished jobs and the
    newest ``finished_limit`` finished ones (oldest first), with the count of jobs per state.
    Selected in SQL, so it costs the same with ten or ten thousand jobs in the log.

    Returns ``{jobs, counts, total, hidden_active, hidden_finished, source, note}``."""
    lease_now, now = now, time.time() if now is None else now
    with reading(home) as conn, gc_paused():
        problem = read_model_problem(conn)
        if problem is None:
            counts = dict(conn.execute("SELECT state, COUNT(*) FROM job_status GROUP BY state").fetchall())
            marks = ", ".join("?" * len(FINISHED_STATES))
            sql = f"SELECT {', '.join(STATUS_COLUMNS)} FROM job_status WHERE state {{}} IN ({marks}) ORDER BY created_ts DESC LIMIT ?"  # walks the created_ts index, stops at the limit
            active = conn.execute(sql.format("NOT"), (*FINISHED_STATES, active_limit)).fetchall()
            finished = conn.execute(sql.format(""), (*FINISHED_STATES, finished_limit)).fetchall()
            rows = sorted(active + finished, key=_ORDER_KEY)
            jobs, source, note = _present(rows, now, SOURCE_READ_MODEL, None), SOURCE_READ_MODEL, None
            attach_progress(_attach_batch_slots(_attach_queue(jobs, queue_limits(conn)), _batch_cap(home)), conn, now)
            panel_sums(_attach_daemons(jobs, conn, home, lease_now), _judge_rows(conn, jobs, now))
        else:
            everything = status(home, now=lease_now)
            counts = {}
            for r in everything:
                counts[r["state"]] = counts.get(r["state"], 0) + 1
            act = [r for r in everything if r["state"] not in FINISHED_STATES][-active_limit:] if active_limit else []
            fin = [r for r in everything if r["state"] in FINISHED_STATES][-finished_limit:] if finished_limit else []
            jobs = sorted(act + fin, key=lambda r: (r["created_ts"] or "", r["job_id"]))
            source, note = SOURCE_LOG, everything[0]["note"] if everything else None
    n_finished = sum(n for st, n in counts.items() if st in FINISHED_STATES)
    n_active = sum(counts.values()) - n_finished
    shown_finished = sum(1 for r in jobs if r["state"] in FINISHED_STATES)
    return {
        "jobs": jobs,
        "counts": counts,
        "total": sum(counts.values()),
        "hidden_active": n_active - (len(jobs) - shown_finished),
        "hidden_finished": n_finished - shown_finished,
        "source": source,
        "note": note,
    }


def _pick(row: dict[str, Any], columns: tuple[str, ...] = STATUS_COLUMNS) -> tuple:
    return tuple(row[c] for c in columns)


def job_detail(
    home: HomeLike, job_id: str, now: float | None = None, max_rows: int = 20, recent_events: int = 10
) -> dict[str, Any]:
    """Everything about one job, folded from its own events (exact, whatever the read model says).

    The :func:`status` keys plus ``chunks`` (every chunk in full: index, status, batch_id,
    batch_status, request_counts, requests, input_tokens, attempt, retry, succeeded, failed,
    error), ``warnings``, ``estimate``, ``failed_rows`` (the first
    ``max_rows`` of ``{custom_id, code, message, chunk}``), ``failed_rows_total``,
    ``row_errors`` / ``row_errors_total`` (rows that could never be sent), ``input_path``,
    ``requests_path``, ``events_total``, ``recent_events`` (the last few, as :func:`~batchgrader.store.log_queries.events`) and
    ``route_summary`` (its route, and rows and cost by route: :func:`~batchgrader.core.log.route_state.route_summary`;
    the list's rows have it for jobs on a flex or online route, else None).
    """
    from batchgrader.store import readmodels as rm  # the fold and projector: only off the fast path
    from batchgrader.store.figures import job_figures, row_values

    lease_now, now = now, time.time() if now is None else now
    with reading(home) as conn:
        jid = resolve_job(conn, job_id)
        state = rm.fold_connection(conn, job_id=jid)
        (n_events,) = conn.execute("SELECT COUNT(*) FROM events WHERE job_id = ?", (jid,)).fetchone()
        recent = event_rows(
            conn,
            f"SELECT * FROM (SELECT {EVENT_COLUMNS} FROM events WHERE job_id = ? ORDER BY seq DESC LIMIT ?) AS recent ORDER BY seq",
            (jid, recent_events),
        )
        job: JobState = state.jobs[jid]
        (out,) = _present([tuple(rm.job_row(job).values())], now, SOURCE_LOG, None, tuple(rm.JOB_STATUS_COLUMNS))
        _attach_daemons(attach_progress([out], conn, now), conn, home, lease_now)
        if job.panel is not None:  # a judge panel: its judges' tokens and cost are its own
            judges = [rm.fold_connection(conn, job_id=j["job_id"]).jobs.get(j["job_id"]) for j in job.panel]
            figures = job_figures(job, judges)
            out.update(row_values(figures), judges=[j.job_id for j in figures.judges])
    out.update(
        {
            "chunks": [rm.chunk_detail(c) for c in sorted(job.chunks.values(), key=lambda c: c.index)],
            "warnings": list(job.warnings),
            "text_encoding": job.text_encoding,
            "empty_rows": job.empty_rows,
            "skip_empty": bool((job.settings or {}).get("skip_empty")),
            "estimate": job.estimate,
            "input_path": job.input_path,
            "requests_path": job.requests_path,
            "failed_rows": [{"custom_id": cid, **info} for cid, info in list(job.failed_rows.items())[:max_rows]],
            "failed_rows_total": len(job.failed_rows),
            "row_errors": [dict(info) for info in list(job.row_errors.values())[:max_rows]],
            "row_errors_total": len(job.row_errors),
            "events_total": n_events,
            "recent_events": recent,
            "route_summary": route_summary(job),
        }
    )
    return out


def job_ids(home: HomeLike, prefix: str = "", limit: int = 200) -> list[tuple[str, str | None, str]]:
    """``(job_id, file, state)`` of the jobs whose id starts with ``prefix``, newest first (for
    shell completion: from the read model only, never a fold)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    with reading(home) as conn:
        rows = conn.execute(
            "SELECT job_id, file, state FROM job_status WHERE job_id LIKE ? ESCAPE '\\' ORDER BY created_ts DESC LIMIT ?",
            (escaped + "%", limit),
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


# --- leases ----------------------------------------------------------------------------------------


def _attach_daemons(jobs: list[dict[str, Any]], conn: Any, home: HomeLike, now: float | None) -> list[dict[str, Any]]:
    """Each job's ``daemon``: on a shared PostgreSQL store the daemon holding its lease
    (``host:pid:id``; :mod:`batchgrader.store.leases`) at ``now`` (default: the database server's
    clock, the clock leases are decided by), None when no daemon holds it; None on the SQLite file
    (one daemon serves a home)."""
    holders: dict[str, str] = {}
    if jobs and store_url(home) and conn.execute("SELECT to_regclass('leases') IS NOT NULL").fetchone()[0]:
        clock = "extract(epoch FROM clock_timestamp())" if now is None else "?"
        rows = conn.execute(
            f"SELECT substr(name, 5), holder FROM leases WHERE substr(name, 1, 4) = 'job:' AND holder IS NOT NULL "
            f"AND expires_at > {clock}",
            () if now is None else (now,),
        ).fetchall()
        holders = {job_id: holder for job_id, holder in rows}
    for j in jobs:
        j["daemon"] = holders.get(j["job_id"])
    return jobs


def leases(home: HomeLike, now: float | None = None) -> list[dict[str, Any]] | None:
    """Which daemon holds which lease (:mod:`batchgrader.store.leases`), by name: ``{name, kind
    (account or job), holder (None: released), fence, held, expires_at (UTC ISO), seconds_left}``;
    ``held`` is whether it is unexpired at ``now`` (default: the database server's clock, the
    clock leases are decided by).  None on the SQLite file, which has no leases (one daemon per
    home, under the home's lock)."""
    url = store_url(home)
    if not url:
        return None
    with pg_reading(url) as conn:
        if not conn.execute("SELECT to_regclass('leases') IS NOT NULL").fetchone()[0]:
            return []
        if now is None:
            now = float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
        rows = conn.execute("SELECT name, holder, fence, expires_at FROM leases ORDER BY name").fetchall()
    out = []
    for name, holder, fence, expires_at in rows:
        held = holder is not None and expires_at > now
        out.append(
            {
                "name": name,
                "kind": name.split(":", 1)[0],
                "holder": holder,
                "fence": int(fence),
                "held": held,
                "expires_at": datetime.fromtimestamp(expires_at, UTC).isoformat(timespec="seconds") if holder else None,
                "seconds_left": round(expires_at - now, 1) if held else None,
            }
        )
    return out


def event_rows(conn: sqlite3.Connection, sql: str, args: tuple) -> list[dict[str, Any]]:
    """The events ``sql`` selects (``EVENT_COLUMNS``), each as ``bgctl events`` shows it: a dict, its payload upcast."""
    return [
        {
            "seq": e.seq,
            "job_id": e.job_id,
            "job_seq": e.job_seq,
            "type": e.type,
            "version": e.version,
            "ts": e.ts,
            "payload": e.payload,
        }
        for e in events_from_rows(conn.execute(sql, args).fetchall())
    ]

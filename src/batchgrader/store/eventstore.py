"""The SQLite event store: one append-only table, one writer, many readers.

WAL mode, ``synchronous=FULL``, every write transaction ``BEGIN IMMEDIATE``, a busy timeout.
``UNIQUE(job_id, job_seq)`` means two writers can never interleave one job's events: an append
made against a stale per-job version fails with :class:`ConcurrencyError`.  Readers open the
file read-only (``mode=ro``) and never take the write lock.

Projectors (read models) can be attached; they are applied to the new events inside the same
transaction, so a read model is never ahead of or behind the log it was built from.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

# The event records live in core/log/events.py.  They are re-exported here (`X as X`) so that
# `from batchgrader.store.eventstore import NewEvent, Event, ...` keeps working while other
# branches still import them from here; new code imports them from batchgrader.core.log.events.
from batchgrader.core.log.events import CORRUPT_KEY as CORRUPT_KEY
from batchgrader.core.log.events import Event as Event
from batchgrader.core.log.events import NewEvent as NewEvent
from batchgrader.core.log.events import UnknownEventType as UnknownEventType
from batchgrader.core.log.schema import EVENTS, EVENTS_DDL, SCHEMA_VERSION, check_payload, upcast

BUSY_TIMEOUT_MS = 10_000
WAIT_POLL_S = 0.05  # wait_for_append: how often the file's last position is looked at


class ConcurrencyError(RuntimeError):
    """Another writer appended to the same job first."""


class Projector(Protocol):
    def setup(self, conn: sqlite3.Connection) -> None: ...
    def apply(self, conn: sqlite3.Connection, events: Sequence[Event]) -> None: ...


def utcnow_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


EVENT_COLUMNS = "seq, job_id, job_seq, type, version, ts, payload"
READ_BATCH = 2000  # rows decoded together by events_from_rows() when reading a range


def json_loads_many(texts: list[str]) -> list[Any]:
    """JSON-decode many payloads at once: one ``json.loads`` of ``[p1,p2,...]`` costs about half
    of decoding them one by one (per-call overhead, key memo shared).  A bad row falls back to
    decoding each, so the error is the row's own."""
    if len(texts) > 1:
        try:
            out = json.loads("[" + ",".join(texts) + "]")
        except ValueError:
            pass
        else:
            if len(out) == len(texts):
                return out
    return [json.loads(t) for t in texts]


def _loads_or_corrupt(text: str) -> Any:
    try:
        data = json.loads(text)
    except (ValueError, TypeError):
        return {CORRUPT_KEY: "its payload is not valid JSON"}
    return data if isinstance(data, dict) else {CORRUPT_KEY: "its payload is not a JSON object"}


class DatabaseMoved(RuntimeError):
    """The database file was replaced or deleted while this process had it open: writing on
    would go to a file nobody reads (or mix two histories)."""


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


class SchemaTooNew(RuntimeError):
    """The database was written by a newer BatchGrader: it is never read with older meanings."""


def check_schema_version(conn: sqlite3.Connection, path: Path, readonly: bool) -> None:
    """Refuse a database whose ``PRAGMA user_version`` is newer than :data:`SCHEMA_VERSION`;
    stamp ours on a database that has none yet (or an older one)."""
    (found,) = conn.execute("PRAGMA user_version").fetchone()
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{path} was written by a newer BatchGrader (database schema {found}; this version knows "
            f"schema {SCHEMA_VERSION}). Upgrade BatchGrader; the database is left untouched."
        )
    if not readonly and found < SCHEMA_VERSION:
        conn.execute(f"PRAGMA user_version={int(SCHEMA_VERSION)}")


_new_object = object.__new__


def events_from_rows(rows: Sequence[tuple]) -> list[Event]:
    """``(seq, job_id, job_seq, type, version, ts, payload)`` rows -> upcast :class:`Event` objects."""
    try:
        payloads = json_loads_many([r[6] for r in rows])
    except (ValueError, TypeError):
        payloads = [_loads_or_corrupt(r[6]) for r in rows]  # a bad row: that job is set aside
    out: list[Event] = []
    append = out.append
    for (seq, job_id, job_seq, type_, version, ts, _), data in zip(rows, payloads):
        et = EVENTS.get(type_)
        if et is not None and version > et.version:
            data = {CORRUPT_KEY: f"{type_} version {version} is newer than this code knows ({et.version})"}
        elif et is not None and version != et.version and CORRUPT_KEY not in data:
            data = upcast(type_, version, data)  # a missing upcaster is a bug: it raises
            version = et.version
        # Same object as Event(...) builds, without the seven object.__setattr__ calls a frozen
        # dataclass __init__ makes (a third of the per-event cost of reading a large log).
        e = _new_object(Event)
        d = e.__dict__
        d["seq"], d["job_id"], d["job_seq"], d["type"], d["version"], d["ts"], d["payload"] = (
            seq,
            job_id,
            job_seq,
            type_,
            version,
            ts,
            data,
        )
        append(e)
    return out


def read_events(
    conn: sqlite3.Connection, after: int = 0, job_id: str | None = None, limit: int | None = None, until: int | None = None
) -> Iterator[Event]:
    """Events with ``after < seq [<= until]`` (of one job), in order, upcast; read in batches."""
    sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > ?"
    args: list[Any] = [after]
    if until is not None:
        sql += " AND seq <= ?"
        args.append(until)
    if job_id is not None:
        sql += " AND job_id = ?"
        args.append(job_id)
    sql += " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    cur = conn.execute(sql, args)
    try:
        while rows := cur.fetchmany(READ_BATCH):
            yield from events_from_rows(rows)
    finally:
        cur.close()


def connect(path: Path, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        if not Path(path).exists():
            raise FileNotFoundError(f"no database at {path} (has the daemon run yet?)")
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if not Path(path).exists():  # create it 0600: -wal and -shm inherit the mode
            os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return conn


class EventStore:
    def __init__(self, path: Path, readonly: bool = False, projectors: Sequence[Projector] = ()):
        self.path = Path(path)
        self.readonly = readonly
        self.conn = connect(self.path, readonly)
        try:
            check_schema_version(self.conn, self.path, readonly)
        except SchemaTooNew:
            self.conn.close()
            raise
        self.projectors = list(projectors)
        self._identity = _file_identity(self.path)
        if not readonly:
            with self.write() as c:
                for stmt in EVENTS_DDL:
                    c.execute(stmt)
                for p in self.projectors:
                    p.setup(c)

    def unavailable(self, exc: BaseException) -> bool:
        """Never: the file is this machine's (a refused write is an error of its own)."""
        return False

    def close(self) -> None:
        self.conn.close()

    def check_file(self) -> None:
        """Raise :class:`DatabaseMoved` if the file at ``path`` is no longer the one opened."""
        now = _file_identity(self.path)
        if now == self._identity:
            return
        what = "deleted" if now is None else "replaced by another file"
        raise DatabaseMoved(
            f"the database {self.path} was {what} while the daemon was running; stopping so that "
            "nothing is written to a file nobody reads. Start the daemon again to use the file that is there now."
        )

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error)."""
        if self.readonly:
            raise PermissionError("this event store was opened read-only")
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        else:
            self.conn.execute("COMMIT")

    # --- writing ----------------------------------------------------------------------------
    def append(
        self,
        job_id: str,
        events: Iterable[NewEvent],
        expected_version: int | None = None,
        also: Callable[[sqlite3.Connection], None] | None = None,
    ) -> list[Event]:
        """Append events to one job atomically. ``expected_version`` = the job's last job_seq seen
        by the caller (0 for a new job), or None to append after whatever is there.  ``also``
        writes what the events record (the answers store) in the same transaction."""
        events = list(events)
        if not events:
            return []
        for e in events:
            check_payload(e.type, e.payload)  # a misspelt or missing field fails here, not in a fold later
        self.check_file()
        with self.write() as c:
            (current,) = c.execute("SELECT COALESCE(MAX(job_seq), 0) FROM events WHERE job_id = ?", (job_id,)).fetchone()
            if expected_version is not None and current != expected_version:
                raise ConcurrencyError(f"job {job_id}: expected version {expected_version}, found {current}")
            stored: list[Event] = []
            ts = utcnow_iso()
            for i, e in enumerate(events, start=1):
                payload = json.dumps(e.payload, ensure_ascii=False, allow_nan=False, sort_keys=True)
                version = EVENTS[e.type].version
                try:
                    cur = c.execute(
                        "INSERT INTO events (job_id, job_seq, type, version, ts, payload) VALUES (?, ?, ?, ?, ?, ?)",
                        (job_id, current + i, e.type, version, ts, payload),
                    )
                except sqlite3.IntegrityError as exc:
                    raise ConcurrencyError(f"job {job_id}: {exc}") from exc
                stored.append(Event(cur.lastrowid or 0, job_id, current + i, e.type, version, ts, json.loads(payload)))
            for p in self.projectors:
                p.apply(c, stored)
            if also is not None:
                also(c)
            return stored

    # --- reading ----------------------------------------------------------------------------
    def read(self, after: int = 0, job_id: str | None = None, limit: int | None = None) -> Iterator[Event]:
        return read_events(self.conn, after=after, job_id=job_id, limit=limit)

    def last_seq(self) -> int:
        (n,) = self.conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        return n

    @property
    def where(self) -> str:
        """Where the log is (for messages): the file's path."""
        return str(self.path)

    def wait_for_append(self, after: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for an event past ``after`` (another connection's
        commit): True when there is one, False when the time ran out.  SQLite has no
        notifications: the file's last position is looked at every :data:`WAIT_POLL_S`."""
        deadline = time.monotonic() + timeout
        while True:
            if self.last_seq() > after:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(WAIT_POLL_S, left))

    def read_model(self, table: str) -> list[dict[str, Any]]:
        """Every row of a read-side table (``job_status``, ``usage``, ...), as dicts, in key order."""
        from batchgrader.store.readtables import TABLES

        spec = TABLES[table]
        return [dict(zip(spec.columns, r)) for r in self.conn.execute(spec.select(table))]

    # --- what else the daemon keeps beside the log ---------------------------------------------
    @property
    def answers(self) -> Any:
        """The answers store in this file (:class:`batchgrader.store.answers.SqliteAnswers`)."""
        from batchgrader.store.answers import SqliteAnswers

        return SqliteAnswers(self)

    def learned_run_times(self, models: Iterable[tuple[str, bool]]) -> dict[tuple[str, bool], list[float]]:
        """The learned batch run times per ``(model, sandbox)`` (:func:`batchgrader.store.runtimes.learned_run_times`)."""
        from batchgrader.store.runtimes import learned_run_times

        return learned_run_times(self.conn, models)

    def integrity_check(self) -> str:
        (res,) = self.conn.execute("PRAGMA integrity_check").fetchone()
        return res

"""The PostgreSQL event store: the same log as the SQLite file, shared by several daemons.

Selected by ``store_url: postgresql://...`` (:func:`batchgrader.store.backend.open_store`).  psycopg 3
and ``psycopg_pool`` are imported lazily (the ``[postgres]`` extra).  The tables mirror the SQLite
file's: ``events(seq, job_id, job_seq, type, version, ts, payload)`` with the payload kept as the
exact JSON text SQLite keeps, so both logs hold the same bytes and fold to the same state.

- **Optimistic appends by constraint.**  An append inserts ``job_seq = expected + 1, ...``;
  ``UNIQUE (job_id, job_seq)`` refuses a second writer (:class:`ConcurrencyError`): the caller
  folds again and decides again (:func:`batchgrader.store.backend.decide_and_append`).
- **Positions in commit order.**  Every append takes ``LOCK TABLE events IN EXCLUSIVE MODE`` (reads
  go on) before it draws positions, so a position is never committed after a higher one: a reader
  tailing ``seq > last`` never passes over an event committed late.  Positions may have gaps (a
  rolled-back append consumes its sequence values): readers track the last seen, never the next.
- **Read models in the append's transaction** (:mod:`batchgrader.store.pg_readmodels`), with the
  answers store's writes (``also``) and the lease check of an intent (:mod:`batchgrader.store.leases`).
- **Wake-ups.**  ``NOTIFY bg_events`` once per append transaction; :meth:`PostgresEventStore.wait_for_append`
  listens on a connection of its own and, after any reconnect, reports a wake-up so that the
  caller re-reads from its last position (a notification is not durable).
- **A dropped connection.**  The pool checks a connection before lending it; an append whose
  commit was cut off is looked up again (its first event at ``(job_id, job_seq)``) before it is
  reported as failed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from batchgrader.core.log.events import Event, NewEvent
from batchgrader.core.log.schema import EVENTS, SCHEMA_VERSION, check_payload
from batchgrader.store.eventstore import READ_BATCH, ConcurrencyError, SchemaTooNew, events_from_rows, utcnow_iso

if TYPE_CHECKING:
    import psycopg  # noqa: F401 - the annotations' module

CHANNEL = "bg_events"
EVENT_COLUMNS = "seq, job_id, job_seq, type, version, ts, payload"

DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS events (
        seq      BIGSERIAL PRIMARY KEY,   -- global order (commit order; may have gaps)
        job_id   TEXT COLLATE "C" NOT NULL,
        job_seq  INTEGER NOT NULL,        -- per-job order, 1, 2, 3...
        type     TEXT COLLATE "C" NOT NULL,
        version  INTEGER NOT NULL,
        ts       TEXT COLLATE "C" NOT NULL,  -- UTC ISO-8601 when recorded (as in the SQLite log)
        payload  TEXT    NOT NULL,        -- JSON text, byte for byte what the SQLite log keeps
        UNIQUE (job_id, job_seq)
    )""",
    """CREATE OR REPLACE FUNCTION bg_events_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'events are append-only and immutable'; END $$""",
    """DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'events_no_change') THEN
            CREATE TRIGGER events_no_change BEFORE UPDATE OR DELETE ON events
                FOR EACH ROW EXECUTE FUNCTION bg_events_immutable();
            CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
                FOR EACH STATEMENT EXECUTE FUNCTION bg_events_immutable();
        END IF;
    END $$""",
    "CREATE TABLE IF NOT EXISTS bg_meta (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
)

#: the PostgreSQL schema's own version (``bg_meta.pg_schema``), apart from the events' (``schema_version``):
#: 1: events and read models; 2: text compared byte by byte as SQLite does (``COLLATE "C"``: job id
#: prefixes, ISO times), the answers store, input claims and leases
PG_SCHEMA = 2


def one(conn: Any, sql: str, args: Sequence[Any] = ()) -> Any:
    """The single value of a query that returns one row."""
    row = conn.execute(sql, args).fetchone()
    assert row is not None, sql
    return row[0]


def answers_ddl() -> tuple[str, ...]:
    from batchgrader.store.answers import PG_ANSWERS_DDL

    return PG_ANSWERS_DDL


def leases_ddl() -> tuple[str, ...]:
    from batchgrader.store.leases import DDL as LEASES_DDL

    return LEASES_DDL


def bytewise_text(conn: Any) -> None:
    """Every text column compared byte by byte, as SQLite compares it (``COLLATE "C"``), whatever
    the database's locale: a job id prefix, ``job_id >= 'x-j'`` and an ISO time order the same
    way in both logs.  Tables of schema 1 are altered once (a no-op after)."""
    rows = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND data_type = 'text' AND collation_name IS DISTINCT FROM 'C' AND table_name <> 'bg_meta'"
    ).fetchall()
    for table, column in rows:
        conn.execute(f'ALTER TABLE {table} ALTER COLUMN {column} TYPE TEXT COLLATE "C"')


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the [postgres] extra is missing
        raise RuntimeError(
            "store_url names a PostgreSQL database, but psycopg is not installed: pip install 'batchgrader[postgres]'"
        ) from exc
    return psycopg


def redact(url: str) -> str:
    """The URL without its password (for messages and ``bgctl status``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class QmarkConnection:
    """A psycopg connection asked in the text the SQLite queries use (``?`` placeholders), so
    that ``bgctl status``, ``events`` and ``costs`` (:mod:`batchgrader.store.queries`) and the run
    times ask both backends the same SQL.  Only ``execute`` (a psycopg cursor back); a literal
    ``%`` is kept as it is, and no query passed here has a literal ``?``."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self.conn.execute(sql.replace("%", "%%").replace("?", "%s"), tuple(args))


@contextmanager
def reading(url: str, snapshot: bool = True) -> Iterator[QmarkConnection]:
    """A read-only connection of its own (not pooled: one command, one connection): with
    ``snapshot``, every query in one ``REPEATABLE READ`` transaction (one consistent snapshot, as
    the SQLite file's read transaction); else each query sees the latest commits."""
    psycopg = _psycopg()
    try:
        conn = psycopg.connect(url, autocommit=not snapshot, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise ConnectionError(f"cannot reach the event store {redact(url)}: {str(exc).strip()}") from None
    try:
        if snapshot:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
        yield QmarkConnection(conn)
    finally:
        conn.close()


def has_log(conn: QmarkConnection) -> bool:
    """Whether the database holds an event log (its ``events`` table)."""
    return bool(conn.execute("SELECT to_regclass('events') IS NOT NULL").fetchone()[0])


class PostgresEventStore:
    """The event log in a PostgreSQL database (see the module docstring).

    ``projectors``: the read models kept in the append transaction (PostgreSQL ones:
    :func:`batchgrader.store.pg_readmodels.projectors`)."""

    def __init__(
        self, url: str, readonly: bool = False, projectors: Sequence[Any] = (), pool_size: int = 4, open_timeout: float = 30.0
    ) -> None:
        _psycopg()  # a clear message when the [postgres] extra is missing
        from psycopg_pool import ConnectionPool

        self.url = url
        self.readonly = readonly
        self.projectors = list(projectors)
        self._listen: Any = None  # the LISTEN connection (psycopg.Connection), made at the first wait
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            open=False,
            check=ConnectionPool.check_connection,  # a connection killed meanwhile is replaced, never lent
            kwargs={"autocommit": False},
            name="batchgrader",
        )
        try:
            self.pool.open(wait=True, timeout=open_timeout)
        except Exception as exc:
            self.pool.close()
            raise ConnectionError(f"cannot reach the event store {redact(url)}: {exc}") from None
        try:
            self._setup()
        except BaseException:
            self.pool.close()
            raise

    def _setup(self) -> None:
        with self.pool.connection() as conn:
            exists = one(conn, "SELECT to_regclass('bg_meta') IS NOT NULL")
            found = conn.execute("SELECT value FROM bg_meta WHERE name = 'schema_version'").fetchone() if exists else None
            pg = conn.execute("SELECT value FROM bg_meta WHERE name = 'pg_schema'").fetchone() if exists else None
            if (found is not None and found[0] > SCHEMA_VERSION) or (pg is not None and pg[0] > PG_SCHEMA):
                raise SchemaTooNew(
                    f"{redact(self.url)} was written by a newer BatchGrader (database schema {found[0] if found else '?'}/"
                    f"{pg[0] if pg else 1}; this version knows schema {SCHEMA_VERSION}/{PG_SCHEMA}). Upgrade BatchGrader; "
                    "the database is left untouched."
                )
            if self.readonly:
                if not exists:
                    raise FileNotFoundError(f"no event log in {redact(self.url)} (has a daemon run with it yet?)")
                return
        with self.write() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('batchgrader schema'))")  # two daemons starting at once
            if one(conn, "SELECT to_regclass('events') IS NOT NULL"):
                # the lock every append takes first, before the read models' (their indexes' DDL below
                # locks them): taken in the other order, a daemon starting beside a working one deadlocks
                conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")
            for stmt in (*DDL, *answers_ddl(), *leases_ddl()):
                conn.execute(stmt)
            for p in self.projectors:
                p.setup(conn)
            bytewise_text(conn)
            for name, value in (("schema_version", SCHEMA_VERSION), ("pg_schema", PG_SCHEMA)):
                conn.execute(
                    "INSERT INTO bg_meta (name, value) VALUES (%s, %s) "
                    "ON CONFLICT (name) DO UPDATE SET value = GREATEST(bg_meta.value, EXCLUDED.value)",
                    (name, value),
                )

    # --- the store interface (batchgrader.store.backend.EventLog) ------------------------------
    def unavailable(self, exc: BaseException) -> bool:
        return isinstance(exc, _psycopg().OperationalError)

    def close(self) -> None:
        if self._listen is not None:
            self._listen.close()
            self._listen = None
        self.pool.close()

    def __enter__(self) -> PostgresEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_file(self) -> None:
        """Nothing to check: the log is not a file that can be replaced under us."""

    @property
    def where(self) -> str:
        return redact(self.url)

    @contextmanager
    def write(self) -> Iterator[psycopg.Connection]:
        """A write transaction (COMMIT, or ROLLBACK on error) on a pooled connection."""
        if self.readonly:
            raise PermissionError("this event store was opened read-only")
        with self.pool.connection() as conn:
            with conn.transaction():
                yield conn

    def append(
        self,
        job_id: str,
        events: Iterable[NewEvent],
        expected_version: int | None = None,
        also: Callable[[Any], None] | None = None,
    ) -> list[Event]:
        """Append events to one job atomically (see :meth:`EventStore.append`); the read models,
        ``also`` and one ``NOTIFY`` in the same transaction."""
        psycopg = _psycopg()
        events = list(events)
        if not events:
            return []
        for e in events:
            check_payload(e.type, e.payload)
        rows = [
            (e.type, EVENTS[e.type].version, json.dumps(e.payload, ensure_ascii=False, allow_nan=False, sort_keys=True))
            for e in events
        ]
        ts = utcnow_iso()
        first: int | None = None
        try:
            with self.write() as conn:
                conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")  # positions in commit order (reads go on)
                current = one(conn, "SELECT COALESCE(MAX(job_seq), 0) FROM events WHERE job_id = %s", (job_id,))
                if expected_version is not None and current != expected_version:
                    raise ConcurrencyError(f"job {job_id}: expected version {expected_version}, found {current}")
                base = current if expected_version is None else expected_version
                first = base + 1
                stored: list[Event] = []
                with conn.cursor() as cur:
                    try:  # one round trip for all the rows (pipeline mode), their positions in order
                        cur.executemany(
                            "INSERT INTO events (job_id, job_seq, type, version, ts, payload) "
                            "VALUES (%s, %s, %s, %s, %s, %s) RETURNING seq",
                            [(job_id, base + i, t, v, ts, p) for i, (t, v, p) in enumerate(rows, start=1)],
                            returning=True,
                        )
                        seqs = []
                        while True:
                            seqs.append(cur.fetchone()[0])  # type: ignore[index]
                            if not cur.nextset():
                                break
                    except psycopg.errors.UniqueViolation as exc:
                        raise ConcurrencyError(f"job {job_id}: job_seq {first}.. was appended by another writer") from exc
                for i, ((type_, version, payload), seq) in enumerate(zip(rows, seqs), start=1):
                    stored.append(Event(seq, job_id, base + i, type_, version, ts, json.loads(payload)))
                for p in self.projectors:
                    p.apply(conn, stored)
                if also is not None:
                    also(conn)
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(stored[-1].seq)))
            return stored
        except psycopg.OperationalError:
            if first is None:
                raise
            # the connection went while the transaction was open or committing: committed or not?
            found = self._committed(job_id, first, ts, rows)
            if found is None:
                raise
            return found

    def _committed(self, job_id: str, first: int, ts: str, rows: list[tuple[str, int, str]]) -> list[Event] | None:
        """The events of an append whose outcome is unknown, if it was committed (same job_seq,
        timestamp and payloads), else None."""
        try:
            got = list(self.read(job_id=job_id, after_job_seq=first - 1, limit=len(rows)))
        except Exception:  # noqa: BLE001 - still unreachable: report the original error
            return None
        mine = [(e.type, e.ts, e.job_seq) for e in got]
        if mine == [(t, ts, first + i) for i, (t, _, _) in enumerate(rows)]:
            return got
        return None

    def read(
        self, after: int = 0, job_id: str | None = None, limit: int | None = None, *, after_job_seq: int | None = None
    ) -> Iterator[Event]:
        """Events with ``seq > after`` (of one job), in order, upcast; read a page at a time,
        each page on a pooled connection."""
        left = limit
        last = after
        while left is None or left > 0:
            page = READ_BATCH if left is None else min(READ_BATCH, left)
            sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > %s"
            args: list[Any] = [last]
            if job_id is not None:
                sql += " AND job_id = %s"
                args.append(job_id)
            if after_job_seq is not None:
                sql += " AND job_seq > %s"
                args.append(after_job_seq)
            sql += " ORDER BY seq LIMIT %s"
            args.append(page)
            with self.pool.connection() as conn:
                rows = conn.execute(sql, args).fetchall()
                conn.rollback()
            if not rows:
                return
            yield from events_from_rows(rows)
            last = rows[-1][0]
            if left is not None:
                left -= len(rows)
            if len(rows) < page:
                return

    def last_seq(self) -> int:
        with self.pool.connection() as conn:
            n = one(conn, "SELECT COALESCE(MAX(seq), 0) FROM events")
            conn.rollback()
        return int(n)

    def read_model(self, table: str) -> list[dict[str, Any]]:
        """Every row of a read-side table (``job_status``, ``usage``, ...), as dicts, in key order."""
        from batchgrader.store.readtables import TABLES

        spec = TABLES[table]
        with self.pool.connection() as conn:
            cur = conn.execute(spec.select(table))
            out = [dict(zip(spec.columns, r)) for r in cur.fetchall()]
            conn.rollback()
        return out

    # --- what else the daemon keeps beside the log ---------------------------------------------
    @property
    def answers(self) -> Any:
        """The answers store in this database (:class:`batchgrader.store.answers.PgAnswers`)."""
        from batchgrader.store.answers import PgAnswers

        return PgAnswers(self)

    def learned_run_times(self, models: Iterable[tuple[str, bool]]) -> dict[tuple[str, bool], list[float]]:
        """The learned batch run times per ``(model, sandbox)``: the same query as the SQLite file's
        (:func:`batchgrader.store.runtimes.learned_run_times`) on the ``batch_runs`` read model."""
        from batchgrader.store.runtimes import learned_run_times

        with self.pool.connection() as conn:
            out = learned_run_times(QmarkConnection(conn), models)
            conn.rollback()
        return out

    # --- wake-ups ---------------------------------------------------------------------------
    def wait_for_append(self, after: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for an event past ``after``: True when one may have come
        (a notification, an event already there, or a reconnect after which the caller must
        re-read from its last position); False when the time ran out with nothing new."""
        psycopg = _psycopg()
        try:
            conn = self._listener()
        except psycopg.OperationalError:
            return True  # unreachable now: the caller re-reads (and fails there) or waits again
        if self.last_seq() > after:
            return True
        try:
            for _ in conn.notifies(timeout=timeout, stop_after=1):
                return True
        except psycopg.OperationalError:  # the listening connection went: listen again, re-read
            self._drop_listener()
            return True
        return False

    def _listener(self) -> Any:
        psycopg = _psycopg()
        if self._listen is not None and self._listen.closed:
            self._listen = None
        if self._listen is None:
            conn = psycopg.connect(self.url, autocommit=True)
            conn.execute(f"LISTEN {CHANNEL}")
            self._listen = conn
        return self._listen

    def _drop_listener(self) -> None:
        if self._listen is not None:
            try:
                self._listen.close()
            finally:
                self._listen = None

    def backend_pid(self) -> int:
        """The server process of the listening connection (tests kill it to test a reconnect)."""
        return self._listener().info.backend_pid

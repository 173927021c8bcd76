"""The answers store: answers the provider gave, addressed by their request key.

One table, ``answers``, in the same SQLite database as the event log.  A row is written only
inside the append transaction of the events that record the chunk it came from (see
``Engine._merge``: ``TokensUsed`` ... ``ChunkCompleted`` and the answers commit together), so
an answer is never stored for a chunk the log does not know as merged, nor lost for one it does.

* **Content-addressed.**  The primary key is the request key
  (:func:`batchgrader.pipeline.answerkey.request_key`).  The first answer stored for a key
  stays; a later one for the same key is ignored (``INSERT OR IGNORE``).
* **Append-only.**  A trigger refuses ``UPDATE``.  Rows are only ever removed as a whole:
  by retention (older than ``cache_days``), by ``bgctl cache clear``, and, when the daemon starts,
  the answers a sandbox job stored under a real provider's key in an older version
  (:func:`forget_simulated`).  Removing answers never
  touches the event log: the facts of what was asked, answered and paid stay there.
* **Behind the store.**  The daemon asks its store (``store.answers``: :class:`SqliteAnswers` on
  the home's file, :class:`PgAnswers` on a PostgreSQL store), never a connection: the same
  lookups, retention and "first answer stays" on both (``tests/test_store_contract.py``).
* **Not a read model.**  ``bgctl rebuild`` drops and recreates the read-side tables only; this
  table is left alone (its content is not derivable from the log, which records counts, not
  texts).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from batchgrader.pipeline.results import answer_problem
from batchgrader.pipeline.reuse import StoredAnswer

TABLE = "answers"

ANSWERS_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS answers (
        key               TEXT PRIMARY KEY,   -- sha256 of the canonical request (answerkey.py)
        provider          TEXT NOT NULL,
        model             TEXT NOT NULL,
        content           TEXT NOT NULL,      -- the answer's text, exactly as returned
        finish_reason     TEXT,
        prompt_tokens     INTEGER NOT NULL,   -- the original billed usage of this answer
        cached_tokens     INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        reasoning_tokens  INTEGER NOT NULL,
        job_id            TEXT NOT NULL,      -- where it was first answered
        custom_id         TEXT NOT NULL,
        batch_id          TEXT,
        ts                TEXT NOT NULL       -- UTC ISO-8601 when stored
    )""",
    "CREATE INDEX IF NOT EXISTS answers_ts ON answers (ts)",
    """CREATE TRIGGER IF NOT EXISTS answers_no_update BEFORE UPDATE ON answers
    BEGIN SELECT RAISE(ABORT, 'stored answers are immutable'); END""",
)

# The same table in a PostgreSQL store (created with its other tables; text compared byte by
# byte, as SQLite compares it, so the retention's ISO-time cut-off is the same)
PG_ANSWERS_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS answers (
        key               TEXT COLLATE "C" PRIMARY KEY,
        provider          TEXT COLLATE "C" NOT NULL,
        model             TEXT COLLATE "C" NOT NULL,
        content           TEXT COLLATE "C" NOT NULL,
        finish_reason     TEXT COLLATE "C",
        prompt_tokens     BIGINT NOT NULL,
        cached_tokens     BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL,
        reasoning_tokens  BIGINT NOT NULL,
        job_id            TEXT COLLATE "C" NOT NULL,
        custom_id         TEXT COLLATE "C" NOT NULL,
        batch_id          TEXT COLLATE "C",
        ts                TEXT COLLATE "C" NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS answers_ts ON answers (ts)",
    """CREATE OR REPLACE FUNCTION bg_answers_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'stored answers are immutable'; END $$""",
    """DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'answers_no_update') THEN
            CREATE TRIGGER answers_no_update BEFORE UPDATE ON answers FOR EACH ROW EXECUTE FUNCTION bg_answers_immutable();
        END IF;
    END $$""",
)

COLUMNS = (
    "key",
    "provider",
    "model",
    "content",
    "finish_reason",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "job_id",
    "custom_id",
    "batch_id",
    "ts",
)
_INSERT = f"INSERT OR IGNORE INTO answers ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
LOOKUP_BATCH = 500  # keys per SELECT ... IN (...)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")


def cutoff(now: float, days: float) -> str:
    """The oldest ``ts`` still inside a retention of ``days`` at ``now``."""
    return (datetime.fromtimestamp(now, UTC) - timedelta(days=days)).isoformat(timespec="microseconds")


def ensure(conn: sqlite3.Connection) -> None:
    """Create the table if needed (inside the caller's write transaction, or on its own)."""
    for stmt in ANSWERS_DDL:
        conn.execute(stmt)


def exists(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone() is not None


def put(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]], *, now: float, keep_days: float | None = None) -> int:
    """Store answers (inside the caller's transaction).  Each row has the :data:`COLUMNS` but
    ``ts``.  Answers older than ``keep_days`` are dropped first, so an expired answer never
    blocks a fresh one for the same key.  Returns the number of rows given."""
    ensure(conn)
    if keep_days is not None:
        conn.execute("DELETE FROM answers WHERE ts < ?", (cutoff(now, keep_days),))
    ts = iso(now)
    n = 0

    def data() -> Iterator[tuple[Any, ...]]:  # one row at a time: a chunk's answers are never all held
        nonlocal n
        for r in rows:
            n += 1
            yield tuple(r.get(c) if c != "ts" else ts for c in COLUMNS)

    conn.executemany(_INSERT, data())
    return n


def lookup(
    conn: sqlite3.Connection, keys: Sequence[str], *, now: float, keep_days: float, allow_truncated: bool = False
) -> dict[str, StoredAnswer]:
    """The usable stored answer of each key that has one: stored within ``keep_days`` of ``now``,
    and a complete answer: one whose finish reason says it is not (``length``, ``content_filter``,
    an unknown reason: stored before such rows failed) is never reused.  ``allow_truncated``
    (the ``reuse_truncated_answers`` key) is accepted and has no effect: a truncated answer is a
    failed row (``truncated``), and reusing one would turn that failure into a success."""
    if not keys or keep_days <= 0:
        return {}
    try:
        if not exists(conn):
            return {}
    except sqlite3.OperationalError:
        return {}
    since = cutoff(now, keep_days)
    out: dict[str, StoredAnswer] = {}
    unique = list(dict.fromkeys(keys))
    for i in range(0, len(unique), LOOKUP_BATCH):
        part = unique[i : i + LOOKUP_BATCH]
        rows = conn.execute(
            "SELECT key, content, finish_reason, prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens,"
            f" job_id, custom_id, ts FROM answers WHERE key IN ({','.join('?' * len(part))}) AND ts >= ?",
            (*part, since),
        ).fetchall()
        for r in rows:
            if answer_problem(r[2], None) is not None:
                continue
            out[r[0]] = StoredAnswer(*r)
    return out


def stats(conn: sqlite3.Connection) -> dict[str, Any]:
    """Rows, bytes of answer text, oldest and newest, per model (for `bgctl cache stats` and doctor)."""
    if not exists(conn):
        return stats_of_nothing()
    n, size, oldest, newest = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(content AS BLOB))), 0), MIN(ts), MAX(ts) FROM answers"
    ).fetchone()
    by_model = [
        {"provider": p, "model": m, "answers": c}
        for p, m, c in conn.execute(
            "SELECT provider, model, COUNT(*) FROM answers GROUP BY provider, model ORDER BY COUNT(*) DESC, model"
        )
    ]
    return {"answers": n, "content_bytes": size, "oldest": oldest, "newest": newest, "by_model": by_model}


def clear(conn: sqlite3.Connection, *, now: float, older_than_days: float | None = None) -> int:
    """Remove stored answers (all, or those stored more than ``older_than_days`` ago), in one
    write transaction of its own.  The event log is not touched.  Returns the rows removed."""
    if not exists(conn):
        return 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        if older_than_days is None:
            cur = conn.execute("DELETE FROM answers")
        else:
            cur = conn.execute("DELETE FROM answers WHERE ts < ?", (cutoff(now, older_than_days),))
        removed = cur.rowcount
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return removed


def forget_simulated(conn: sqlite3.Connection, sandbox_jobs: Iterable[str]) -> int:
    """Remove the answers sandbox jobs stored under a real provider's key (inside the caller's
    transaction): before ``JobAccepted`` fixed who answers a job, a sandbox job finished by a
    normal daemon stored the emulator's text as a real answer.  Simulated text never answers a
    real job.  Returns the rows removed."""
    jobs = list(sandbox_jobs)
    removed = 0
    for i in range(0, len(jobs), LOOKUP_BATCH):
        part = jobs[i : i + LOOKUP_BATCH]
        cur = conn.execute(
            f"DELETE FROM answers WHERE provider NOT LIKE 'sandbox%' AND job_id IN ({', '.join('?' * len(part))})", part
        )
        removed += cur.rowcount
    return removed


_SELECT = (
    "SELECT key, content, finish_reason, prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens,"
    " job_id, custom_id, ts FROM answers"
)


def _usable(rows: Iterable[Sequence[Any]], out: dict[str, StoredAnswer]) -> None:
    for r in rows:
        if answer_problem(r[2], None) is None:
            out[r[0]] = StoredAnswer(*r)


class SqliteAnswers:
    """The answers store of an SQLite event store (``store.answers``): the module's functions on
    its connection, exactly as the daemon called them on ``store.conn``."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def forget_simulated(self, sandbox_jobs: Iterable[str]) -> int:
        """Create the table if needed and remove what sandbox jobs stored under a real provider's
        key (:func:`forget_simulated`), in one write transaction."""
        with self.store.write() as conn:
            ensure(conn)
            return forget_simulated(conn, sandbox_jobs)

    def put(self, conn: Any, rows: Iterable[dict[str, Any]], *, now: float, keep_days: float | None = None) -> int:
        """:func:`put` inside an append's transaction (``conn``: what ``append(also=...)`` passes)."""
        return put(conn, rows, now=now, keep_days=keep_days)

    def lookup(
        self, keys: Sequence[str], *, now: float, keep_days: float, allow_truncated: bool = False
    ) -> dict[str, StoredAnswer]:
        return lookup(self.store.conn, keys, now=now, keep_days=keep_days, allow_truncated=allow_truncated)

    def stats(self) -> dict[str, Any]:
        return stats(self.store.conn)

    def empty(self) -> bool:
        """Whether no answer is stored (then no row of a new file can be answered from the store)."""
        return not exists(self.store.conn) or self.store.conn.execute(f"SELECT 1 FROM {TABLE} LIMIT 1").fetchone() is None

    def clear(self, *, now: float, older_than_days: float | None = None) -> int:
        return clear(self.store.conn, now=now, older_than_days=older_than_days)


class PgAnswers:
    """The answers store of a PostgreSQL event store (``store.answers``): the same rows and rules
    as :class:`SqliteAnswers` (``ON CONFLICT DO NOTHING`` for ``INSERT OR IGNORE``); the table is
    made with the store's others (:data:`PG_ANSWERS_DDL`)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def forget_simulated(self, sandbox_jobs: Iterable[str]) -> int:
        jobs = list(sandbox_jobs)
        if not jobs:
            return 0
        with self.store.write() as conn:
            cur = conn.execute("DELETE FROM answers WHERE provider NOT LIKE 'sandbox%%' AND job_id = ANY(%s)", (jobs,))
            return int(cur.rowcount)

    def put(self, conn: Any, rows: Iterable[dict[str, Any]], *, now: float, keep_days: float | None = None) -> int:
        if keep_days is not None:
            conn.execute("DELETE FROM answers WHERE ts < %s", (cutoff(now, keep_days),))
        ts = iso(now)
        values = [tuple(r.get(c) if c != "ts" else ts for c in COLUMNS) for r in rows]
        if values:
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO answers ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))}) "
                    "ON CONFLICT (key) DO NOTHING",
                    values,
                )
        return len(values)

    def lookup(
        self, keys: Sequence[str], *, now: float, keep_days: float, allow_truncated: bool = False
    ) -> dict[str, StoredAnswer]:
        if not keys or keep_days <= 0:
            return {}
        out: dict[str, StoredAnswer] = {}
        unique = list(dict.fromkeys(keys))
        with self.store.pool.connection() as conn:
            for i in range(0, len(unique), LOOKUP_BATCH):
                part = unique[i : i + LOOKUP_BATCH]
                _usable(conn.execute(_SELECT + " WHERE key = ANY(%s) AND ts >= %s", (part, cutoff(now, keep_days))), out)
            conn.rollback()
        return out

    def empty(self) -> bool:
        """Whether no answer is stored (then no row of a new file can be answered from the store)."""
        with self.store.pool.connection() as conn:
            row = conn.execute("SELECT 1 FROM answers LIMIT 1").fetchone()
            conn.rollback()
        return row is None

    def stats(self) -> dict[str, Any]:
        with self.store.pool.connection() as conn:
            n, size, oldest, newest = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(octet_length(content)), 0)::bigint, MIN(ts), MAX(ts) FROM answers"
            ).fetchone()
            by_model = [
                {"provider": p, "model": m, "answers": c}
                for p, m, c in conn.execute(
                    "SELECT provider, model, COUNT(*) FROM answers GROUP BY provider, model ORDER BY COUNT(*) DESC, model"
                )
            ]
            conn.rollback()
        return {"answers": n, "content_bytes": size, "oldest": oldest, "newest": newest, "by_model": by_model}

    def clear(self, *, now: float, older_than_days: float | None = None) -> int:
        with self.store.write() as conn:
            if older_than_days is None:
                cur = conn.execute("DELETE FROM answers")
            else:
                cur = conn.execute("DELETE FROM answers WHERE ts < %s", (cutoff(now, older_than_days),))
            return int(cur.rowcount)


def open_readonly(db: Path) -> sqlite3.Connection | None:
    """A read-only connection to the database, or None when there is none yet."""
    if not Path(db).exists():
        return None
    from batchgrader.store.eventstore import connect

    return connect(Path(db), readonly=True)


def count_preview(
    home: Any,
    file: Path,
    profile: Any,
    prices: Any,
    *,
    sandbox: bool,
    schema_overhead: float | None = None,
    count_exact: Any = None,
) -> dict[str, Any]:
    """`bgctl count`: :func:`batchgrader.pipeline.reuse.preview` against this home's stored answers
    (read-only; no database yet means no stored answer), keyed under
    :func:`~batchgrader.pipeline.answerkey.provider_id_of` of ``profile``, as the daemon keys
    them.  ``count_exact``: the counting hook."""
    import time

    from batchgrader.pipeline.answerkey import provider_id_of
    from batchgrader.pipeline.reuse import preview

    url = _store_url(home)
    now = time.time()
    with ExitStack() as stack:
        store = stack.enter_context(_pg_store(url, readonly=True)) if url else None
        conn = open_readonly(home.db) if not url else None
        if conn is not None:
            stack.callback(conn.close)

        def lookup_keys(keys: Sequence[str]) -> dict[str, StoredAnswer]:
            if store is not None:
                return store.answers.lookup(
                    keys, now=now, keep_days=profile.cache_days, allow_truncated=profile.reuse_truncated_answers
                )
            if conn is None:
                return {}
            return lookup(conn, keys, now=now, keep_days=profile.cache_days, allow_truncated=profile.reuse_truncated_answers)

        return preview(
            file,
            profile,
            home,
            prices=prices,
            provider=provider_id_of(profile, sandbox),
            lookup=lookup_keys,
            schema_overhead=schema_overhead,
            count_exact=count_exact,
        )


def home_stats(home: Any) -> dict[str, Any]:
    """`bgctl cache stats`: :func:`stats` of the home's database (its ``store_url``'s when set), read-only."""
    url = _store_url(home)
    if url:
        with _pg_store(url, readonly=True) as store:
            return stats_of_nothing() if store is None else store.answers.stats()
    conn = open_readonly(home.db)
    if conn is None:
        return stats_of_nothing()
    try:
        return stats(conn)
    finally:
        conn.close()


def _store_url(home: Any) -> str | None:
    from batchgrader.core.host.home import Home
    from batchgrader.store.backend import configured_store_url

    return configured_store_url(home) if isinstance(home, Home) else None


@contextmanager
def _pg_store(url: str, readonly: bool) -> Iterator[Any]:
    """The PostgreSQL store of ``store_url`` (without read models: only answers are read or
    removed), or None when it holds no log yet."""
    from batchgrader.store.backend import open_log

    try:
        store = open_log(url, readonly=readonly, read_models=False)
    except FileNotFoundError:
        yield None
        return
    try:
        yield store
    finally:
        store.close()


def stats_of_nothing() -> dict[str, Any]:
    return {"answers": 0, "content_bytes": 0, "oldest": None, "newest": None, "by_model": []}


def home_clear(home: Any, *, older_than_days: float | None = None, now: float | None = None) -> int:
    """`bgctl cache clear`: :func:`clear` on the home's database (a short write transaction of
    its own, alongside a running daemon; only the ``answers`` table is written); on its
    ``store_url``'s when set."""
    import time

    from batchgrader.store.eventstore import connect

    when = time.time() if now is None else now
    url = _store_url(home)
    if url:
        with _pg_store(url, readonly=False) as store:
            return 0 if store is None else store.answers.clear(now=when, older_than_days=older_than_days)
    conn = connect(Path(home.db))
    try:
        return clear(conn, now=when, older_than_days=older_than_days)
    finally:
        conn.close()

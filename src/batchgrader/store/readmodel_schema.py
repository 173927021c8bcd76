"""The schema of the read-side tables: their columns and the migrations that create and change them.

The columns are :mod:`batchgrader.store.readmodels`' rows (each dict's order is the INSERT order)
and the migrations create exactly these.  The migrations are SQL statements recorded in
``_sqlite_migrations`` under the set ``batchgrader.readmodels``, as sqlite-utils ``Migrations``
records them (the read side was made with it before; see below); they never touch the ``events``
table.
"""

from __future__ import annotations

import sqlite3

from batchgrader.store.readside import MIGRATION_NAMES, MIGRATION_SET, MIGRATIONS_TABLE, READ_TABLES
from batchgrader.store.runtimes import BATCH_RUN_COLUMNS

# Column -> SQLite type.  The order is the INSERT order; migrations create exactly these.
JOB_STATUS_COLUMNS: dict[str, type] = {
    "job_id": str,
    "file": str,
    "profile": str,
    "model": str,
    "state": str,
    "sandbox": int,  # 1: results are SIMULATED by the emulator
    "rows": int,
    "requests": int,
    "chunks_total": int,
    "chunks_done": int,
    "input_tokens": int,  # exact prompt tokens estimated at preparation (planned chunks)
    "prompt_tokens": int,  # billed
    "cached_tokens": int,  # billed, part of prompt_tokens
    "output_tokens": int,  # billed completion tokens (reasoning included)
    "reasoning_tokens": int,
    "cost_usd": float,  # billed
    "estimate_usd": float,  # max_total estimate at preparation (None before)
    "succeeded": int,
    "failed": int,
    "error_code": str,
    "error": str,
    "error_stage": str,
    "error_hint": str,
    "last_error": str,
    "held_code": str,
    "held_reason": str,
    "cancel_requested": int,
    "result_path": str,
    "error_path": str,
    "archived_path": str,
    "created_ts": str,
    "updated_ts": str,
    "version": int,  # job_seq of the last event of the job
    "cached_rows": int,  # rows answered without a request of their own (stored answers + duplicates in the file)
    "duplicate_rows": int,  # of which copied from an identical row of the same file
    "saved_usd": float,  # what those rows' answers cost when they were paid for
    "input_tokens_exact": int,  # 1: input_tokens are exact (tiktoken or the provider's counts); 0: estimates
    "cache_write_tokens": int,  # billed, part of prompt_tokens: prompt-cache writes
    "cache_saved_usd": float,  # what prompt caching saved (TokensUsed.cache_saved_usd)
    "route": str,  # JSON route_summary of a job on a flex/online route; NULL: batch (or before migration 0008)
    "chunks": str,  # JSON list of {chunk, status, batch_id, request_counts}, see chunk_row(); stays last
}

USAGE_COLUMNS: dict[str, type] = {
    "seq": int,  # the TokensUsed event
    "job_id": str,
    "chunk": int,
    "batch_id": str,
    "model": str,
    "day": str,  # UTC day YYYY-MM-DD
    "ts": str,
    "prompt_tokens": int,
    "cached_tokens": int,
    "completion_tokens": int,
    "reasoning_tokens": int,
    "cost_usd": float,
    "sandbox": int,  # 1: SIMULATED (sandbox job), not real spend
    "cache_write_tokens": int,  # of prompt_tokens: prompt-cache writes (NULL: before migration 0007)
    "cache_saved_usd": float,  # what prompt caching saved (NULL: before migration 0007)
    "route": str,  # batch, preflight, flex or online (NULL: before migration 0008; see usage_route)
}

QUEUE_LIMIT_COLUMNS: dict[str, type] = {
    "base_url": str,  # provider base URL ('sandbox' for the sandbox emulator)
    "model": str,
    "limit_tokens": int,  # prompt tokens that may be in flight for the model
    "exact": int,  # 1: the provider stated the figure
    "source": str,  # message, halved or probe
    "ts": str,  # when it was learned
}
# One row per RequestsReused / DuplicatesAnswered event: money not spent because an answer was reused.
SAVINGS_COLUMNS: dict[str, type] = {
    "seq": int,
    "job_id": str,
    "model": str,
    "day": str,  # UTC day of the event
    "ts": str,
    "rows": int,
    "saved_usd": float,
    "sandbox": int,
}


# --- migrations (read side only) ----------------------------------------------------------------
#
# Each migration is a list of SQL statements run by :func:`_apply`, recorded in ``_sqlite_migrations``
# as sqlite-utils ``Migrations`` records them (the table and its rows are the same: a home migrated
# by an earlier version is current here, and the other way round).  sqlite-utils itself is not used:
# it imports pandas and numpy when it is imported (about 80 MiB resident), which a daemon on a new
# home would then carry to its end.  The statements are written as sqlite-utils writes them, so the
# schema (``sqlite_master``) is the same text.

_SQL_TYPES = {str: "TEXT", int: "INTEGER", float: "REAL"}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _create_table(table: str, columns: dict[str, type], pk: str | tuple[str, ...], if_not_exists: bool = False) -> str:
    lines = [f"   {_q(c)} {_SQL_TYPES[t]}" + (" PRIMARY KEY" if c == pk else "") for c, t in columns.items()]
    if isinstance(pk, tuple):
        lines.append(f"   PRIMARY KEY ({', '.join(map(_q, pk))})")
    body = ",\n".join(lines)
    return f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{_q(table)} (\n{body}\n);"


def _create_index(table: str, columns: list[str], unique: bool = False, if_not_exists: bool = False) -> str:
    name = "_".join(["idx", table, *columns])
    kind = "UNIQUE INDEX" if unique else "INDEX"
    exists = "IF NOT EXISTS " if if_not_exists else ""
    return f"CREATE {kind} {exists}{_q(name)}\n    ON {_q(table)} ({', '.join(map(_q, columns))});"


def _add_columns(conn: sqlite3.Connection, table: str, columns: dict[str, type], names: tuple[str, ...]) -> list[str]:
    """``ALTER TABLE ... ADD COLUMN`` for each of ``names`` the table lacks (a table created after
    the column was declared has it already)."""
    have = {r[1] for r in conn.execute(f"PRAGMA table_info({_q(table)})")}
    return [f"ALTER TABLE {_q(table)} ADD COLUMN {_q(c)} {_SQL_TYPES[columns[c]]};" for c in names if c not in have]


def _m0001(conn: sqlite3.Connection) -> list[str]:
    return [
        _create_table("job_status", JOB_STATUS_COLUMNS, "job_id"),
        _create_index("job_status", ["created_ts"]),
        _create_table("usage", USAGE_COLUMNS, "seq"),
        _create_index("usage", ["day"]),
        _create_index("usage", ["job_id"]),
        _create_table("projection_state", {"name": str, "last_seq": int}, "name"),
    ]


def _m0002(conn: sqlite3.Connection) -> list[str]:  # for the status overview: newest jobs per state
    return [_create_index("job_status", ["state", "created_ts"])]


def _m0003(conn: sqlite3.Connection) -> list[str]:  # the provider queue limits learned (QueueLimitLearned)
    return [_create_table("queue_limits", QUEUE_LIMIT_COLUMNS, ("base_url", "model"))]


def _m0004(conn: sqlite3.Connection) -> list[str]:  # answers reused instead of sent (issue 14)
    return [
        *_add_columns(conn, "job_status", JOB_STATUS_COLUMNS, ("cached_rows", "duplicate_rows", "saved_usd")),
        _create_table("savings", SAVINGS_COLUMNS, "seq", if_not_exists=True),
        _create_index("savings", ["day"], if_not_exists=True),
    ]


def _m0005(conn: sqlite3.Connection) -> list[str]:  # exact or estimated input tokens (InputTokensCounted)
    return _add_columns(conn, "job_status", JOB_STATUS_COLUMNS, ("input_tokens_exact",))


def _m0006(conn: sqlite3.Connection) -> list[str]:  # batch run times, for the ETA of running jobs (issue 27)
    return [
        _create_table("batch_runs", BATCH_RUN_COLUMNS, "batch_id", if_not_exists=True),
        _create_index("batch_runs", ["model", "ts"], if_not_exists=True),
    ]


def _m0007(conn: sqlite3.Connection) -> list[str]:  # prompt-cache writes and what caching saved (issue 26)
    names = ("cache_write_tokens", "cache_saved_usd")
    return [*_add_columns(conn, "job_status", JOB_STATUS_COLUMNS, names), *_add_columns(conn, "usage", USAGE_COLUMNS, names)]


def _m0008(conn: sqlite3.Connection) -> list[str]:  # the route a usage row paid for (issue 26: flex and online)
    return [
        *_add_columns(conn, "usage", USAGE_COLUMNS, ("route",)),
        *_add_columns(conn, "job_status", JOB_STATUS_COLUMNS, ("route",)),
    ]


MIGRATIONS = (_m0001, _m0002, _m0003, _m0004, _m0005, _m0006, _m0007, _m0008)  # in the order of MIGRATION_NAMES

_MIGRATIONS_TABLE_SQL = (
    _create_table(MIGRATIONS_TABLE, {"id": int, "migration_set": str, "name": str, "applied_at": str}, "id"),
    _create_index(MIGRATIONS_TABLE, ["migration_set", "name"], unique=True),
)


def _apply(conn: sqlite3.Connection) -> None:
    """Run the pending migrations in order, each with its record in one savepoint (a failure
    leaves neither)."""
    import datetime

    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MIGRATIONS_TABLE,)).fetchone() is None:
        for sql in _MIGRATIONS_TABLE_SQL:
            conn.execute(sql)
    sql = f"SELECT name FROM {_q(MIGRATIONS_TABLE)} WHERE migration_set = ?"
    applied = {r[0] for r in conn.execute(sql, (MIGRATION_SET,))}
    for name, migration in zip(MIGRATION_NAMES, MIGRATIONS, strict=True):
        if name in applied:
            continue
        conn.execute("SAVEPOINT readmodel_migration")
        try:
            for statement in migration(conn):
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO {_q(MIGRATIONS_TABLE)} (applied_at, migration_set, name) VALUES (?, ?, ?)",
                (str(datetime.datetime.now(datetime.UTC)), MIGRATION_SET, name),
            )
        except BaseException:
            conn.execute("ROLLBACK TO readmodel_migration")
            conn.execute("RELEASE readmodel_migration")
            raise
        conn.execute("RELEASE readmodel_migration")


def migrate(conn: sqlite3.Connection) -> None:
    """Create or upgrade the read-side tables (inside the caller's transaction: savepoints).

    If some read-side table is missing although its migration is recorded (dropped by hand), the
    read side is dropped and created again; the projector then refills it from the log.
    """
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if MIGRATIONS_TABLE in names and any(t not in names for t in READ_TABLES):
        for t in READ_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {t}")
        conn.execute(f"DELETE FROM {MIGRATIONS_TABLE} WHERE migration_set = ?", (MIGRATION_SET,))
    elif MIGRATIONS_TABLE in names:
        sql = f"SELECT name FROM {MIGRATIONS_TABLE} WHERE migration_set = ?"
        if {r[0] for r in conn.execute(sql, (MIGRATION_SET,))}.issuperset(MIGRATION_NAMES):
            return  # nothing pending
    _apply(conn)

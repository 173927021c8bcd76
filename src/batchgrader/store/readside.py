"""Whether the read-side tables can answer for the current log: a cheap check with no fold.

Kept apart from :mod:`batchgrader.readmodels` so that `bgctl status` can ask it without importing
the fold and the projector (start-up time counts for a command a person types).
"""

from __future__ import annotations

import sqlite3
from typing import Any

PROJECTION = "status"
MIGRATION_SET = "batchgrader.readmodels"
MIGRATIONS_TABLE = "_sqlite_migrations"
READ_TABLES = ("job_status", "usage", "projection_state", "queue_limits", "savings", "batch_runs")
MIGRATION_NAMES = (
    "0001_job_status_usage",
    "0002_job_status_state_index",
    "0003_queue_limits",
    "0004_reuse",
    "0005_input_tokens_exact",
    "0006_batch_runs",
    "0007_prompt_cache",
    "0008_routes",
)


def log_last_seq(conn: sqlite3.Connection) -> int:
    (n,) = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
    return n


def projection_last_seq(conn: sqlite3.Connection) -> int | None:
    """``projection_state.last_seq`` of the status projection, None when there is none."""
    try:
        row = conn.execute("SELECT last_seq FROM projection_state WHERE name = ?", (PROJECTION,)).fetchone()
    except sqlite3.OperationalError:  # no such table
        return None
    return None if row is None else row[0]


def read_model_problem(conn: sqlite3.Connection, log_last: int | None = None) -> str | None:
    """Why the read-side tables cannot answer for the current log, or None when they can."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    missing = [t for t in READ_TABLES if t not in names]
    if missing:
        return f"the read-model tables are missing ({', '.join(missing)})"
    applied = set()
    if MIGRATIONS_TABLE in names:
        applied = {r[0] for r in conn.execute(f"SELECT name FROM {MIGRATIONS_TABLE} WHERE migration_set = ?", (MIGRATION_SET,))}
    if not set(MIGRATION_NAMES) <= applied:
        return "the read-model tables are from an older version (the daemon migrates them when it starts)"
    last = projection_last_seq(conn)
    log_last = log_last_seq(conn) if log_last is None else log_last
    if last is None:
        return "the read model has not been built"
    if last < log_last:
        return f"the read model is {log_last - last} event(s) behind the log"
    if last > log_last:
        return f"the read model (seq {last}) is ahead of the log (seq {log_last})"
    return None


def pg_read_model_problem(conn: Any) -> str | None:
    """:func:`read_model_problem` of a PostgreSQL store (``conn``: a
    :class:`~batchgrader.store.pgstore.QmarkConnection`): its tables are made with the store, so
    only how far the projection is from the log counts."""
    (present,) = conn.execute("SELECT to_regclass('projection_state') IS NOT NULL").fetchone()
    if not present:
        return "the read-model tables are missing (a daemon or `bgctl store copy` creates them)"
    row = conn.execute("SELECT last_seq FROM projection_state WHERE name = ?", (PROJECTION,)).fetchone()
    log_last = log_last_seq(conn)
    if row is None:
        return None if log_last == 0 else "the read model has not been built"
    if row[0] < log_last:
        return f"the read model is {log_last - row[0]} event(s) behind the log"
    if row[0] > log_last:
        return f"the read model (seq {row[0]}) is ahead of the log (seq {log_last})"
    return None

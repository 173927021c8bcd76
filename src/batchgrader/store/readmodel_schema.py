"""The schema of the read-side tables: their columns and the migrations that create and change them.

The columns are :mod:`batchgrader.store.readmodels`' rows (each dict's order is the INSERT order)
and the migrations create exactly these.  The migrations are sqlite-utils ``Migrations``,
recorded in ``_sqlite_migrations`` under the set ``batchgrader.readmodels``; they never touch the
``events`` table.
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


def _migrations():  # noqa: ANN202 - sqlite_utils is imported lazily: only when a migration is pending
    from sqlite_utils.migrations import Migrations

    m = Migrations(MIGRATION_SET)

    @m(name="0001_job_status_usage")
    def _m0001(db) -> None:  # noqa: ANN001
        db["job_status"].create(dict(JOB_STATUS_COLUMNS), pk="job_id")
        db["job_status"].create_index(["created_ts"])
        db["usage"].create(dict(USAGE_COLUMNS), pk="seq")
        db["usage"].create_index(["day"])
        db["usage"].create_index(["job_id"])
        db["projection_state"].create({"name": str, "last_seq": int}, pk="name")

    @m(name="0002_job_status_state_index")
    def _m0002(db) -> None:  # noqa: ANN001 - for the status overview: newest jobs per state
        db["job_status"].create_index(["state", "created_ts"])

    @m(name="0003_queue_limits")
    def _m0003(db) -> None:  # noqa: ANN001 - the provider queue limits learned (QueueLimitLearned)
        db["queue_limits"].create(dict(QUEUE_LIMIT_COLUMNS), pk=("base_url", "model"))

    @m(name="0004_reuse")
    def _m0004(db) -> None:  # noqa: ANN001 - answers reused instead of sent (issue 14)
        for col in ("cached_rows", "duplicate_rows", "saved_usd"):
            if col not in db["job_status"].columns_dict:
                db["job_status"].add_column(col, JOB_STATUS_COLUMNS[col])
        db["savings"].create(dict(SAVINGS_COLUMNS), pk="seq", if_not_exists=True)
        db["savings"].create_index(["day"], if_not_exists=True)

    @m(name="0005_input_tokens_exact")
    def _m0005(db) -> None:  # noqa: ANN001 - exact or estimated input tokens (InputTokensCounted)
        if "input_tokens_exact" not in db["job_status"].columns_dict:
            db["job_status"].add_column("input_tokens_exact", int)

    @m(name="0006_batch_runs")
    def _m0006(db) -> None:  # noqa: ANN001 - batch run times, for the ETA of running jobs (issue 27)
        db["batch_runs"].create(dict(BATCH_RUN_COLUMNS), pk="batch_id", if_not_exists=True)
        db["batch_runs"].create_index(["model", "ts"], if_not_exists=True)

    @m(name="0007_prompt_cache")
    def _m0007(db) -> None:  # noqa: ANN001 - prompt-cache writes and what caching saved (issue 26)
        for table, columns in (("job_status", JOB_STATUS_COLUMNS), ("usage", USAGE_COLUMNS)):
            for col in ("cache_write_tokens", "cache_saved_usd"):
                if col not in db[table].columns_dict:
                    db[table].add_column(col, columns[col])

    @m(name="0008_routes")
    def _m0008(db) -> None:  # noqa: ANN001 - the route a usage row paid for (issue 26: flex and online)
        for table in ("usage", "job_status"):
            if "route" not in db[table].columns_dict:
                db[table].add_column("route", str)

    return m


def _database(conn: sqlite3.Connection):  # noqa: ANN202
    from sqlite_utils import Database

    # The store owns the connection and its settings: no plugins, no PRAGMA changes.
    return Database(conn, recursive_triggers=False, execute_plugins=False)


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
            return  # nothing pending: sqlite_utils is not loaded
    _migrations().apply(_database(conn))

"""What is read straight from the event log rather than the read models: ``bgctl events`` (a
job's or every job's events, and following them as they are appended) and the newest schema
overhead a model was seen to bill (``bgctl count``'s calibration).  Read as
:mod:`batchgrader.store.queries` reads: a read-only connection, one short read each, on the
home's SQLite file or its PostgreSQL store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from batchgrader.store.eventstore import EVENT_COLUMNS, connect
from batchgrader.store.queries import HomeLike, db_path, event_rows, log_exists, pg_reading, reading, resolve_job, store_url


def _events_sql(job_id: str | None, after: int, limit: int | None, last: int | None) -> tuple[str, tuple]:
    where = "seq > ?" + (" AND job_id = ?" if job_id is not None else "")
    args: tuple = (after,) + ((job_id,) if job_id is not None else ())
    cols = EVENT_COLUMNS
    if last is not None:
        return (
            f"SELECT * FROM (SELECT {cols} FROM events WHERE {where} ORDER BY seq DESC LIMIT ?) AS recent ORDER BY seq",
            args + (last,),
        )
    if limit is not None:
        return f"SELECT {cols} FROM events WHERE {where} ORDER BY seq LIMIT ?", args + (limit,)
    return f"SELECT {cols} FROM events WHERE {where} ORDER BY seq", args


def events(
    home: HomeLike, job_id: str | None = None, after: int = 0, limit: int | None = None, last: int | None = None
) -> list[dict[str, Any]]:
    """Events with ``seq > after`` in order (of one job if ``job_id``; a unique prefix works):
    the first ``limit`` of them, or the most recent ``last`` of them.  Each is
    ``{seq, job_id, job_seq, type, version, ts, payload}`` with the payload upcast."""
    with reading(home) as conn:
        jid = resolve_job(conn, job_id) if job_id is not None else None
        sql, args = _events_sql(jid, after, limit, last)
        return event_rows(conn, sql, args)


def follow_events(
    home: HomeLike, job_id: str | None = None, poll: float = 1.0, after: int = 0, stop: Callable[[], bool] | None = None
) -> Iterator[dict[str, Any]]:
    """Yield events as they are appended (``bgctl events --follow``): first those after ``after``,
    then new ones, checking every ``poll`` seconds, until ``stop()`` is true (or forever).

    Each check is one short read on a read-only connection: no long-lived read transaction that
    would keep the daemon's WAL from being checkpointed (on PostgreSQL, each check is a query of
    its own on one connection).
    """
    url = store_url(home)
    if url:
        with pg_reading(url, snapshot=False) as pg:
            yield from _follow(pg, job_id, poll, after, stop)
        return
    conn = connect(db_path(home), readonly=True)
    try:
        yield from _follow(conn, job_id, poll, after, stop)
    finally:
        conn.close()


def _follow(conn: Any, job_id: str | None, poll: float, after: int, stop: Callable[[], bool] | None) -> Iterator[dict[str, Any]]:
    jid = resolve_job(conn, job_id) if job_id is not None else None
    last = after
    while True:
        sql, args = _events_sql(jid, last, 1000, None)
        batch = event_rows(conn, sql, args)
        for e in batch:
            last = e["seq"]
            yield e
        if len(batch) == 1000:
            continue
        if stop is not None and stop():
            return
        time.sleep(poll)


# --- schema overhead ---------------------------------------------------------------------------


def learned_schema_overhead(home: HomeLike, model: str, schema_sha256: str | None, provider: str) -> dict[str, Any] | None:
    """The newest ``SchemaOverheadLearned`` payload for this model and schema at ``provider`` (a
    provider id, :func:`~batchgrader.pipeline.answerkey.provider_id_of`), plus ``job_id`` and
    ``ts``; or None: when there is no event log yet, or nothing was learned there.  An event of
    an older log, which does not name its provider, counts for every real provider when its job
    was real and for the sandbox when it was a sandbox job: a sandbox lesson never calibrates a
    real estimate."""
    if schema_sha256 is None or not log_exists(home):
        return None
    import json

    from batchgrader.pipeline.answerkey import SANDBOX_PROVIDER

    sandbox = provider == SANDBOX_PROVIDER or provider.startswith(SANDBOX_PROVIDER + ":")
    with reading(home) as conn:
        rows = conn.execute(
            "SELECT job_id, ts, payload FROM events WHERE type = 'SchemaOverheadLearned' ORDER BY seq DESC"
        ).fetchall()
        sandbox_jobs: set[str] | None = None
        for job_id, ts, payload in rows:
            p = json.loads(payload)
            if p.get("model") != model or p.get("schema_sha256") != schema_sha256:
                continue
            if p.get("provider"):
                if p["provider"] == provider:
                    return {**p, "job_id": job_id, "ts": ts}
                continue
            if sandbox_jobs is None:
                sandbox_jobs = {
                    j
                    for j, a in conn.execute("SELECT job_id, payload FROM events WHERE type = 'JobAccepted'")
                    if json.loads(a).get("sandbox")
                }
            if (job_id in sandbox_jobs) == sandbox:
                return {**p, "job_id": job_id, "ts": ts}
    return None

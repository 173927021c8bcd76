"""Batch run times and the progress and expected finish of running jobs (issue 27).

The read model ``batch_runs`` keeps, per batch seen completed, how long it ran: from the time its
create was asked (``BatchCreateRequested``) to the event that saw it completed.  The expected
finish of a running job is the latest of its batches in flight's start plus the median run time
of the last :data:`LEARNED` batches of the same model (real and sandbox apart); it is an estimate
and says what it rests on, and there is none until a batch of that model has completed.
"""

from __future__ import annotations

import sqlite3
import statistics
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchgrader.core.log.state import JobState
    from batchgrader.store.eventstore import Event

LEARNED = 20  # run times kept per model for the median
IN_FLIGHT = ("validating", "in_progress", "finalizing", "cancelling")
NOT_SENT = ("pending", "waiting", "uploading", "uploaded", "submitting", "upload_failed")

# One row per batch seen completed: how long it ran (create asked -> completed seen), for the ETA
# of `bgctl status` (learned per model, real and sandbox apart).
BATCH_RUN_COLUMNS: dict[str, type] = {
    "batch_id": str,
    "job_id": str,
    "model": str,
    "sandbox": int,
    "requests": int,
    "seconds": float,
    "ts": str,  # when it was seen completed
}


def batch_run_row(e: Event, job: JobState) -> dict[str, Any] | None:
    """The ``batch_runs`` row of a ``BatchStatusChanged`` to ``completed`` (None for another
    status, or a chunk whose create time is not known)."""
    p = e.payload
    chunk = p.get("chunk")
    c = job.chunks.get(chunk) if p.get("status") == "completed" and isinstance(chunk, int) else None
    if c is None or c.batch_id != p.get("batch_id") or not c.requested_ts:
        return None
    seconds = (datetime.fromisoformat(e.ts) - datetime.fromisoformat(c.requested_ts)).total_seconds()
    total = int((p.get("request_counts") or {}).get("total") or c.requests or 0)
    return {
        "batch_id": c.batch_id,
        "job_id": e.job_id,
        "model": job.model,
        "sandbox": int(job.sandbox),
        "requests": total,
        "seconds": max(0.0, seconds),
        "ts": e.ts,
    }


def learned_run_times(conn: Any, models: Iterable[tuple[str, bool]]) -> dict[tuple[str, bool], list[float]]:
    """The last :data:`LEARNED` run times (seconds) of each ``(model, sandbox)``, newest first
    (``conn``: the SQLite file's, or a PostgreSQL store's :class:`~batchgrader.store.pgstore.QmarkConnection`;
    a daemon asks its store: ``store.learned_run_times``)."""
    out: dict[tuple[str, bool], list[float]] = {}
    for model, sandbox in set(models):
        try:
            rows = conn.execute(
                "SELECT seconds FROM batch_runs WHERE model = ? AND sandbox = ? ORDER BY ts DESC LIMIT ?",
                (model, int(sandbox), LEARNED),
            ).fetchall()
        except sqlite3.OperationalError:  # an older read model: no such table
            return {}
        if rows:
            out[(model, sandbox)] = [r[0] for r in rows]
    return out


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{round(s / 60)}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def progress(batches: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Rows answered (completed or failed) of rows sent, from the batches' request counts."""
    answered = sent = 0
    for b in batches:
        rc = b.get("request_counts") or {}
        answered += int(rc.get("completed") or 0) + int(rc.get("failed") or 0)
        sent += int(rc.get("total") or 0)
    return {"answered": answered, "sent": sent}


def eta(job: Mapping[str, Any], learned: Mapping[tuple[str, bool], list[float]], now: float) -> tuple[float | None, str | None]:
    """``(eta_seconds, eta_basis)`` of a job with batches in flight, or ``(None, None)`` when
    none is in flight or nothing has been learned about its model yet."""
    flying = [b for b in job.get("batches") or () if b.get("status") in IN_FLIGHT and b.get("requested_ts")]
    times = learned.get((job.get("model") or "", bool(job.get("sandbox"))))
    if not flying or not times:
        return None, None
    typical = statistics.median(times)
    last_start = max(datetime.fromisoformat(b["requested_ts"]).timestamp() for b in flying)
    seconds = max(0.0, last_start + typical - now)
    where = " sandbox" if job.get("sandbox") else ""
    basis = (
        f"median run time of the last {len(times)}{where} {job.get('model')} batch{'es' if len(times) != 1 else ''} "
        f"here ({_duration(typical)}), from the start of the latest of the {len(flying)} in flight"
    )
    unsent = sum(1 for b in job.get("batches") or () if b.get("status") in NOT_SENT)
    if unsent:
        basis += f"; {unsent} chunk{'s' if unsent != 1 else ''} not sent yet {'are' if unsent != 1 else 'is'} not counted"
    if seconds == 0:
        basis += "; it is past its usual run time"
    return seconds, basis


def attach_progress(jobs: list[dict[str, Any]], conn: Any, now: float) -> list[dict[str, Any]]:
    """Each unfinished job's ``progress`` ({answered, sent}), ``eta_seconds`` and ``eta_basis``."""
    active = [d for d in jobs if d["state"] not in ("completed", "completed_with_errors", "failed", "cancelled")]
    learned = learned_run_times(conn, ((d.get("model") or "", bool(d.get("sandbox"))) for d in active)) if conn else {}
    for d in jobs:
        d["progress"], d["eta_seconds"], d["eta_basis"] = None, None, None
    for d in active:
        d["progress"] = progress(d.get("batches") or ())
        d["eta_seconds"], d["eta_basis"] = eta(d, learned, now)
    return jobs

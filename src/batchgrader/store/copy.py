"""Moving a home's event log: copy the SQLite file's events into a PostgreSQL store, then check
that both fold to the same state (``bgctl store copy --to postgresql://...``).

The copy keeps every event as it is: its position (``seq``), job, per-job number, type, version,
time and payload bytes.  It is incremental: a target that already holds a prefix of the same log
(an earlier copy) gets only the events after it, so a running installation is moved by copying
once while the daemon runs, stopping it, copying again (seconds), and starting the daemons with
``store_url`` (docs/scaling.md).  A target holding anything else is refused, untouched.  The
target's read models are brought up to date in the copy's transaction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batchgrader.core.log.state import State, fold
from batchgrader.store.eventstore import EVENT_COLUMNS, READ_BATCH, EventStore
from batchgrader.store.pgstore import CHANNEL, PostgresEventStore, one, redact
from batchgrader.store.readmodels import job_row


class CopyRefused(RuntimeError):
    """The target holds events that are not the source's: nothing was written."""


@dataclass(frozen=True)
class CopyResult:
    source: str
    target: str
    copied: int  # events written by this copy
    already: int  # events the target held already (an earlier copy)
    last_seq: int
    jobs: int
    same_state: bool  # both logs fold to the same state, and the target's job_status rows are that state's
    differences: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def copy_log(source: Path, target_url: str) -> CopyResult:
    """Copy the SQLite log at ``source`` into the PostgreSQL store at ``target_url`` and verify
    (see the module docstring).  Raises :class:`CopyRefused` when the target holds another log."""
    from batchgrader.store.pg_readmodels import PgStatusProjector
    from batchgrader.store.pg_readmodels import projectors as pg_projectors

    with EventStore(Path(source), readonly=True) as src, PostgresEventStore(target_url, projectors=pg_projectors()) as dst:
        copied = already = 0
        with dst.write() as conn:
            conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")  # no daemon appends meanwhile
            already = int(one(conn, "SELECT COUNT(*) FROM events"))
            target_last = int(one(conn, "SELECT COALESCE(MAX(seq), 0) FROM events"))
            if already:
                _check_prefix(src, conn, already, target_last)
            cur = src.conn.execute(f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > ? ORDER BY seq", (target_last,))
            with conn.cursor().copy("COPY events (seq, job_id, job_seq, type, version, ts, payload) FROM STDIN") as out:
                while rows := cur.fetchmany(READ_BATCH):
                    for r in rows:
                        out.write_row(r)
                    copied += len(rows)
            cur.close()
            if copied:
                conn.execute("SELECT setval(pg_get_serial_sequence('events', 'seq'), (SELECT MAX(seq) FROM events))")
                PgStatusProjector().setup(conn)  # the read models catch up with the copied events
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, "copy"))
        a, b = fold(src.read()), fold(dst.read())
        differences = state_differences(a, b)
        rows_now = {r["job_id"]: r for r in dst.read_model("job_status")}
        differences += [
            f"job {j}: the target's job_status row is not its fold"
            for j, job in b.jobs.items()
            if rows_now.get(j) != job_row(job)
        ]
        return CopyResult(
            source=str(source),
            target=redact(target_url),
            copied=copied,
            already=already,
            last_seq=b.last_seq,
            jobs=len(b.jobs),
            same_state=not differences,
            differences=differences[:20],
        )


def _check_prefix(src: EventStore, conn: Any, count: int, last: int) -> None:
    """The target's events must be the source's first ``count`` events, positions included."""
    (n,) = src.conn.execute("SELECT COUNT(*) FROM events WHERE seq <= ?", (last,)).fetchone()
    theirs = conn.execute(f"SELECT {EVENT_COLUMNS} FROM events WHERE seq = %s", (last,)).fetchone()
    ours = src.conn.execute(f"SELECT {EVENT_COLUMNS} FROM events WHERE seq = ?", (last,)).fetchone()
    if n != count or ours is None or tuple(theirs) != tuple(ours):
        raise CopyRefused(
            f"the target already holds {count} event(s) up to position {last} that are not this log's first ones: "
            "copy into an empty database (or the one an earlier copy of this log filled)"
        )


def state_differences(a: State, b: State) -> list[str]:
    """Where two folded states differ (empty: the same state)."""
    out: list[str] = []
    if a.last_seq != b.last_seq:
        out.append(f"last position {a.last_seq} != {b.last_seq}")
    for j in sorted(set(a.jobs) | set(b.jobs)):
        ja, jb = a.jobs.get(j), b.jobs.get(j)
        if ja is None or jb is None:
            out.append(f"job {j} is in one log only")
        elif ja != jb:
            out.append(f"job {j} folds differently")
    for name in ("spend_by_day", "tokens_by_day", "queue_limits", "rejected", "sha_jobs", "batch_index", "schema_overhead"):
        if getattr(a, name) != getattr(b, name):
            out.append(f"{name} differs")
    return out

"""What the daemon's screen and systemd see: an immutable snapshot of the state.

The tick thread is the only one that touches :class:`~batchgrader.core.log.state.State` (it folds
every event it appends into it).  At the end of each tick it takes a :class:`Snapshot` (plain
tuples of frozen rows) and publishes it by replacing one attribute; the main thread's status line
and live view read only that value, so they never iterate a dict the tick thread is changing.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchgrader.core.log.state import State


@dataclass(frozen=True)
class JobRow:
    job_id: str
    file: str
    state: str
    rows: int
    chunks_done: int
    chunks_total: int
    cost_usd: float
    batches: str  # "index:step" per chunk, as `bgctl status` names the steps
    error: str  # the job's error, or why it is held
    terminal: bool
    running: int  # batches in flight


@dataclass(frozen=True)
class Snapshot:
    jobs: tuple[JobRow, ...] = ()

    def status_line(self, sandbox: bool) -> str:
        active = [j for j in self.jobs if not j.terminal]
        running = sum(j.running for j in active)
        finished = len(self.jobs) - len(active)
        return f"{'SANDBOX (simulated) ' if sandbox else ''}{len(active)} active jobs, {running} batches running, {finished} finished"


def take(state: State, since: str | None = None) -> Snapshot:
    """A snapshot of ``state``; call it on the thread that owns the state.  ``since`` (an ISO
    time): only the jobs with an event recorded since then (``daemon --once``: this run's jobs)."""
    from batchgrader.store.figures import figures_of  # the figures every reader shows
    from batchgrader.store.readmodels import chunk_label  # the same step names as `bgctl status`

    rows = []
    for j in sorted(state.jobs.values(), key=lambda j: j.created_ts):
        if since is not None and (j.updated_ts or "") < since:
            continue
        chunks = sorted(j.chunks.values(), key=lambda c: c.index)
        rows.append(
            JobRow(
                job_id=j.job_id,
                file=j.file,
                state=j.state,
                rows=j.rows,
                chunks_done=j.chunks_done,
                chunks_total=j.chunks_total,
                cost_usd=figures_of(state, j).cost_usd,  # a panel's: its judges'
                batches=" ".join(f"{c.index}:{chunk_label(c)}" for c in chunks),
                error=(j.error or {}).get("error") or (j.held or {}).get("reason") or "",
                terminal=j.terminal,
                running=sum(1 for c in chunks if c.in_flight),
            )
        )
    return Snapshot(tuple(rows))

"""`bgctl evals results` and `list`: an imported eval's run read from the event log, and its
results written when its jobs have ended.

The decision is the daemon's own (:func:`batchgrader.core.rules.evalchain.decide_eval`), over the
jobs of the eval's queued files folded from the log (only those jobs' events are read).  What it
asks is done by the same library calls the daemon's eval step makes
(:mod:`batchgrader.pipeline.evals.results`, :mod:`batchgrader.pipeline.evals.chain`); the
grading of a generate-then-grade run is queued here only under the daemon's lock (no daemon
runs for the home), so it is never queued by both.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from batchgrader.core.host.home import Home
from batchgrader.core.log.state import State, fold
from batchgrader.core.rules import evalchain as ec
from batchgrader.pipeline.evals import folder as evfolder
from batchgrader.pipeline.evals.folder import UnknownEval as UnknownEval


class NotReady(RuntimeError):
    """A job of the eval has not ended yet (or was never taken): the message says which and what to do."""


def observe(home: Home, record: ec.EvalRecord) -> tuple[State, dict[str, int], frozenset[str]]:
    """The folded state of the eval's jobs, each one's first ``seq``, and its queued paths still in the inbox."""
    from batchgrader.store import queries
    from batchgrader.store.eventstore import read_events

    stages = [s for s in (record.generation, record.grading) if s is not None]
    paths = {os.path.normpath(f.path) for s in stages for f in s.files}
    waiting = frozenset(p for p in paths if os.path.exists(p))
    if not paths or not queries.log_exists(home):
        return State(), {}, waiting
    first_seq: dict[str, int] = {}
    with queries.reading(home) as conn:
        rows = conn.execute(
            "SELECT seq, job_id, type, payload FROM events WHERE seq > ? AND type IN ('JobAccepted', 'FileRejected') ORDER BY seq",
            (min(s.after_seq for s in stages),),
        ).fetchall()
        for seq, job_id, type_, payload in rows:
            p = json.loads(payload)
            where = p.get("source") if type_ == "JobAccepted" else p.get("path")
            if where and os.path.normpath(where) in paths and not p.get("panel_of"):
                first_seq.setdefault(str(job_id), int(seq))
        events = [e for job_id in first_seq for e in read_events(conn, job_id=job_id)]
    return fold(sorted(events, key=lambda e: e.seq)), first_seq, waiting


def _pending(record: ec.EvalRecord, state: State, first_seq: dict[str, int]) -> str:
    for stage, key, job in ec.run_jobs(record, state, first_seq):
        if job is None:
            return f"the {stage} job {key} has not been taken by the daemon yet: start it (`bgctl daemon`), or wait"
        if not ec.has_ended(job):
            return f"the {stage} job {job.job_id} ({key}, profile {job.profile}) is {job.state}: wait for it (`bgctl status {job.job_id}`)"
    return "its grading is queued when the daemon next looks"


def step(home: Home, name: str, now: float | None = None) -> ec.EvalAction | None:
    """Do what is due for the eval (results written; the grading queued, under the daemon's lock
    only); what was due (None: nothing, or a job still runs)."""
    from batchgrader.core.host.lock import AlreadyRunning, InstanceLock
    from batchgrader.ops.grade import log_position
    from batchgrader.pipeline.evals import chain
    from batchgrader.pipeline.evals import results as pr

    record = evfolder.record(home, name)
    state, first_seq, waiting = observe(home, record)
    due = ec.decide_eval(record, state, first_seq, waiting)
    if isinstance(due, ec.WriteResults):
        pr.finish(home, name, [(k, state.jobs[j]) for k, j in due.jobs], fingerprint=due.fingerprint, now=now)
    elif isinstance(due, ec.QueueGrading | ec.Requeue):
        lock = InstanceLock(home.lock_file)
        try:
            lock.acquire()
        except AlreadyRunning:
            return None  # the running daemon does it
        try:
            record = evfolder.record(home, name)  # as it is now that no daemon can write it
            state, first_seq, waiting = observe(home, record)
            due = ec.decide_eval(record, state, first_seq, waiting)
            if isinstance(due, ec.QueueGrading):
                chain.queue_grading(home, name, state.jobs[due.generation_job], log_position(home))
            elif isinstance(due, ec.Requeue):
                chain.requeue(home, name, due.key)
        finally:
            lock.release()
    return due


def finish(home: Home, name: str, *, now: float | None = None) -> dict[str, Any]:
    """The eval's report once its results are written (written here when they are due);
    :class:`NotReady` while a job runs, :class:`UnknownEval` for a name not imported."""
    evfolder.load(home, name)  # UnknownEval, with the evals imported
    for _ in range(3):  # a result written, a grading queued: look again
        due = step(home, name, now)
        if due is None or isinstance(due, ec.WriteResults):
            break
    record = evfolder.record(home, name)
    state, first_seq, _waiting = observe(home, record)
    if ec.run_state(record, state, first_seq) != "done":
        raise NotReady(_pending(record, state, first_seq))
    written = evfolder.read_json(evfolder.evals_root(home) / name / evfolder.RESULTS_FILE)
    rep = evfolder.read_json(Path(written["paths"]["report"]))
    rep["paths"] = written["paths"]
    return dict(rep)


def wait_for(home: Home, name: str, *, sandbox: bool, timeout: float | None, poll: float = 0.5) -> None:
    """Wait until every job of the eval has ended, stage after stage (the daemon in the
    foreground when none runs, as `bgctl grade` does); :class:`~batchgrader.ops.grade.GradeTimeout`
    after ``timeout`` seconds."""
    from batchgrader.ops import grade as g

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step(home, name)
        record = evfolder.record(home, name)
        state, first_seq, _waiting = observe(home, record)
        if ec.run_state(record, state, first_seq) in ("done", "results due"):
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise g.GradeTimeout(f"eval {name}: {_pending(record, state, first_seq)}", None)
        pending = [(st, key) for st, key, job in ec.run_jobs(record, state, first_seq) if job is None or not ec.has_ended(job)]
        if not pending:  # the grading is due while a daemon holds the home: its eval step queues it
            time.sleep(poll)
            continue
        stage, key = pending[0]
        after = record.generation if stage == "generation" else record.grading
        assert after is not None
        path = next(f.path for f in after.files if f.key == key)
        g.follow(home, g.Queued(Path(path), after.after_seq), sandbox=sandbox, timeout=left, install_signals=True)


def list_runs(home: Home) -> list[dict[str, Any]]:
    """The evals imported into the home, each as one run: its state and its jobs."""
    out = []
    for e in evfolder.list_evals(home):
        record = evfolder.record(home, e["name"])
        state, first_seq, _waiting = observe(home, record)
        e["state"] = ec.run_state(record, state, first_seq)
        e["run_jobs"] = [
            {"stage": stage, "key": key, "job_id": job.job_id if job else None, "state": job.state if job else "queued"}
            for stage, key, job in ec.run_jobs(record, state, first_seq)
        ]
        out.append(e)
    return out

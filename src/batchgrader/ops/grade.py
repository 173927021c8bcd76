"""Grade one file and wait for it: what `bgctl grade` and the Python API (:mod:`batchgrader.api`)
share once the file is queued in the inbox.

The file goes the one way every file goes (inbox → event log → daemon).  :func:`follow` finds the
job the daemon made of it (the first ``JobAccepted`` or ``FileRejected`` for its inbox path after
the log position noted when it was queued) and waits until the job has ended and its result or
error report is written:

* a daemon runs for the home: it reads the event log every ``poll`` seconds (a read-only
  snapshot, nothing written), bounded by ``timeout``;
* no daemon runs: it runs one in the foreground as ``bgctl daemon --once`` does (``sandbox``:
  the emulator), which works until every job of the inbox has ended, this one included.  A
  daemon that starts meanwhile takes the lock first: then it waits on the log as above.

:func:`summary_line` and :func:`exit_code` say how the job ended, as `bgctl daemon --once` counts it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgrader.core.host.home import Home

FINISHED = ("completed", "completed_with_errors", "failed", "cancelled")
EXIT_OK = 0
EXIT_JOB_FAILED = 4  # as `bgctl daemon --once` when a job ended failed


class GradeError(RuntimeError):
    """The job could not be followed to its end (the reason and what to do in the message)."""


class GradeTimeout(GradeError):
    """The job had not ended when the wait's ``timeout`` ran out (it goes on: see ``job_id``)."""

    def __init__(self, message: str, job_id: str | None):
        super().__init__(message)
        self.job_id = job_id


@dataclass(frozen=True)
class Queued:
    """A file queued in the inbox: where it waits, and the log's last event before it was queued."""

    path: Path
    after_seq: int


def running_daemon_mode(home: Home) -> tuple[int, bool | None] | None:
    """``(pid, sandbox)`` of the daemon running for ``home`` (``sandbox`` read from the line its
    start wrote to the daemon log; None when that line is not found), or None when none runs."""
    from batchgrader.core.host.lock import daemon_pid
    from batchgrader.ops.logs import log_files

    pid = daemon_pid(home) if home.root.exists() else None
    if pid is None:
        return None
    needle = f"daemon starting (pid {pid}, "
    for path in reversed(log_files(home)):  # newest first
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        at = text.rfind(needle)
        if at >= 0:
            line = text[at : text.find("\n", at) if "\n" in text[at:] else len(text)]
            return pid, "SANDBOX" in line
    return pid, None


def check_mode(home: Home, sandbox: bool) -> None:
    """Refuse, before anything is queued, a sandbox grade that a real daemon running for the home
    would take: it would send the file to the provider, for real and at a cost."""
    running = running_daemon_mode(home)
    if sandbox and running is not None and running[1] is False:
        raise GradeError(
            f"a real daemon (pid {running[0]}) runs for {home.root}: it would grade the file for real, not in the "
            "sandbox. Leave out --sandbox (sandbox=False) to grade it for real, or use another home for the sandbox"
        )


def log_position(home: Home) -> int:
    """The last event's ``seq`` (0: no event log yet)."""
    from batchgrader.store import queries

    if not queries.log_exists(home):
        return 0
    with queries.reading(home) as conn:
        row = conn.execute("SELECT MAX(seq) FROM events").fetchone()
    return int(row[0] or 0)


def job_of(home: Home, queued: Queued) -> str | None:
    """The job the daemon made of the queued file (accepted or rejected), or None while it waits."""
    from batchgrader.store import queries

    if not queries.log_exists(home):
        return None
    want = os.path.realpath(queued.path)
    with queries.reading(home) as conn:
        rows = conn.execute(
            "SELECT job_id, type, payload FROM events WHERE seq > ? AND type IN ('JobAccepted', 'FileRejected') ORDER BY seq",
            (queued.after_seq,),
        ).fetchall()
    for job_id, type_, payload in rows:
        p = json.loads(payload)
        where = p.get("source") if type_ == "JobAccepted" else p.get("path")
        if where and os.path.realpath(where) == want and not p.get("panel_of"):
            return str(job_id)
    return None


def job_status(home: Home, job_id: str) -> dict[str, Any]:
    """The job's `bgctl status --json` row (state, rows, progress, ETA, cost, result path, ...)."""
    from batchgrader.store import queries

    (row,) = queries.status(home, job_id)
    return row


def ended(home: Home, job_id: str) -> dict[str, Any] | None:
    """The job's status row once it has ended with its result (or error report) written (an
    ending state, and every ``OutboxWriteStarted`` closed by its ``ResultWritten``), with the
    last ``ResultWritten``'s ``result_path`` and ``error_path``; None until then."""
    from batchgrader.store import queries

    with queries.reading(home) as conn:
        rows = conn.execute(
            "SELECT type, payload FROM events WHERE job_id = ? AND type IN ('OutboxWriteStarted', 'ResultWritten') ORDER BY seq",
            (job_id,),
        ).fetchall()
    if not rows or rows[-1][0] != "ResultWritten":
        return None
    row = job_status(home, job_id)
    if row["state"] not in FINISHED:
        return None
    last = json.loads(rows[-1][1])
    return {**row, "result_path": last.get("path"), "error_path": last.get("error_path")}


Progress = Callable[[dict[str, Any]], None]  # given the job's status row as it changes


def follow(
    home: Home,
    queued: Queued | None = None,
    *,
    job_id: str | None = None,
    sandbox: bool | None = None,
    timeout: float | None = None,
    poll: float = 0.5,
    on_progress: Progress | None = None,
    foreground: bool = True,
    install_signals: bool = False,
) -> dict[str, Any]:
    """Wait until the job has ended (see the module's docstring): the queued file's job, or the
    job ``job_id``; its status row, with its ``result_path`` and ``error_path``.

    ``sandbox``: the foreground daemon's mode (None: the job's own, else a real daemon).
    ``foreground=False`` never starts a daemon (waits for one).  ``install_signals``: the
    foreground daemon stops on SIGINT/SIGTERM as `bgctl daemon` does (main thread only)."""
    from batchgrader.core.host.lock import AlreadyRunning, daemon_pid

    if queued is None and job_id is None:
        raise ValueError("follow: a queued file or a job id")

    def find() -> str | None:
        return job_id or (job_of(home, queued) if queued is not None else None)

    deadline = None if timeout is None else time.monotonic() + timeout
    last: str | None = None
    while True:
        job_id = find()
        if job_id is not None:
            done = ended(home, job_id)
            if done is not None:
                return done
            if on_progress is not None:
                row = job_status(home, job_id)
                if progress_line(row) != last:
                    on_progress(row)
                    last = progress_line(row)
        if foreground and daemon_pid(home) is None:
            mode = sandbox if sandbox is not None else bool(job_id and job_status(home, job_id).get("sandbox"))
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                run_foreground(home, mode, find, on_progress, install_signals, timeout=left)
            except AlreadyRunning:  # a daemon started meanwhile: it takes the file
                continue
            job_id = find()
            done = ended(home, job_id) if job_id is not None else None
            if done is not None:
                return done
            if deadline is not None and time.monotonic() >= deadline:
                what = f"job {job_id}" if job_id else f"{queued.path if queued else '?'} (not taken by the daemon yet)"
                raise GradeTimeout(f"{what} has not ended after {timeout:g} s; the daemon stopped: see `bgctl status`", job_id)
            if job_id is None:
                raise GradeError("the daemon stopped before it took the file: see `bgctl status` and `bgctl logs`")
            row = job_status(home, job_id)
            why = row.get("held_reason") or row.get("last_error")
            raise GradeError(
                f"job {job_id} is {row['state']}" + (f" ({why})" if why else "") + ": the daemon stopped with nothing "
                "more it could do for it (as `daemon --once` does); see `bgctl status`, `bgctl logs`"
            )
        if deadline is not None and time.monotonic() >= deadline:
            what = f"job {job_id}" if job_id else f"{queued.path if queued else '?'} (not taken by the daemon yet)"
            raise GradeTimeout(f"{what} has not ended after {timeout:g} s; it goes on: see `bgctl status`", job_id)
        time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))


class _ProgressView:
    """The foreground daemon's view: the job's status row handed to ``on_progress`` as it changes
    (read from the log at most every ``every`` seconds, on the daemon's main loop)."""

    def __init__(self, home: Home, find: Callable[[], str | None], on_progress: Progress, every: float = 0.5):
        self.home, self.find, self.on_progress, self.every = home, find, on_progress, every
        self.next = 0.0
        self.last: str | None = None

    def start(self) -> None:
        pass

    def update(self, snapshot: object) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.every
        try:
            job_id = self.find()
            if job_id is None:
                return
            row = job_status(self.home, job_id)
        except Exception:  # the log is being created: next time
            return
        if progress_line(row) != self.last:
            self.last = progress_line(row)
            self.on_progress(row)

    def stop(self) -> None:
        pass


def run_foreground(
    home: Home,
    sandbox: bool,
    find: Callable[[], str | None] = lambda: None,
    on_progress: Progress | None = None,
    install_signals: bool = False,
    timeout: float | None = None,
) -> int:
    """Run the daemon as `bgctl daemon --once [--sandbox]` does, in this process, until every job
    of the inbox has ended (or ``timeout`` seconds have passed: then it stops as on SIGTERM).  The process's umask and the ``batchgrader`` logger's handlers are
    put back afterwards (a notebook runs this more than once).  Raises ``AlreadyRunning`` when
    another daemon holds the home, ``DaemonError`` (with its ``exit_code``) when the daemon refuses
    to start (configuration, key)."""
    import logging

    from batchgrader.daemon.process import Daemon

    view = _ProgressView(home, find, on_progress) if on_progress is not None else None
    d = Daemon(home, sandbox=sandbox, once=True, view=view)
    if install_signals:
        d.install_signal_handlers()
    logger = logging.getLogger("batchgrader")
    handlers, umask = list(logger.handlers), os.umask(0o077)
    os.umask(umask)
    timer = None
    if timeout is not None:  # stop as on SIGTERM: the daemon ends its tick and stops, the job goes on at its next start
        import threading

        def stop() -> None:
            d.stop_reason = f"bgctl grade: no end after {timeout:g} s"
            d.stop.set()
            d.wake.set()

        timer = threading.Timer(timeout, stop)
        timer.daemon = True
        timer.start()
    try:
        return d.run()
    finally:
        if timer is not None:
            timer.cancel()
        os.umask(umask)
        for h in logger.handlers[:]:
            if h not in handlers:
                logger.removeHandler(h)
                h.close()


def exit_code(row: dict[str, Any]) -> int:
    """As `bgctl daemon --once`: 4 when the job ended failed, else 0 (rows that failed in a job
    that completed are in its summary and its result's error column)."""
    return EXIT_JOB_FAILED if row["state"] == "failed" else EXIT_OK


def summary_line(row: dict[str, Any]) -> str:
    """One line: the job, how it ended, its rows, cost and where the result is."""
    parts = [f"job {row['job_id']} {row['state']}"]
    if row.get("rows") is not None:
        parts.append(f"{row['rows']} rows: {row.get('succeeded') or 0} answered, {row.get('failed') or 0} failed")
    if row.get("cost_usd") is not None:
        parts.append(f"${row['cost_usd']:.4f}" + (" SIMULATED" if row.get("sandbox") else ""))
    elif row.get("sandbox"):
        parts.append("SIMULATED")
    line = ", ".join(parts)
    if row["state"] == "failed" and (row.get("error") or row.get("last_error")):
        line += f" ({row.get('error') or row.get('last_error')})"
    return line


def progress_line(row: dict[str, Any]) -> str:
    """One line of progress for a terminal or a notebook: state, rows answered of sent, ETA."""
    parts = [f"job {row['job_id']}: {row['state']}"]
    prog = row.get("progress") or {}
    if prog.get("sent"):
        parts.append(f"{prog.get('answered') or 0}/{prog['sent']} rows answered")
    elif row.get("rows"):
        parts.append(f"{row['rows']} rows")
    eta = row.get("eta_seconds")
    if eta is not None:
        parts.append(f"ETA {_duration(float(eta))}")
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"

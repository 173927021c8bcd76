"""The daemon's side of the control files (their protocol: :mod:`batchgrader.core.host.control_files`):
``bgctl cancel`` and ``bgctl retry`` leave a request as a JSON file in the home's ``control/``
folder; the daemon reads them in order and applies each (:func:`apply_controls`,
:func:`apply_control`), and sets aside what it cannot apply in ``control/rejected/``; a request
wakes the daemon at once (:func:`watch_control`).

On a shared store every daemon sees the shared home's ``control/``: a request is applied exactly
once, by the daemon whose claim of its name (:func:`~batchgrader.store.claims.claim_control`)
commits with the event it appends; the others find it claimed and only remove the file.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from batchgrader.core.host.control_files import CONTROL_DIR, pending_controls, set_control_aside
from batchgrader.core.host.home import Home
from batchgrader.core.log.events import NewEvent

log = logging.getLogger("batchgrader")


def apply_controls(engine, home: Home) -> None:  # noqa: ANN001
    """Apply every pending control request in order: an applied one is removed, one that cannot
    be applied set aside (:func:`set_control_aside`).  On a shared store each is applied by one
    daemon (:func:`_apply_once`); one that met another daemon's append to its job stays for the
    next tick."""
    from batchgrader.store.eventstore import ConcurrencyError
    from batchgrader.store.leases import LeaseLost

    for path in pending_controls(home):
        try:
            problem = _apply_once(engine, path.name, json.loads(path.read_text()))
        except FileNotFoundError:
            continue  # applied and removed by another daemon meanwhile
        except (ConcurrencyError, LeaseLost) as exc:
            log.info("control request %s: %s (applied at the next tick)", path.name, exc)
            continue
        except (OSError, ValueError) as exc:
            problem = f"unreadable: {exc}"
        if problem is None:
            path.unlink(missing_ok=True)
        else:
            set_control_aside(home, path, problem)


def _apply_once(engine, name: str, req: object) -> str | None:  # noqa: ANN001
    """:func:`apply_control`; on a shared store after folding what other daemons appended, its
    event appended with the request's claim (None, nothing appended, when another daemon applied
    it first)."""
    from batchgrader.store.claims import ControlApplied

    shared = engine.shared
    if shared is None:
        return apply_control(engine, req)
    engine.ctx.catch_up()  # a job another daemon accepted a moment ago is known
    try:
        return apply_control(engine, req, also=shared.control_claim(name))
    except ControlApplied as exc:
        log.info("%s", exc)
        return None


def apply_control(engine, req: object, also: Callable[[Any], None] | None = None) -> str | None:  # noqa: ANN001
    """Apply one control request; the reason it cannot be applied, or None when it was.
    ``also``: written in the transaction of the event it appends (a shared store's claim)."""
    if not isinstance(req, dict):
        return f"not a JSON object (a {type(req).__name__})"
    job_id = req.get("job_id")
    job = engine.ctx.state.jobs.get(job_id) if isinstance(job_id, str) else None
    if job is None:
        return f"unknown job {job_id!r}"
    action, reason = req.get("action"), str(req.get("reason", ""))
    if action == "cancel":
        if not job.terminal and not job.corrupt:
            engine.ctx.emit(job.job_id, NewEvent("CancelRequested", {"reason": reason}), also=also)
        return None
    if action == "retry":
        if job.rejected:
            return f"job {job.job_id} is a rejected file ({job.last_error}); it cannot be retried"
        bound = req.get("max_completion_tokens")
        if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 1):
            return f"max_completion_tokens {bound!r} is not a positive integer"
        if (job.terminal or job.held) and not job.corrupt:
            payload: dict[str, object] = {"reason": reason}
            if bound is not None:
                payload["max_completion_tokens"] = bound
            engine.ctx.emit(job.job_id, NewEvent("RetryRequested", payload), also=also)
        return None
    return f"unknown action {action!r}"


def watch_control(observer: Any, home: Home, wake: threading.Event) -> None:
    """Have ``observer`` (the inbox watcher's) also wake the daemon for a request in ``control/``
    (`bgctl cancel`, `bgctl retry`): it is applied at once, not at the next due time.  (The home's
    own folder is not watched: every write of the database would wake the watcher's thread; an
    edit of the config files is seen at the next tick, or at once with SIGHUP.)"""
    from watchdog.events import FileSystemEventHandler

    class _Wake(FileSystemEventHandler):
        def on_any_event(self, event) -> None:  # noqa: ANN001
            if event.event_type not in ("opened", "closed_no_write"):
                wake.set()

    control = home.root / CONTROL_DIR
    control.mkdir(parents=True, exist_ok=True)
    observer.schedule(_Wake(), str(control), recursive=False)

"""The control-file protocol of ``bgctl cancel`` and ``bgctl retry``: a request is a JSON file
in the home's ``control/`` folder (:func:`request_control`, written atomically), read in order
(:func:`pending_controls`); one that cannot be applied is set aside in ``control/rejected/``
(:func:`set_control_aside`).  The daemon applies them (:mod:`batchgrader.daemon.control`); a long
step looks for a queued cancel between its requests (:func:`cancel_pending`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

from batchgrader.core.host.home import Home
from batchgrader.fsio import atomic_write_bytes, move_no_clobber

CONTROL_DIR = "control"
log = logging.getLogger("batchgrader")


def request_control(home: Home, action: str, job_id: str, reason: str = "", *, max_completion_tokens: int | None = None) -> Path:
    """Queue a request for the daemon (atomic file in ``control/``); a retry may carry the output
    bound of the rows it sends again."""
    folder = home.root / CONTROL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.time_ns()}-{action}-{uuid.uuid4().hex[:8]}.json"
    req: dict[str, object] = {"action": action, "job_id": job_id, "reason": reason}
    if max_completion_tokens is not None:
        req["max_completion_tokens"] = int(max_completion_tokens)
    atomic_write_bytes(path, json.dumps(req).encode())
    return path


def pending_controls(home: Home) -> list[Path]:
    folder = home.root / CONTROL_DIR
    return sorted(p for p in folder.glob("*.json") if not p.name.startswith(".")) if folder.is_dir() else []


def cancel_pending(home: Home, job_id: str) -> bool:
    """Whether a ``bgctl cancel`` of ``job_id`` is queued and not applied yet: a long step (the
    synchronous route's sending) looks between its requests, so a cancel takes effect at once."""
    for path in pending_controls(home):
        try:
            req = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # gone (applied meanwhile) or not readable: the daemon sets it aside
        if isinstance(req, dict) and req.get("action") == "cancel" and req.get("job_id") == job_id:
            return True
    return False


CONTROL_REJECTED_DIR = "rejected"  # control/rejected/: requests that could not be applied, kept for a look


def set_control_aside(home: Home, path: Path, problem: str) -> None:
    """Move a control request that cannot be applied to ``control/rejected/`` with a log line."""
    log.warning("control request %s set aside (%s)", path.name, problem)
    try:
        move_no_clobber(path, path.parent / CONTROL_REJECTED_DIR, path.name, str(time.time_ns()))
    except OSError as exc:
        log.warning("could not move %s aside (%s); removing it", path.name, exc)
        path.unlink(missing_ok=True)

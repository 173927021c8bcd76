"""What `submit`, `cancel`, `retry` and `status` check before they answer, so that what they say
is what will happen.  Each function returns a plain dict (the ``--json`` answer) with a
``message`` for people; nothing here prints.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from batchgrader.core.host.home import Home

FINISHED = ("completed", "completed_with_errors", "failed", "cancelled")
START_COMMANDS = ("bgctl daemon", "bgctl daemon --sandbox    # try it without an API key: simulated results")


def daemon_info(home: Home) -> dict[str, Any]:
    """``{running, pid, start}``: is a daemon holding this home's lock, and how to start one."""
    from batchgrader.core.host.lock import daemon_pid

    pid = daemon_pid(home) if home.root.exists() else None
    return {"running": pid is not None, "pid": pid, "start": START_COMMANDS}


def inbox_files(home: Home) -> list[dict[str, Any]]:
    """Files waiting in ``inbox/`` and ``inbox/<profile>/`` that the daemon has not taken yet:
    ``{file, path, profile, bytes, supported}`` (names being written, ``.part`` etc., are skipped)."""
    from batchgrader.pipeline.inbox import SUPPORTED_SUFFIXES, is_ignored

    out: list[dict[str, Any]] = []

    def add(folder: Path, profile: str) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for e in entries:
            if is_ignored(e.name):
                continue
            if e.is_dir(follow_symlinks=False):
                if profile == "default":
                    add(Path(e.path), e.name)
                continue
            if not e.is_file(follow_symlinks=False):
                continue
            supported = e.name.lower().endswith(SUPPORTED_SUFFIXES)
            out.append(
                {
                    "file": e.name,
                    "path": e.path,
                    "profile": profile,
                    "bytes": e.stat(follow_symlinks=False).st_size,
                    "supported": supported,
                    "note": None if supported else "unsupported type: will be rejected",
                }
            )

    add(home.inbox, "default")
    return out


def note_unknown_profiles(home: Home, files: list[dict[str, Any]], profiles: Collection[str] | None) -> None:
    """Set the ``note`` of each file waiting in an inbox folder that names no profile of the config
    (``profiles``; None: the config cannot be read, nothing is said): the daemon reports it as a
    failed job and leaves it there, so it waits until the profile exists or the file is moved."""
    if profiles is None:
        return
    known = sorted(profiles)
    for f in files:
        if f["profile"] == "default" or f["profile"] in known:
            continue
        dest = home.inbox / known[0] if len(known) == 1 else home.inbox  # the one profile, else the default
        f["note"] = (
            f"folder {f['profile']!r} is not a profile in config.yaml (profiles: {', '.join(known) or 'none defined'}): "
            f"the file waits here (reported as a failed job). Fix: add profile {f['profile']!r} to config.yaml, "
            f"or move the file to a profile's folder: mv {shlex.quote(f['path'])} {shlex.quote(str(dest))}/"
        )


def check_submittable(file: Path) -> None:
    """Refuse, before copying, a file the daemon would reject for its type (an :class:`InputError`:
    a usage error, exit 2)."""
    from batchgrader.pipeline.inbox import SUPPORTED_SUFFIXES, is_ignored
    from batchgrader.pipeline.tables import InputError

    if not file.name.lower().endswith(SUPPORTED_SUFFIXES):
        raise InputError(
            str(file),
            f"unsupported file type {file.suffix or '(no extension)'!r}; the daemon reads "
            + ", ".join(SUPPORTED_SUFFIXES)
            + ". Convert it, or rename it if it already is one of those formats",
        )
    if is_ignored(file.name):
        raise InputError(
            str(file), "the daemon ignores files whose names start with '.' or '~' or end in .part, .tmp, ...; rename it"
        )


#: the rows `bgctl submit` reads to check a file (its header, its encoding, its first rows); a
#: large file is not read through twice (here, then by the daemon)
SUBMIT_CHECKED_ROWS = 1000


def submit_action(
    home: Home, file: Path, profile: str | None, load_config: Callable[[], Any], *, fresh: bool = False
) -> dict[str, Any]:
    """`bgctl submit`: check the type, the profile and the start of the file's contents (as `bgctl
    count` reads them: an empty, undecodable or malformed start, or a file without a column the
    prompts need, is refused with count's message; the rows after the first
    :data:`SUBMIT_CHECKED_ROWS` are the daemon's to check, before anything is paid), then copy
    into the inbox atomically."""
    from batchgrader.pipeline.catalogue import load_checked
    from batchgrader.pipeline.inbox import submit_file
    from batchgrader.pipeline.input_checks import check_input

    check_submittable(file)
    config = load_config()
    config.profile(profile)  # an unknown profile is named before anything else
    config, _table = load_checked(config)  # what the daemon refuses to start with: a model the catalogue lacks, a refused setting
    check_input(file, config.profile(profile), home, rows=SUBMIT_CHECKED_ROWS)
    dest = submit_file(home.ensure(), file, profile, fresh=fresh)
    daemon = daemon_info(home)
    when = (
        "the running daemon will take it"
        if daemon["running"]
        else "no daemon is running: start one with `bgctl daemon`, or `bgctl daemon --sandbox` to try it without a key"
    )
    return {
        "queued": True,
        "path": str(dest),
        "profile": profile or "default",
        "daemon_running": daemon["running"],
        "message": f"queued {dest} ({when})",
    }


def _rejected_reason(home: Home, job_id: str) -> str | None:
    """The reason a job's file was rejected (a ``FileRejected`` event), "" if none was given, or
    None when the file was not rejected."""
    import json

    from batchgrader.store.queries import reading

    with reading(home) as conn:
        row = conn.execute(
            "SELECT payload FROM events WHERE job_id = ? AND type = 'FileRejected' ORDER BY seq DESC LIMIT 1", (job_id,)
        ).fetchone()
    if row is None:
        return None
    try:
        return str(json.loads(row[0]).get("reason", ""))
    except (ValueError, AttributeError):
        return ""


def control_action(
    home: Home, action: str, job_id: str, reason: str, *, max_completion_tokens: int | None = None
) -> dict[str, Any]:
    """`bgctl cancel` / `bgctl retry`: record the request only if the daemon will act on it.

    The daemon cancels a job that has not ended, and retries a job that has ended or is held
    (:meth:`batchgrader.daemon.process.Daemon._controls`); anything else is refused here with the
    reason, and nothing is recorded."""
    from batchgrader.core.host.control_files import request_control
    from batchgrader.core.host.lock import daemon_pid
    from batchgrader.store import queries

    (job,) = queries.status(home, job_id)
    jid, state = job["job_id"], job["state"]
    refusal = None
    if action == "cancel":
        if state in FINISHED:
            refusal = f"job {jid} has already ended ({state}); there is nothing to cancel"
        elif job.get("cancel_requested"):
            refusal = f"job {jid}: a cancel is already under way"
    elif action == "retry":
        rejected = _rejected_reason(home, jid)
        if rejected is not None:
            refusal = (
                f"job {jid} cannot be retried: its file was rejected before any row was read"
                + (f" ({rejected})" if rejected else "")
                + ". Fix the file and put it in the inbox again."
            )
        elif state not in FINISHED and state != "held":
            refusal = f"job {jid} is {state}; retry applies to a job that has ended or is held (cancel it first to stop it)"
        elif state == "completed" and not job.get("failed"):
            refusal = f"job {jid} completed with every row answered; there is nothing to retry"
    res: dict[str, Any] = {"action": action, "job_id": jid, "state": state, "accepted": refusal is None}
    if refusal:
        res["message"] = refusal
        return res
    request_control(home.ensure(), action, jid, reason, max_completion_tokens=max_completion_tokens)
    running = daemon_pid(home) is not None
    res["daemon_running"] = running
    res["message"] = f"{action} requested for job {jid}" + (
        "" if running else " (applied when the daemon next runs: bgctl daemon)"
    )
    return res

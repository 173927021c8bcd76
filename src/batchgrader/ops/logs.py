"""`bgctl logs`: the daemon's log (``<home>/logs/daemon.log`` and its rotated copies), oldest
first, optionally only the lines since a time, and optionally followed as it grows.

Lines start with a UTC timestamp ``YYYY-MM-DD HH:MM:SS,mmm`` (see
:func:`batchgrader.daemon.process.setup_logging`); a line without one (a traceback) belongs to
the line before it.  Following is bounded: by ``max_seconds`` and/or until a line containing
``until`` appears, so a script (or a test) can wait for "daemon stopped" without guessing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from batchgrader.core.host.home import Home

LOG_NAME = "daemon.log"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_RELATIVE = re.compile(r"^(\d+)\s*([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class LogError(ValueError):
    """A --since that is not a time, or no log to read."""


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: a UTC time ``YYYY-MM-DD[ HH:MM[:SS]]`` (or with ``T``), or an age such as
    ``30s``, ``10m``, ``2h``, ``1d``."""
    now = now or datetime.now(UTC)
    t = text.strip()
    m = _RELATIVE.match(t)
    if m:
        return now - timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise LogError(
            f"--since {text!r}: expected a UTC time YYYY-MM-DD[ HH:MM[:SS]] or an age such as 30s, 10m, 2h, 1d"
        ) from None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def log_files(home: Home) -> list[Path]:
    """The log and its rotated copies, oldest first (daemon.log.5 ... daemon.log.1, daemon.log)."""
    folder = home.logs
    rotated = sorted((p for p in folder.glob(LOG_NAME + ".*") if p.suffix[1:].isdigit()), key=lambda p: -int(p.suffix[1:]))
    main = folder / LOG_NAME
    return rotated + ([main] if main.exists() else [])


def _stamp(line: str) -> str | None:
    m = _STAMP.match(line)
    return m.group(1) if m else None


def read_lines(home: Home, since: datetime | None = None) -> list[str]:
    """Every log line (oldest first), or those from ``since`` on (continuation lines follow their line)."""
    cut = since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if since else None
    out: list[str] = []
    keep = cut is None
    for path in log_files(home):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                stamp = _stamp(line)
                if cut is not None and stamp is not None:
                    keep = stamp >= cut
                if keep:
                    out.append(line)
    return out


def follow(
    home: Home,
    max_seconds: float | None = None,
    until: str | None = None,
    poll: float = 0.2,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[str]:
    """New lines appended to daemon.log after the call, as they come (a rotation starts again
    at the top of the new file).  Ends after ``max_seconds``, after the first line containing
    ``until``, or when ``should_stop()`` is true."""
    path = home.logs / LOG_NAME
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    pos = path.stat().st_size if path.exists() else 0
    inode = path.stat().st_ino if path.exists() else None
    partial = ""
    while True:
        if path.exists():
            st = path.stat()
            if inode is not None and (st.st_ino != inode or st.st_size < pos):
                pos = 0  # rotated or truncated: read the new file from its start
            inode = st.st_ino
            if st.st_size > pos:
                with open(path, "rb") as f:
                    f.seek(pos)
                    data = f.read()
                    pos += len(data)
                lines = (partial + data.decode("utf-8", errors="replace")).split("\n")
                partial = lines.pop()
                for line in lines:
                    yield line
                    if until is not None and until in line:
                        return
        if should_stop is not None and should_stop():
            return
        if deadline is not None and time.monotonic() >= deadline:
            return
        time.sleep(poll)

"""The daemon's single instance: an ``flock`` on the home's ``daemon.lock`` holding the pid
(:class:`InstanceLock`), and :func:`daemon_pid`, how the CLI and the doctor learn whether a daemon
runs for a home without importing the daemon.  :class:`DaemonError` is the daemon's refusal to
start (with its exit code); :class:`AlreadyRunning` is the one this lock raises.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from batchgrader.core.host.home import Home


class DaemonError(RuntimeError):
    """A reason the daemon cannot start, with the fix in the message. Exit code 78 (EX_CONFIG):
    the service unit does not restart on it (RestartPreventExitStatus=78)."""

    exit_code = 78


class AlreadyRunning(DaemonError):
    exit_code = 75  # EX_TEMPFAIL


class InstanceLock:
    """flock on ``daemon.lock``: released by the kernel when the process dies (even kill -9)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid = os.read(fd, 32).decode().strip()
            finally:
                os.close(fd)
            raise AlreadyRunning(
                f"another bgctl daemon (pid {pid or '?'}) is already running for {self.path.parent}; "
                "stop it first, or use another --home"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def daemon_pid(home: Home) -> int | None:
    """The pid of the daemon holding the home's lock, or None."""
    if not home.lock_file.exists():
        return None
    fd = os.open(home.lock_file, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)

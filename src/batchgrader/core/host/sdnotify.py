"""sd_notify(3) without dependencies: tell systemd we are ready, alive, busy or stopping.

The protocol is one datagram of ``KEY=VALUE`` lines sent to the AF_UNIX socket named in
``$NOTIFY_SOCKET`` (a leading ``@`` means the Linux abstract namespace).  Without that
variable (macOS, a terminal, tests) every method is a cheap no-op, so the daemon can call
them unconditionally.  Sending never raises: failures are counted in ``errors`` /
``last_error`` and logged (a warning the first time, debug afterwards).

Daemon usage: ``ready()`` only after replay, reconciliation and the single-instance lock;
``watchdog()`` from the main loop every ``watchdog_interval()`` seconds (never from a
helper thread that would keep pinging while the real work is wedged); ``status(text)`` for
``systemctl status``; ``stopping()`` when SIGTERM arrives; ``extend_timeout(s)`` during a
long start-up or shutdown step.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

# C0/C1 controls, DEL and the Unicode line/paragraph separators: STATUS= must be one line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
STATUS_MAX = 1000


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None, *, pid: int | None = None) -> None:
        env = os.environ if environ is None else environ
        self.socket_name = env.get("NOTIFY_SOCKET") or None
        self._watchdog_usec = env.get("WATCHDOG_USEC")
        self._watchdog_pid = env.get("WATCHDOG_PID")
        self._pid = pid
        self.sent = 0
        self.errors = 0
        self.last_error: str | None = None

    @property
    def enabled(self) -> bool:
        return self.socket_name is not None

    def _address(self) -> bytes:
        name = self.socket_name or ""
        if name.startswith("@"):
            return b"\0" + os.fsencode(name[1:])
        if name.startswith("/"):
            return os.fsencode(name)
        raise OSError(f"unsupported NOTIFY_SOCKET address {name!r} (only AF_UNIX paths and @abstract)")

    def notify(self, message: str) -> bool:
        """Send one raw message; True if it was handed to the socket."""
        if self.socket_name is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message.encode("utf-8"), self._address())
        except OSError as exc:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            (log.warning if self.errors == 1 else log.debug)(
                "sd_notify to %r failed (%d so far): %s", self.socket_name, self.errors, self.last_error
            )
            return False
        self.sent += 1
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1" + (f"\nSTATUS={clean_status(status)}" if status else ""))

    def status(self, text: str) -> bool:
        return self.notify("STATUS=" + clean_status(text))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more time to finish starting/stopping (systemd >= 236)."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1_000_000))}")

    def watchdog_interval(self) -> float | None:
        """Seconds between ``watchdog()`` pings (half of WatchdogSec=), or None if not asked."""
        try:
            usec = int(self._watchdog_usec or "")
            if self._watchdog_pid and int(self._watchdog_pid) != (self._pid or os.getpid()):
                return None
        except ValueError:
            return None
        return usec / 2 / 1_000_000 if usec > 0 else None


def clean_status(text: str) -> str:
    """One line: control characters and runs of whitespace become one space; capped in length."""
    return " ".join(_CONTROL.sub(" ", str(text)).split())[:STATUS_MAX]

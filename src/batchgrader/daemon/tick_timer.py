"""The daemon's timer: one APScheduler date job runs the tick at the earliest time anything is due.

:class:`TickTimer` arms the job after every tick at the wait :class:`TickPace` derives from the
tick's :class:`TickOutcome` (the due time of :func:`batchgrader.core.due.next_due`, work due at
once, a failed step), and re-arms it to now when the daemon is woken; :func:`watch_control`
adds a request in ``control/`` to the wake-ups.  Ticks never overlap, and no wake is lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from batchgrader.core.home import Home

log = logging.getLogger("batchgrader")

#: s, the soonest a tick follows the one before, whatever is due (no busy loop)
TICK_FLOOR = 0.05
TICK_JOB = "tick"
#: s, the longest an idle daemon goes without a tick (its heartbeat, which systemd's watchdog
#: is fed on, stays fresh whatever ``poll_interval_seconds`` says)
TICK_CEILING = 60.0


@dataclass(frozen=True)
class TickOutcome:
    """What one tick leaves for the next: the earliest due time (monotonic; None: nothing waits on
    time), the monotonic time it was computed at, work due at once (``again``: a job stopped after
    an action ending its step) and whether a step failed (it is tried again soon)."""

    due: float | None
    mono: float
    again: bool = False
    failed: bool = False


@dataclass(frozen=True)
class TickPace:
    """How far apart ticks are: never closer than ``floor``; ``retry`` after a tick that left work
    undone (a step failed, or a time was still due after the tick that was run for it: the fixed
    tick period of before, half of ``poll_interval_seconds`` within 0.05-0.5 s); never further
    than ``ceiling`` (``poll_interval_seconds``, at most :data:`TICK_CEILING`: the configuration
    and the database file are looked at then, whatever the watcher saw)."""

    floor: float
    retry: float
    ceiling: float

    @classmethod
    def of(cls, poll_interval: float) -> TickPace:
        return cls(TICK_FLOOR, max(TICK_FLOOR, min(0.5, poll_interval / 2)), max(TICK_FLOOR, min(TICK_CEILING, poll_interval)))

    def delay(self, outcome: TickOutcome, overdue_before: bool) -> tuple[float, bool]:
        """Seconds until the next tick, and whether it is run for a time already due."""
        if outcome.again:
            return self.floor, False
        if outcome.failed:
            return self.retry, False
        if outcome.due is None:
            return self.ceiling, False
        wait = outcome.due - outcome.mono
        if wait <= 0:  # due already: at once, but a second time in a row only at the old pace
            return (self.retry if overdue_before else self.floor), True
        return max(self.floor, min(self.ceiling, wait)), False


class TickTimer:
    """The scheduler's one tick: an APScheduler date job (``max_instances=1``, coalesced) re-armed
    at the end of every tick at the time its :class:`TickOutcome` asks for
    (:meth:`TickPace.delay`), and re-armed to now by :meth:`wake` (the inbox watcher, a control
    file, a signal, a merge worker finishing).  A wake during a tick is kept and honoured when
    it ends, so ticks never overlap and no wake is lost; :attr:`count` is how many have run."""

    def __init__(self, scheduler: Any, tick: Callable[[], TickOutcome], pace: TickPace, stopped: Callable[[], bool]) -> None:
        self.scheduler = scheduler
        self.pace = pace
        self.count = 0
        self.next_delay: float = 0.0  # the wait the last tick armed (seconds)
        self._tick = tick
        self._stopped = stopped
        self._lock = threading.Lock()
        self._running = False
        self._woken = False
        self._overdue = False

    def run(self) -> None:
        """The job's function: one tick, then the next one armed."""
        with self._lock:
            self._running, self._woken = True, False
        outcome = TickOutcome(None, time.monotonic(), failed=True)
        try:
            outcome = self._tick()
        finally:
            with self._lock:
                self._running = False
                self.count += 1
                delay, self._overdue = self.pace.delay(outcome, self._overdue)
                if self._woken:
                    delay, self._overdue = self.pace.floor, False
                self.next_delay = delay
                self._arm(delay)
            log.debug("tick %d done: next in %.3f s", self.count, delay)

    def wake(self) -> None:
        """Tick now (after the running tick, if one runs)."""
        with self._lock:
            if self._running:
                self._woken = True
            else:
                self._arm(0.0)

    def ensure_armed(self) -> None:
        """Arm a tick now if none is armed and none runs (a re-arm refused by the scheduler)."""
        with self._lock:
            if not self._running and self.scheduler.get_job(TICK_JOB) is None:
                self._arm(0.0)

    def _arm(self, delay: float) -> None:
        if self._stopped():
            return
        self.scheduler.add_job(
            self.run,
            "date",
            run_date=datetime.now(UTC) + timedelta(seconds=delay),
            id=TICK_JOB,
            replace_existing=True,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )


def watch_control(observer: Any, home: Home, wake: threading.Event) -> None:
    """Have ``observer`` (the inbox watcher's) also wake the daemon for a request in ``control/``
    (`bgctl cancel`, `bgctl retry`): it is applied at once, not at the next due time.  (The home's
    own folder is not watched: every write of the database would wake the watcher's thread; an
    edit of the config files is seen at the next tick, or at once with SIGHUP.)"""
    from watchdog.events import FileSystemEventHandler

    from batchgrader.daemon.control import CONTROL_DIR

    class _Wake(FileSystemEventHandler):
        def on_any_event(self, event) -> None:  # noqa: ANN001
            if event.event_type not in ("opened", "closed_no_write"):
                wake.set()

    control = home.root / CONTROL_DIR
    control.mkdir(parents=True, exist_ok=True)
    observer.schedule(_Wake(), str(control), recursive=False)

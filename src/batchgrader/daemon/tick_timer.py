"""The daemon's timer: one APScheduler job runs the tick at the earliest time anything is due.

:class:`TickTimer` moves the job's next run after every tick to the wait :class:`TickPace`
derives from the tick's :class:`TickOutcome` (the due time of
:func:`batchgrader.core.due.next_due`, work due at once, a failed step), and to now when the
daemon is woken; :func:`watch_control` adds a request in ``control/`` to the wake-ups.  Ticks
never overlap, and no tick or wake is lost.
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
#: s, how much later than the ceiling a tick may come before the main loop starts one itself
TICK_LATE = 5.0
#: the scheduler's limit on runs of the tick job at once: out of reach (the timer keeps ticks from
#: overlapping; a run that finds one running returns at once)
RUNS_IN_FLIGHT = 64


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
    """The scheduler's one tick job, which lives as long as the timer: an APScheduler interval job
    every ``pace.ceiling`` (the heartbeat) whose next run time is moved (``modify_job``) to the
    time the last tick's :class:`TickOutcome` asks for (:meth:`TickPace.delay`) when it ends, and
    to now by :meth:`wake` (the inbox watcher, a control file, a signal, a merge worker finishing).

    No tick is lost, by construction rather than by timing:

    * the job is never removed (an interval trigger always has a next run time), so there is no
      add/remove of a date job to race with, and a misfire is never dropped
      (``misfire_grace_time=None``; coalesced);
    * ticks never overlap because of the timer's own flag, not the scheduler's instance count: a
      run that finds a tick running returns at once (that tick re-arms the job when it ends, from
      the state as it then is), and a :meth:`wake` during a tick is a flag the tick reads under
      the same lock as it re-arms, so it ticks again at once.  The scheduler's ``max_instances``
      is set out of reach: a run submitted before the last one's future was done (its count is
      decremented after the function returned) would otherwise be skipped, which lost a wake;
    * after :meth:`shutdown` no tick calls into the scheduler: ``BackgroundScheduler.shutdown``
      holds its job-store lock while it waits for a running job, so a tick re-arming the job then
      would wait for that lock for ever (the hang of a ``daemon --once`` ending with a tick in
      flight);
    * :meth:`check` (the main loop's, every pause) ticks at once if none ran for
      ``pace.ceiling + TICK_LATE`` seconds, and logs it: a lost timer costs at most that.

    :attr:`count` is how many ticks have run, :attr:`late` how many :meth:`check` had to start."""

    def __init__(self, scheduler: Any, tick: Callable[[], TickOutcome], pace: TickPace) -> None:
        self.scheduler = scheduler
        self.pace = pace
        self.count = 0
        self.late = 0
        self.next_delay: float = 0.0  # the wait the last tick armed (seconds)
        self._tick = tick
        self._lock = threading.Lock()
        self._running = False
        self._woken = False
        self._closed = False
        self._overdue = False
        self._last = time.monotonic()  # when the last tick ended (or the timer started)

    def start(self) -> None:
        """Add the job, its first tick at once, and start the scheduler."""
        self._add(datetime.now(UTC))
        self.scheduler.start()

    def _add(self, when: datetime) -> None:
        self.scheduler.add_job(
            self.run,
            "interval",
            seconds=self.pace.ceiling,
            next_run_time=when,
            id=TICK_JOB,
            replace_existing=True,
            max_instances=RUNS_IN_FLIGHT,
            coalesce=True,
            misfire_grace_time=None,
        )

    def shutdown(self) -> None:
        """No tick after this one re-arms the job; the scheduler stops once a running tick ended."""
        with self._lock:
            self._closed = True
        self.scheduler.shutdown(wait=True)

    def run(self) -> None:
        """The job's function: one tick, then the next one armed (at once when woken meanwhile)."""
        with self._lock:
            if self._closed or self._running:
                return  # a tick runs: it re-arms the job when it ends
            self._running, self._woken = True, False
        outcome = TickOutcome(None, time.monotonic(), failed=True)
        try:
            outcome = self._tick()
        finally:
            with self._lock:
                self._running = False
                self.count += 1
                self._last = time.monotonic()
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

    def check(self, mono: float) -> None:
        """Tick now if no tick ran for ``pace.ceiling + TICK_LATE`` seconds (``mono`` now) and none
        runs: the heartbeat, whatever became of the job's next run."""
        with self._lock:
            quiet = mono - self._last
            if self._running or self._closed or quiet <= self.pace.ceiling + TICK_LATE:
                return
            self.late += 1
            self._last = mono  # once per lateness, not at every pause
            self._arm(0.0)
        log.warning("no tick for %.1f s (the scheduler did not run the armed one): ticking now", quiet)

    def _arm(self, delay: float) -> None:
        """Move the job's next run (with the lock held); add the job again if it was removed."""
        from apscheduler.jobstores.base import JobLookupError

        if self._closed:
            return
        when = datetime.now(UTC) + timedelta(seconds=delay)
        try:
            self.scheduler.modify_job(TICK_JOB, next_run_time=when)
        except JobLookupError:
            log.warning("the tick's job was gone from the scheduler: added again")
            self._add(when)


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

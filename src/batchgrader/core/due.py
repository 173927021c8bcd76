"""When the daemon next has something to do on time: a pure rule over the state, the schedule,
the config and the clocks (no I/O).

The daemon's one loop runs the engine's tick, then waits until the time :func:`next_due`
returns (within the floor and the ceiling of :class:`TickPace`), not at a fixed interval: an idle
daemon sleeps until a batch's next poll, the end of a wait, or the next inbox rescan.  An
external change (an inbox file, a control file, a signal, a merge worker finishing) wakes it at
once.

A job for which :func:`batchgrader.core.decide.decide_job` has an action now is due now (a
batch read back as ended in its create reply, a download, a merge, a result to write, a cancel
asked for: whatever a tick left for the next one, say an action behind the stage it reached),
so the daemon never sleeps past work it knows of.  The rules act only once their times have
come (:class:`~batchgrader.core.actions.Timers`), so the times below are when they next will;
the inbox rescan is for files the watcher missed, never for work already known.

The times it reads, each only while the state still waits on it:

* ``schedule.next_poll``: a batch in flight (and so the round of ``batches.list`` serving them);
* an open intent (an upload or create whose outcome is unknown): at once, a create then at
  ``schedule.next_listing`` (its settle deadline);
* ``schedule.dup_next``: the duplicate watch of a chunk created again;
* ``schedule.not_before``: a refused chunk's resend; ``(job, OUTBOX_TIMER)``: a result file not
  written, tried again (on the wall clock, as :mod:`batchgrader.core.decide` compares it);
* ``schedule.download_failures``: a result file's download tried again;
* ``timers.merging``: a merge in a worker process that has run too long (it is stopped then);
* ``JobState.preflight_retry_at``: the preflight's backoff when the provider was unreachable (wall);
* a held job: the next UTC day, when daily budgets start again (wall);
* a synchronous route's Retry-After (``schedule.not_before[(job, ONLINE_TIMER)]``; after a restart
  the wall-clock ``retry_at`` its event recorded);
* a job with a ``deadline``: each threshold of :mod:`batchgrader.core.stragglers` still ahead (a
  running batch cancelled, an unsent chunk routed, the cutoff) (wall);
* the inbox (:class:`InboxTimes`, wall): a file found stable, the periodic rescan.

The answers store's retention needs no timer: expired answers are removed when answers are
stored (:func:`batchgrader.store.answers.put`) and never read past their retention.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from batchgrader.core.actions import ONLINE_TIMER, OUTBOX_TIMER, Step, Timers
from batchgrader.core.config import Config
from batchgrader.core.decide import decide_job
from batchgrader.core.schedule import Schedule
from batchgrader.core.state import JobState, State
from batchgrader.core.stragglers import deadline_thresholds

DAY = 86_400.0


@dataclass(frozen=True)
class InboxTimes:
    """The inbox's waits, on the wall clock: ``scan_requested`` (a change was seen: scan at once),
    ``stable_at`` (when a file seen changing can be found stable; None: none waits) and
    ``last_scan`` (the last full scan; the next is ``rescan_interval_seconds`` later)."""

    scan_requested: bool = False
    stable_at: float | None = None
    last_scan: float = float("-inf")


def next_due(
    state: State,
    schedule: Schedule,
    config: Config,
    wall: float,
    mono: float,
    inbox: InboxTimes | None = None,
    jobs: Iterable[str] | None = None,
    timers: Timers | None = None,
    queue_urls: Mapping[str, str] | None = None,
) -> float | None:
    """The earliest time, on the monotonic clock (``mono`` is now on it, ``wall`` now on the wall
    clock), at which anything waits to be done; None when nothing waits on time.  A time at or
    before ``mono`` means due now.  ``jobs``: the ids of the jobs the daemon takes further
    (default: every job in ``state``); jobs that ended, were rejected, are corrupt or left alone
    wait on nothing but the final effects a crash left undone.  ``timers``: what the rules read
    of ``schedule`` (default: its own, at ``mono``); ``queue_urls``: each job's queue (see
    :func:`~batchgrader.core.decide.decide_job`)."""
    ids = state.jobs.keys() if jobs is None else jobs
    timers = schedule.timers(mono) if timers is None else timers
    times: list[float] = []
    for job_id in ids:
        job = state.jobs.get(job_id)
        if job is None or job.rejected or job.corrupt or job.left_alone is not None:
            continue
        if acts_now(state, job_id, config, wall, timers, (queue_urls or {}).get(job_id, "")):
            times.append(mono)
        if job.ended:
            continue
        # what is due now is what the rules do now (above): a time passed here is a timer left
        # behind (a refused chunk's wait, once it was sent again), never work
        later = [*_job_monotonic(job, schedule, mono), *(at for (jid, _), at in timers.merging.items() if jid == job_id)]
        later += [mono + (t - wall) for t in (*_job_wall(job, schedule, wall), *deadline_thresholds(job, config))]
        times += [t for t in later if mono < t < float("inf")]
    if inbox is not None:
        times += [mono + (t - wall) for t in _inbox_wall(inbox, config, wall)]
    return min(times, default=None)


def acts_now(state: State, job_id: str, config: Config, wall: float, timers: Timers, queue_url: str = "") -> bool:
    """Whether :func:`~batchgrader.core.decide.decide_job` has an action for the job now (``wall``
    its ``now``; ``timers`` on the monotonic clock): the daemon then ticks at once."""
    return bool(decide_job(state, job_id, config, wall, timers, Step(), queue_url))


def _job_monotonic(job: JobState, schedule: Schedule, mono: float) -> Iterator[float]:
    """A job's waits kept on the monotonic clock (``mono``: now, for what is due at once)."""
    jid = job.job_id
    retry_after = schedule.not_before.get((jid, ONLINE_TIMER))
    if not job.online.done and retry_after is not None and retry_after > mono:
        yield retry_after  # a synchronous route's Retry-After
    for c in job.chunks.values():
        key = (jid, c.index)
        if c.in_flight and c.batch_id and key in schedule.next_poll:
            yield schedule.next_poll[key][0]
        if c.open_intent:  # reconciled at once, a create at its next listing while its outcome settles
            yield schedule.next_listing.get(key, mono) if c.open_intent == "create" else mono
        if c.dup_check_due and c.create == "done" and c.batch_id and not c.done and key in schedule.dup_next:
            yield schedule.dup_next[key]
        if not c.done and key in schedule.not_before:
            yield schedule.not_before[key]
        if not c.done:
            for kind in ("output", "error"):
                failed = schedule.download_failures.get((jid, c.index, kind))
                if failed is not None:
                    yield failed[1]


def _job_wall(job: JobState, schedule: Schedule, wall: float) -> Iterator[float]:
    """A job's waits kept on the wall clock."""
    if job.outbox != "done" and (job.job_id, OUTBOX_TIMER) in schedule.not_before:
        yield schedule.not_before[(job.job_id, OUTBOX_TIMER)]
    if not job.prepared and job.preflight == "unreachable" and job.preflight_retry_at is not None:
        yield job.preflight_retry_at
    retry_at = job.online.retry_at
    if not job.online.done and retry_at is not None and retry_at > wall and (job.job_id, ONLINE_TIMER) not in schedule.not_before:
        yield retry_at  # after a restart: the Retry-After its event recorded
    if job.held and not job.cancel_requested:
        yield (wall // DAY + 1) * DAY  # the next UTC midnight: a daily budget allows it again


def _inbox_wall(inbox: InboxTimes, config: Config, wall: float) -> Iterator[float]:
    """The inbox's waits on the wall clock."""
    if inbox.scan_requested:
        yield wall
    if inbox.stable_at is not None:
        yield inbox.stable_at
    # never scanned: at once
    yield wall if inbox.last_scan == float("-inf") else inbox.last_scan + config.default.rescan_interval_seconds


# --- the pace of the daemon's loop -------------------------------------------------------------------

#: s, the soonest a tick follows the one before, whatever is due (no busy loop)
TICK_FLOOR = 0.05
#: s, the longest an idle daemon goes without a tick (the configuration and the database file are
#: looked at then, whatever the watcher saw)
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
    undone (a step failed, or a time was still due after the tick that was run for it: half of
    ``poll_interval_seconds`` within 0.05-0.5 s); never further than ``ceiling``
    (``poll_interval_seconds``, at most :data:`TICK_CEILING`)."""

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

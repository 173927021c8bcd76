"""When the daemon ticks next: the earliest due time (core/due.py) through ``engine.tick(now)``
with a fake clock, the pace the daemon's timer keeps around it, and a real idle daemon that no
longer ticks at the old fixed rate."""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime

import pytest
from apscheduler.executors.pool import ThreadPoolExecutor

from batchgrader.core.config import load_config
from batchgrader.core.due import InboxTimes, next_due
from batchgrader.core.preflight_rules import preflight_delay
from batchgrader.core.schedule import Schedule
from batchgrader.core.state import State
from batchgrader.daemon.tick_timer import TICK_FLOOR, TICK_JOB, TICK_LATE, TickOutcome, TickPace, TickTimer
from harness import wait_for
from ticks import Rig

RESCAN = 30.0  # rescan_interval_seconds by default


@pytest.fixture
def rig(home):
    r = Rig(home)
    yield r
    r.close()


def test_an_idle_engine_is_due_only_at_its_next_inbox_rescan(rig):
    rig.tick()
    assert rig.engine.next_due(rig.now) == pytest.approx(rig.now + RESCAN)
    assert rig.tick(RESCAN - 1) == [] and rig.engine.next_due(rig.now) == pytest.approx(rig.now + 1)


def test_nothing_waits_on_time_without_an_inbox_or_a_job(home):
    config = load_config(home, environ={})
    assert next_due(State(), Schedule(), config, wall=5.0, mono=5.0) is None
    assert next_due(State(), Schedule(), config, 5.0, 5.0, InboxTimes(scan_requested=True)) == 5.0


def test_a_batch_in_flight_is_due_at_its_next_poll_and_polled_then_not_before(rig):
    job = rig.drop(3)
    rig.tick()  # uploaded and created: first poll FIRST_POLL_DELAY later
    due = rig.engine.next_due(rig.now)
    assert due == rig.engine.ctx.schedule.next_poll[(job.job_id, 0)][0] and rig.now < due < rig.now + 1
    before = rig.calls("retrieve") + rig.calls("list_batches")
    rig.tick(due - rig.now - 0.01)  # just before: no poll
    assert rig.calls("retrieve") + rig.calls("list_batches") == before
    rig.tick(0.01)  # at the due time: polled, and the next poll is later
    assert rig.calls("retrieve") + rig.calls("list_batches") == before + 1
    assert rig.engine.next_due(rig.now) > rig.now


def test_a_file_waiting_to_be_stable_is_due_when_it_can_be_found_so(home):
    rig = Rig(home, "stable_seconds: 3\n")
    rig.tick()
    (home.inbox / "a.csv").write_text("id,response\n0,fine\n")
    rig.engine.scan_requested = True  # what the inbox watcher does
    assert rig.engine.next_due(rig.now) == rig.now  # a change seen: scan at once
    rig.tick()  # first look
    assert rig.engine.next_due(rig.now) == pytest.approx(rig.now + 3)
    assert rig.tick(3)[:2] == ["JobAccepted", "JobPrepared"]
    rig.close()


def test_the_inbox_wait_on_the_wall_clock_is_put_on_the_monotonic_clock(home):
    rig = Rig(home, "stable_seconds: 3\n")
    (home.inbox / "a.csv").write_text("id,response\n0,fine\n")
    rig.engine.tick(1000.0, 50.0)  # wall 1000, monotonic 50: the file is first seen
    assert rig.engine.next_due(50.0, 1000.0) == pytest.approx(53.0)
    rig.close()


def test_an_unreachable_preflight_is_due_at_its_backoff(home):
    rig = Rig(home, "preflight_rows: 2\n")
    rig.provider.fail_next("complete", "unavailable")
    (home.inbox / "a.csv").write_text("id,response\n0,a\n1,b\n2,c\n")
    rig.tick()
    assert rig.tick()[-1] == "PreflightUnreachable"
    assert rig.engine.next_due(rig.now) == pytest.approx(rig.now + preflight_delay(1))
    rig.close()


def test_an_ended_job_waits_on_nothing_even_with_its_timers_left_behind(rig):
    job = rig.drop(3)
    rig.tick()
    rig.provider.finish_all()
    rig.tick(1)
    assert rig.engine.state.jobs[job.job_id].ended == "completed"
    rig.engine.ctx.schedule.next_poll[(job.job_id, 0)] = (rig.now - 100, 1.0)  # stale: never read
    rig.engine.ctx.schedule.not_before[(job.job_id, 0)] = rig.now - 100
    assert rig.engine.next_due(rig.now) == pytest.approx(rig.engine.steps.intake.times().last_scan + RESCAN)


def follow(rig: Rig, until: str, limit: int = 50) -> list[float]:
    """Tick only at the engine's due times (as the daemon does) until an event ``until``; the
    clock times of the ticks."""
    times = []
    for _ in range(limit):
        due = rig.engine.next_due(rig.now)
        assert due is not None and due > rig.now  # nothing left due by the tick before
        if until in rig.tick(due - rig.now):
            return [*times, rig.now]
        times.append(rig.now)
    raise AssertionError(f"no {until} after {limit} ticks at due times")


def test_a_create_refused_for_a_rate_limit_is_due_at_its_resend(rig):
    job = rig.drop(2)
    rig.provider.fail_next("create_batch", "refused", status_code=429, message="Rate limit reached", code="rate_limit_exceeded")
    assert rig.tick()[-1] == "BatchCreateFailed"
    resend = rig.engine.ctx.schedule.not_before[(job.job_id, 0)]
    assert rig.engine.next_due(rig.now) == resend
    assert follow(rig, "BatchCreated") == [resend]


def test_a_create_whose_outcome_is_unknown_is_listed_at_its_settle_times_then_sent_again(rig):
    rig.drop(2)
    rig.provider.fail_next("create_batch", "dropped")
    assert rig.tick()[-1] == "BatchCreateRequested"
    sent = rig.now
    times = follow(rig, "BatchCreated")
    # listed every few seconds, and created again only once absent is proven (120 s timeout + 3 s)
    assert times[-1] >= sent + 123 and all(b - a <= 5.0 + 1e-9 for a, b in zip([sent, *times], times))
    assert rig.calls("create_batch") == 2 and len(rig.provider.batches) == 1


def test_an_intent_left_open_by_a_failed_listing_is_due_at_once(rig):
    rig.drop(2)
    rig.provider.fail_next("create_batch", "lost")
    rig.provider.fail_next("find_batches", "unavailable")
    assert rig.tick()[-1] == "BatchCreateRequested" and rig.job().chunks[0].open_intent == "create"
    assert rig.engine.next_due(rig.now) <= rig.now  # the listing is tried again at the next tick
    assert rig.tick(0.05)[0] == "BatchCreated" and rig.calls("create_batch") == 1


def test_a_job_held_by_a_daily_limit_is_looked_at_again_at_the_next_utc_day(home):
    rig = Rig(home, "daily_token_limit: 10\nrescan_interval_seconds: 1000000\n")
    rig.drop(3)
    assert rig.tick() == ["JobHeld"]
    midnight = (rig.now // 86400 + 1) * 86400
    assert rig.engine.next_due(rig.now) == midnight  # a daily limit may allow it then
    rig.close()


# --- the timer's pace ------------------------------------------------------------------------------


def test_a_batch_of_a_job_with_a_deadline_is_due_when_its_straggler_cancel_is(home):
    from batchgrader.core.stragglers import MIN_MARGIN_SECONDS

    rig = Rig(home, "deadline: 1h\nmodel: gpt-4o-mini\nrescan_interval_seconds: 86400\n")
    try:
        job = rig.drop(3)
        rig.tick()
        (c,) = rig.job().chunks.values()
        assert c.in_flight
        cutoff = float(rig.job().deadline_at or 0.0) - MIN_MARGIN_SECONDS
        far = Schedule()
        far.next_poll[(job.job_id, c.index)] = (rig.now + 86_400.0, 3600.0)  # its next poll a day away
        state, config = rig.engine.state, rig.engine.config
        assert next_due(state, far, config, wall=rig.now, mono=rig.now) == pytest.approx(cutoff)  # the cancel's time
        assert next_due(state, far, config, wall=cutoff + 1, mono=cutoff + 1) == cutoff + 1  # passed, not sent: at once
        far.cancel_sent.add(str(c.batch_id))
        assert next_due(state, far, config, wall=cutoff + 1, mono=cutoff + 1) == pytest.approx(rig.now + 86_400.0)  # sent
        assert rig.tick(cutoff - rig.now).count("StragglerCancelRequested") == 1
    finally:
        rig.close()


def test_a_synchronous_route_waiting_for_retry_after_is_due_when_it_has_passed(home):
    rig = Rig(home, "route: online\nonline_concurrency: 1\nrescan_interval_seconds: 3600\n")
    try:
        (home.inbox / "a.csv").write_text("id,response\n0,a\n1,b\n")
        rig.provider.fail_next("complete", "refused", status_code=429, message="Rate limit reached", retry_after=40.0)
        rig.tick()
        rig.tick()
        assert rig.events("OnlineRequestFailed")
        assert rig.engine.next_due(rig.now) == pytest.approx(rig.now + 40.0, abs=1.5)
    finally:
        rig.close()


def test_the_pace_arms_the_next_tick_at_the_due_time_within_floor_and_ceiling():
    pace = TickPace.of(60.0)
    assert (pace.floor, pace.retry, pace.ceiling) == (TICK_FLOOR, 0.5, 60.0)
    assert pace.delay(TickOutcome(112.5, 100.0), False) == (12.5, False)
    assert pace.delay(TickOutcome(100.01, 100.0), False) == (TICK_FLOOR, False)  # never a busy loop
    assert pace.delay(TickOutcome(1000.0, 100.0), False) == (60.0, False)  # the ceiling
    assert pace.delay(TickOutcome(None, 100.0), False) == (60.0, False)  # nothing waits on time
    assert pace.delay(TickOutcome(1000.0, 100.0, again=True), False) == (TICK_FLOOR, False)  # work due now
    assert pace.delay(TickOutcome(1000.0, 100.0, failed=True), False) == (0.5, False)  # tried again soon
    assert TickPace.of(3600.0).ceiling == 60.0  # an idle daemon's heartbeat stays fresh


def test_a_time_still_due_after_its_tick_is_looked_at_again_only_at_the_old_pace():
    pace = TickPace.of(0.4)
    assert pace.retry == 0.2
    assert pace.delay(TickOutcome(99.0, 100.0), overdue_before=False) == (TICK_FLOOR, True)
    assert pace.delay(TickOutcome(99.0, 100.0), overdue_before=True) == (0.2, True)


# --- the timer on a real scheduler -----------------------------------------------------------------


class _Pool(ThreadPoolExecutor):
    """APScheduler's own thread pool, with two points a test can hold: the bookkeeping after a run
    (the scheduler's count of the job's running instances goes down only then, after the
    function returned) and the start of the pool's shutdown (the scheduler holds its job-store
    lock from there until the running jobs ended)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_bookkeeping = False
        self.in_bookkeeping = threading.Event()
        self.bookkeeping_may_end = threading.Event()
        self.shutting_down = threading.Event()

    def _run_job_success(self, job_id, events):
        if self.hold_bookkeeping:
            self.hold_bookkeeping = False
            self.in_bookkeeping.set()
            assert self.bookkeeping_may_end.wait(timeout=10)
        super()._run_job_success(job_id, events)

    def shutdown(self, wait=True):
        self.shutting_down.set()
        super().shutdown(wait)


@pytest.fixture
def timers():
    """Make TickTimers on real BackgroundSchedulers (each with a :class:`_Pool`); all are shut down
    at the end (with a bound: a deadlock fails the test, it does not hang it)."""
    from apscheduler.schedulers.background import BackgroundScheduler

    made: list[TickTimer] = []

    def make(tick) -> tuple[TickTimer, _Pool]:
        pool = _Pool()
        timer = TickTimer(BackgroundScheduler(executors={"default": pool}), tick, TickPace.of(60.0))
        made.append(timer)
        return timer, pool

    yield make
    for timer in made:
        if timer.scheduler.running:
            ender = threading.Thread(target=timer.shutdown, daemon=True)
            ender.start()
            ender.join(timeout=10)


def test_the_daemon_ticks_when_an_inbox_file_can_be_found_stable(home, timers):
    """The tick after a file's first look is armed at ``stable_seconds`` after it was seen, not at
    a fixed interval (and not a tick later)."""
    rig = Rig(home, "stable_seconds: 0.3\n")
    (home.inbox / "a.csv").write_text("id,response\n0,fine\n")
    ran: list[float] = []
    taken = threading.Event()

    def tick() -> TickOutcome:
        ran.append(time.monotonic())
        rig.engine.tick(time.time(), time.monotonic())
        if rig.engine.state.jobs:
            taken.set()
        return TickOutcome(rig.engine.next_due(time.monotonic(), time.time()), time.monotonic(), again=rig.engine.again)

    timer, _ = timers(tick)
    timer.start()
    assert taken.wait(timeout=10)
    assert len(ran) == 2 and ran[1] - ran[0] >= 0.29  # the first look, then the tick that takes it
    timer.shutdown()
    rig.close()


def test_a_wake_during_a_tick_is_kept_and_ticks_never_overlap(timers):
    started, release, second = threading.Event(), threading.Event(), threading.Event()
    running: list[int] = []
    seen: list[int] = []

    def tick() -> TickOutcome:
        running.append(1)
        seen.append(len(running))
        started.set()
        if len(seen) == 1:
            assert release.wait(timeout=10)
        else:
            second.set()
        running.pop()
        return TickOutcome(None, time.monotonic())  # nothing due: the next at the ceiling

    timer, _ = timers(tick)
    timer.start()
    assert started.wait(timeout=10)
    for _ in range(3):
        timer.wake()  # while the first tick runs
    release.set()
    assert second.wait(timeout=10)  # the wakes were kept: one more tick, at once
    assert seen == [1, 1]  # never two at once
    wait_for(lambda: timer.count == 2, timeout=10, what="the second tick to end")
    assert timer.next_delay == 60.0 and timer.scheduler.get_job(TICK_JOB) is not None


def test_a_wake_just_after_a_tick_ended_is_not_skipped_by_the_scheduler(timers):
    """The lost tick: a tick's function has returned, but the scheduler counts it as running until
    the pool's bookkeeping for it ends.  A wake then moves the job to now; with the scheduler's
    ``max_instances=1`` that run was skipped ("maximum number of running instances reached") and
    the wake lost until the next heartbeat."""
    ran = threading.Semaphore(0)

    def tick() -> TickOutcome:
        ran.release()
        return TickOutcome(None, time.monotonic())  # nothing due: the next at the ceiling, a minute on

    timer, pool = timers(tick)
    pool.hold_bookkeeping = True
    timer.start()
    assert ran.acquire(timeout=10) and pool.in_bookkeeping.wait(timeout=10)  # the first tick ended; its count not yet
    timer.wake()
    assert ran.acquire(timeout=10)  # the wake's tick ran
    pool.bookkeeping_may_end.set()


def test_shutting_the_timer_down_with_a_tick_in_flight_ends(timers):
    """The hang of a ``daemon --once`` that ended while a tick ran: the scheduler's shutdown holds
    its job-store lock while it waits for the running tick, and that tick, ending, re-armed the job
    through the same lock.  After :meth:`TickTimer.shutdown` no tick calls into the scheduler."""
    started = threading.Event()

    def tick() -> TickOutcome:
        started.set()
        assert pool.shutting_down.wait(timeout=10)  # ends only once the shutdown holds the lock
        return TickOutcome(None, time.monotonic())

    timer, pool = timers(tick)
    timer.start()
    assert started.wait(timeout=10)
    ender = threading.Thread(target=timer.shutdown, daemon=True)
    ender.start()
    ender.join(timeout=20)
    assert not ender.is_alive(), "the shutdown and the ending tick wait for each other"
    assert timer.count == 1


def test_a_lost_job_costs_at_most_the_heartbeat_and_is_logged(timers, caplog):
    """Whatever became of the job (here: removed), the main loop's :meth:`TickTimer.check` ticks
    once no tick ran for ``ceiling + TICK_LATE`` seconds, and says so."""
    ran = threading.Semaphore(0)

    def tick() -> TickOutcome:
        ran.release()
        return TickOutcome(None, time.monotonic())

    timer, _ = timers(tick)
    timer.start()
    assert ran.acquire(timeout=10)
    wait_for(lambda: timer.count == 1, what="the first tick to end")
    timer.scheduler.remove_job(TICK_JOB)
    timer.check(time.monotonic())  # not late yet
    assert timer.late == 0 and not ran.acquire(timeout=0)
    timer.check(time.monotonic() + timer.pace.ceiling + TICK_LATE + 1)
    assert ran.acquire(timeout=10) and timer.late == 1
    assert "no tick for" in caplog.text and "added again" in caplog.text


# --- a real daemon ---------------------------------------------------------------------------------

TICK_LINE = re.compile(r"^(\S+ \S+) DEBUG batchgrader: tick (\d+) done: next in ([\d.]+) s$", re.M)


def _ticks(home) -> list[tuple[float, int, float]]:
    """(log time, tick number, seconds to the next) of each tick in the daemon's log."""
    log = home.logs / "daemon.log"
    text = log.read_text(encoding="utf-8") if log.exists() else ""
    return [(datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(n), float(s)) for t, n, s in TICK_LINE.findall(text)]


@pytest.mark.slow  # a real daemon process
def test_an_idle_daemon_ticks_at_its_due_times_not_at_the_old_fixed_rate(home):
    from harness import outbox_files, start_daemon

    # the old fixed tick period for this config: half of poll_interval_seconds, at most 0.5 s
    home.config_file.write_text("log_level: DEBUG\npoll_interval_seconds: 2\nstable_seconds: 0.05\npreflight_rows: 0\n")
    proc = start_daemon(home.root, None, "--sandbox")
    try:

        def idle_pair():
            ts = _ticks(home)
            return next(((a, b) for a, b in zip(ts, ts[1:]) if a[2] >= 1.9 and b[1] == a[1] + 1), None)

        (armed, ran) = wait_for(idle_pair, timeout=60, what="a tick armed 2 s ahead, and the tick after it")
        assert ran[0] - armed[0] >= 1.5  # not half a second later, as at the old fixed rate
        (home.inbox / "a.csv").write_text("id,response\n0,fine\n1,good\n")  # the watcher wakes it
        wait_for(lambda: outbox_files(home.root), timeout=60, what="the result")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0


@pytest.mark.slow  # a real daemon process
def test_a_control_request_wakes_an_idle_daemon_at_once(home):
    """Nothing is due for a minute (poll_interval_seconds and the rescan far off): a request in
    ``control/`` is applied at once, because it wakes the daemon."""
    from batchgrader.daemon.control import request_control
    from harness import start_daemon

    log = home.logs / "daemon.log"
    home.config_file.write_text("log_level: DEBUG\npoll_interval_seconds: 600\nrescan_interval_seconds: 600\n")
    proc = start_daemon(home.root, None, "--sandbox")
    try:
        wait_for(lambda: [t for t in _ticks(home) if t[2] >= 59], timeout=60, what="an idle tick armed a minute ahead")
        path = request_control(home, "cancel", "no-such-job")
        wait_for(lambda: not path.exists() and "set aside" in log.read_text(), timeout=20, what="the request applied")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0

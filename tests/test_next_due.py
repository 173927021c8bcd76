"""When the daemon ticks next: the earliest due time (core/rules/due.py) through ``engine.tick(now)``
with a fake clock, the pace the daemon's loop keeps around it, the loop itself, and a real idle
daemon that no longer ticks at the old fixed rate."""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.core.log.state import State
from batchgrader.core.rules.due import TICK_FLOOR, InboxTimes, TickOutcome, TickPace, next_due
from batchgrader.core.rules.preflight_rules import preflight_delay
from batchgrader.core.rules.schedule import Schedule
from batchgrader.daemon.process import Daemon
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
    assert rig.engine.ctx.state.jobs[job.job_id].ended == "completed"
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


# --- the loop's pace ------------------------------------------------------------------------------


def test_a_batch_of_a_job_with_a_deadline_is_due_when_its_straggler_cancel_is(home):
    from batchgrader.core.rules.stragglers import MIN_MARGIN_SECONDS

    rig = Rig(home, "deadline: 1h\nmodel: gpt-5.4-mini\nrescan_interval_seconds: 86400\n")
    try:
        job = rig.drop(3)
        rig.tick()
        (c,) = rig.job().chunks.values()
        assert c.in_flight
        cutoff = float(rig.job().deadline_at or 0.0) - MIN_MARGIN_SECONDS
        far = Schedule()
        far.next_poll[(job.job_id, c.index)] = (rig.now + 86_400.0, 3600.0)  # its next poll a day away
        state, config = rig.engine.ctx.state, rig.engine.ctx.config
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


# --- the daemon's one loop --------------------------------------------------------------------------


class _Notifier:
    def watchdog_interval(self) -> None:
        return None

    def status(self, line: str) -> None:
        pass


def _loop(home, ticks: list, stop_after: int, outcome) -> tuple[Daemon, threading.Thread]:  # noqa: ANN001
    """A daemon's main loop over a scripted tick (``outcome(n)``: what the n-th tick returns), in a
    thread; each tick's monotonic time goes in ``ticks``; the loop is stopped after ``stop_after``."""
    daemon = Daemon(home)
    engine = SimpleNamespace(scan_requested=False, idle=False)

    def tick() -> TickOutcome:
        ticks.append(time.monotonic())
        if len(ticks) >= stop_after:
            daemon.stop.set()
        return outcome(len(ticks), daemon, engine)

    thread = threading.Thread(target=daemon._main_loop, args=(engine, _Notifier(), tick, TickPace.of(60.0)), daemon=True)
    thread.start()
    return daemon, thread


def test_the_loop_waits_until_the_next_due_time(home):
    ticks: list[float] = []
    _, thread = _loop(home, ticks, 3, lambda n, d, e: TickOutcome(time.monotonic() + 0.3, time.monotonic()))
    thread.join(timeout=20)
    assert len(ticks) == 3 and all(b - a >= 0.29 for a, b in zip(ticks, ticks[1:]))


def test_a_wake_during_a_tick_is_kept_and_scans_the_inbox(home):
    """A wake-up that comes while a tick runs (the watcher saw a file) is not lost: the loop ticks
    again at once, with an inbox scan, though nothing is due for a minute."""
    ticks: list[float] = []
    seen: list[bool] = []

    def outcome(n: int, daemon: Daemon, engine: SimpleNamespace) -> TickOutcome:
        seen.append(engine.scan_requested)
        if n == 1:
            daemon.wake.set()
        return TickOutcome(None, time.monotonic())  # nothing due: the next at the ceiling

    _, thread = _loop(home, ticks, 2, outcome)
    thread.join(timeout=20)
    assert not thread.is_alive() and len(ticks) == 2 and ticks[1] - ticks[0] < 10
    assert seen == [False, True]


def test_a_stop_during_the_wait_ends_the_loop_at_once(home):
    ticks: list[float] = []
    daemon, thread = _loop(home, ticks, 99, lambda n, d, e: TickOutcome(None, time.monotonic()))
    wait_for(lambda: ticks, timeout=10, what="the first tick")
    daemon.stop.set()
    daemon.wake.set()  # what the signal handler does
    thread.join(timeout=10)
    assert not thread.is_alive() and len(ticks) == 1


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
    from batchgrader.core.host.control_files import request_control
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

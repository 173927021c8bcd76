"""The cron schedule's pure decision, ticked on a fake clock: the daemon records each time it runs
(here: the list ``recorded``), and a restart or a second daemon reads the same record."""

from __future__ import annotations

from datetime import UTC, datetime

from batchgrader.core.cron import CronSchedule, check, decide

NIGHTLY = CronSchedule("nightly-eval", "0 2 * * *")


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


class Daemon:
    """The daemon's side, as the wiring will do it: decide, record the time, then run."""

    def __init__(self, schedule: CronSchedule, recorded: list[float], since: float):
        self.schedule, self.recorded, self.since = schedule, recorded, since
        self.runs: list[float] = []

    def tick(self, now: float) -> None:
        d = decide(self.schedule, self.recorded[-1] if self.recorded else None, self.since, now)
        if d.run is not None and (not self.recorded or d.run > self.recorded[-1]):  # the append's expected version
            self.recorded.append(d.run)
            self.runs.append(d.run)


def test_runs_each_time_once_however_often_it_ticks():
    d = Daemon(NIGHTLY, [], since=ts("2026-11-28T12:00:00"))
    for hour in range(0, 72):
        for minute in (0, 1, 30):
            d.tick(ts("2026-11-28T12:00:00") + hour * 3600 + minute * 60)
    assert d.runs == [ts("2026-11-29T02:00:00"), ts("2026-11-30T02:00:00"), ts("2026-12-01T02:00:00")]


def test_a_new_schedule_does_not_run_its_past_times():
    assert decide(NIGHTLY, None, since=ts("2026-11-28T12:00:00"), now=ts("2026-11-28T12:00:01")).run is None


def test_times_missed_while_down_run_once_the_latest():
    recorded = [ts("2026-11-25T02:00:00")]
    d = decide(NIGHTLY, recorded[-1], since=ts("2026-11-01T00:00:00"), now=ts("2026-11-28T09:00:00"))
    assert d.run == ts("2026-11-28T02:00:00")
    assert d.skipped == (ts("2026-11-26T02:00:00"), ts("2026-11-27T02:00:00"))
    assert d.next_due == ts("2026-11-29T02:00:00")


def test_a_restart_does_not_run_a_recorded_time_again():
    recorded: list[float] = []
    first = Daemon(NIGHTLY, recorded, since=ts("2026-11-28T00:00:00"))
    first.tick(ts("2026-11-28T02:00:05"))
    again = Daemon(NIGHTLY, recorded, since=ts("2026-11-28T00:00:00"))  # restarted: reads the same record
    again.tick(ts("2026-11-28T02:00:06"))
    assert first.runs == [ts("2026-11-28T02:00:00")] and again.runs == []


def test_two_daemons_share_the_record_and_run_a_time_once():
    recorded: list[float] = []
    a = Daemon(NIGHTLY, recorded, since=ts("2026-11-28T00:00:00"))
    b = Daemon(NIGHTLY, recorded, since=ts("2026-11-28T00:00:00"))
    for now in (ts("2026-11-28T02:00:01"), ts("2026-11-28T02:00:02"), ts("2026-11-29T02:00:01")):
        a.tick(now)
        b.tick(now)
    assert sorted(a.runs + b.runs) == [ts("2026-11-28T02:00:00"), ts("2026-11-29T02:00:00")]


def test_grace_skips_a_run_missed_too_long_ago():
    late = CronSchedule("x", "0 2 * * *", grace_seconds=3600)
    d = decide(late, ts("2026-11-27T02:00:00"), since=0, now=ts("2026-11-28T05:00:00"))
    assert d.run is None and d.skipped == (ts("2026-11-28T02:00:00"),)
    d = decide(late, ts("2026-11-27T02:00:00"), since=0, now=ts("2026-11-28T02:30:00"))
    assert d.run == ts("2026-11-28T02:00:00")


def test_time_zone_and_bad_expressions():
    paris = CronSchedule("p", "0 2 * * *", timezone="Europe/Paris")
    d = decide(paris, None, since=ts("2026-11-28T00:00:00"), now=ts("2026-11-28T01:00:01"))
    assert d.run == ts("2026-11-28T01:00:00")  # 02:00 in Paris is 01:00 UTC in November
    assert check("0 2 * * *") is None
    assert "cron" in (check("every night") or "")

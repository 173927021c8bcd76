"""The cron schedule's pure decision, ticked on a fake clock: the daemon records each time it runs
(here: the list ``recorded``), and a restart or a second daemon reads the same record."""

from __future__ import annotations

from datetime import UTC, datetime

from batchgrader.core.rules.cron import CronSchedule, check, decide

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


# --- a profile's schedule through the engine (in-memory provider, fake clock) ----------------------

import pytest  # noqa: E402

from batchgrader.core.configuration.config import ConfigError, load_config  # noqa: E402
from batchgrader.core.host.home import Home  # noqa: E402
from batchgrader.core.rules.cron import next_fire, scheduled_job_id  # noqa: E402
from batchgrader.daemon.engine import Engine  # noqa: E402
from batchgrader.daemon.steps.evals import ScheduleStep  # noqa: E402
from batchgrader.pipeline.pricing import load_pricing  # noqa: E402
from batchgrader.provider.memory import MemoryProvider  # noqa: E402
from batchgrader.store.eventstore import EventStore  # noqa: E402
from ticks import Rig  # noqa: E402

SCHEDULED = "profiles:\n  nightly:\n    schedule: '0 2 * * *'\n    schedule_source: data/reviews.csv\n"
T0 = ts("2026-11-28T12:00:00")


def scheduled_rig(home: Home) -> tuple[Rig, ScheduleStep]:
    (home.root / "data").mkdir(exist_ok=True)
    (home.root / "data" / "reviews.csv").write_text("id,response\n1,good\n2,bad\n")
    rig = Rig(home, SCHEDULED)
    rig.now = rig.provider.now = T0
    return rig, rig.engine.steps.schedules


def at(rig: Rig, step: ScheduleStep, when: float) -> int:
    """A tick at ``when`` (the engine runs the schedule step first); the jobs the step started."""
    rig.now = rig.provider.now = when
    rig.engine.tick(when)
    return step.started


def second_daemon(home: Home, other: Home) -> tuple[Engine, ScheduleStep, EventStore]:
    """A daemon of another home sharing the same event log (as PostgreSQL lets several do)."""
    other.ensure()
    other.config_file.write_text(home.config_file.read_text())
    (other.root / "data").mkdir(exist_ok=True)
    (other.root / "data" / "reviews.csv").write_text((home.root / "data" / "reviews.csv").read_text())
    store = EventStore(home.db)
    engine = Engine(other, load_config(other, environ={}), store, MemoryProvider(), load_pricing())
    return engine, engine.steps.schedules, store


def test_a_profile_runs_at_its_times_as_a_normal_job_once_each(home):
    rig, step = scheduled_rig(home)
    try:
        assert at(rig, step, T0) == 0  # first seen at noon: the 02:00 before is not run
        assert next_fire(rig.engine.ctx.config, T0) == ts("2026-11-29T02:00:00")
        assert at(rig, step, ts("2026-11-29T01:59:59")) == 0
        assert at(rig, step, ts("2026-11-29T02:00:01")) == 1
        assert at(rig, step, ts("2026-11-29T02:00:02")) == 0
        (started,) = rig.events("ScheduledRunStarted")
        assert started["scheduled_for"] == ts("2026-11-29T02:00:00") and started["missed"] == []
        job = rig.engine.ctx.state.jobs[scheduled_job_id("nightly", started["scheduled_for"], started["source"])]
        assert job.profile == "nightly" and job.file == "reviews.csv"
        assert (home.root / "data" / "reviews.csv").is_file()  # copied, not moved
        for _ in range(30):
            rig.tick()
            rig.provider.finish_all()
        assert job.ended == "completed" and (home.outbox / "reviews_results.csv").is_file()
        # a restart the same day runs nothing; the next night runs once more
        rig.close()
        rig, step = scheduled_rig(home)
        assert at(rig, step, ts("2026-11-29T03:00:00")) == 0
        assert at(rig, step, ts("2026-11-30T02:00:00")) == 1
        assert len(rig.events("ScheduledRunStarted")) == 2
    finally:
        rig.close()


def test_nights_missed_while_no_daemon_ran_run_once(home):
    rig, step = scheduled_rig(home)
    try:
        at(rig, step, T0)
        assert at(rig, step, ts("2026-11-29T02:00:01")) == 1
        rig.close()
        rig, step = scheduled_rig(home)  # three nights later
        assert at(rig, step, ts("2026-12-02T09:00:00")) == 1
        assert at(rig, step, ts("2026-12-02T09:00:01")) == 0
        last = rig.events("ScheduledRunStarted")[-1]
        assert last["scheduled_for"] == ts("2026-12-02T02:00:00")
        assert last["missed"] == [ts("2026-11-30T02:00:00"), ts("2026-12-01T02:00:00")]
    finally:
        rig.close()


def test_a_second_daemon_on_the_same_log_never_runs_a_time_again(home, tmp_path):
    rig, step = scheduled_rig(home)
    engine2, step2, store2 = second_daemon(home, Home(tmp_path / "other"))
    try:
        step2.run(T0)
        at(rig, step, T0)
        assert at(rig, step, ts("2026-11-29T02:00:01")) == 1
        # the second daemon has not read the first one's events: its append of the same time is refused
        assert step2.run(ts("2026-11-29T02:00:03")) == 0
        assert not any((tmp_path / "other" / "work").iterdir())  # its claim removed
        assert len(rig.events("ScheduledRunStarted")) == 1 and len(rig.events("JobAccepted")) == 1
    finally:
        store2.close()
        rig.close()


def test_killed_after_the_claim_the_time_is_recorded_on_the_recovered_job(home):
    rig, step = scheduled_rig(home)
    try:
        at(rig, step, T0)
        when = ts("2026-11-29T02:00:00")
        src = str(home.root / "data" / "reviews.csv")
        job_id = scheduled_job_id("nightly", when, src)
        from batchgrader.pipeline.scheduled import claim_copy

        # the daemon died after claiming the file, before its events were appended
        claim_copy(home, job_id, home.root / "data" / "reviews.csv", {"file": "reviews.csv", "source": src, "profile": "nightly"})
        rig.close()
        rig, step = scheduled_rig(home)
        rig.engine.startup(ts("2026-11-29T02:00:05"))  # the start-up recovery accepts the claimed input
        assert at(rig, step, ts("2026-11-29T02:00:06")) == 0
        assert [e["scheduled_for"] for e in rig.events("ScheduledRunStarted")] == [when]
        assert len(rig.events("JobAccepted")) == 1
        assert at(rig, step, ts("2026-11-29T02:00:07")) == 0 and len(rig.events("ScheduledRunStarted")) == 1
    finally:
        rig.close()


def test_a_schedule_is_checked_when_the_configuration_loads(home):
    home.config_file.write_text(
        "profiles:\n  a:\n    schedule: '0 2 * * *'\n  b:\n    schedule: '0 25 * * *'\n    schedule_source: x.csv\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(home, environ={})
    text = str(err.value)
    assert "profiles.a: key 'schedule' needs 'schedule_source'" in text
    assert "profiles.b: key 'schedule' must be a five-field cron expression" in text and "higher than the maximum" in text


def test_the_daemon_wakes_for_the_next_scheduled_time(home):
    """The engine's next due time includes the schedule's next fire time (the loop waits on it),
    on the monotonic clock: a daemon idle at noon wakes at 02:00 with nothing else due."""
    rig, step = scheduled_rig(home)
    try:
        at(rig, step, T0)
        mono = 500.0  # any monotonic origin: the wait is the wall-clock distance to the fire time
        due = rig.engine.next_due(mono, T0, inbox=False)
        assert due == pytest.approx(mono + (ts("2026-11-29T02:00:00") - T0))
    finally:
        rig.close()

"""A whole imported eval on a schedule (issue 34, point 5): at each time a new run of the eval over
its source's items, a normal job with its own results; never twice for one time (a restart, a
second daemon on the same log), the nights missed while no daemon ran run once (the latest).
Ticked through the engine with the in-memory provider and a fake clock; the same end to end
through a real daemon subprocess is ``test_a_scheduled_eval_runs_in_a_real_daemon`` (slow)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.core.rules.cron import scheduled_job_id
from batchgrader.daemon.engine import Engine
from batchgrader.evals import importer
from batchgrader.pipeline.evals import runs
from batchgrader.pipeline.evals.spec import EvalInputError
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.memory import MemoryProvider
from batchgrader.store.eventstore import EventStore
from ticks import Rig

FIX = Path(__file__).parent / "fixtures" / "evals"
NIGHTLY = "0 2 * * *"


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


T0 = ts("2026-11-28T12:00:00")


def answer(cid: str, body) -> str:
    crit = cid.split("-s")[0].split("-c")[1]
    return json.dumps({"result": "polite" if crit == "3" else 6})


def import_scheduled(home: Home, source: str = "data/items.jsonl") -> None:
    (home.root / "data").mkdir(exist_ok=True)
    shutil.copy(FIX / "ticket_items.jsonl", home.root / "data" / "items.jsonl")
    prepared = importer.prepare_import(
        home,
        FIX / "ticket_eval.json",
        data_path=FIX / "ticket_items.jsonl",
        name="tickets",
        schedule=NIGHTLY,
        schedule_source=source,
    )
    importer.install(home, prepared, lambda: load_config(home, environ={}))


def rig_of(home: Home) -> Rig:
    """A daemon (the engine) of the home as the import left it (its eval profiles kept)."""
    config = home.config_file.read_text()
    rig = Rig(home)
    home.config_file.write_text(config)
    rig.engine.reload(load_config(home, environ={}), load_pricing())
    rig.provider.answer = answer
    return rig


def at(rig: Rig, when: float) -> int:
    rig.now = rig.provider.now = when
    rig.engine.tick(when)
    return rig.engine.steps.schedules.started


def run_to_end(rig: Rig) -> None:
    for _ in range(40):
        rig.tick()
        rig.provider.finish_all()
        if all(j.ended for j in rig.engine.ctx.state.jobs.values()) and not any(rig.home.inbox.rglob("*.jsonl")):
            rig.tick()
            return
    raise AssertionError("the jobs did not end")


def test_an_eval_runs_again_at_each_time_as_a_normal_job_with_its_own_results(home):
    import_scheduled(home)
    rig = rig_of(home)
    try:
        assert at(rig, T0) == 0  # first seen at noon: the 02:00 before is not run
        run_to_end(rig)  # the import's own run
        assert (home.outbox / "tickets_run.json").is_file()
        assert at(rig, ts("2026-11-29T02:00:01")) == 1  # the eval's one model job
        assert at(rig, ts("2026-11-29T02:00:02")) == 0
        (started,) = rig.events("ScheduledRunStarted")
        assert started["schedule"] == "eval:tickets" and started["scheduled_for"] == ts("2026-11-29T02:00:00")
        job = rig.engine.ctx.state.jobs[scheduled_job_id("eval:tickets", started["scheduled_for"], started["source"])]
        assert job.profile.startswith("eval-") and job.file == "tickets-20261129T0200Z-j1.jsonl"
        run_to_end(rig)
        run = json.loads((home.outbox / "tickets-20261129T0200Z_run.json").read_text())
        assert run["result_counts"]["total"] == 4 and run["status"] == "completed"
        # the same items as the import's run: every answer is a stored one, nothing is paid again
        assert run["per_model_usage"][0]["invocation_count"] == 0
        # a restart the same day runs nothing; the next night runs once more
        rig.close()
        rig = rig_of(home)
        assert at(rig, ts("2026-11-29T03:00:00")) == 0
        assert at(rig, ts("2026-11-30T02:00:00")) == 1
        assert [e["scheduled_for"] for e in rig.events("ScheduledRunStarted")] == [
            ts("2026-11-29T02:00:00"),
            ts("2026-11-30T02:00:00"),
        ]
    finally:
        rig.close()


def test_nights_missed_while_no_daemon_ran_run_once_the_latest(home):
    import_scheduled(home)
    rig = rig_of(home)
    try:
        at(rig, T0)
        assert at(rig, ts("2026-11-29T02:00:01")) == 1
        rig.close()
        rig = rig_of(home)  # three nights later
        assert at(rig, ts("2026-12-02T09:00:00")) == 1
        assert at(rig, ts("2026-12-02T09:00:01")) == 0
        last = rig.events("ScheduledRunStarted")[-1]
        assert last["scheduled_for"] == ts("2026-12-02T02:00:00")
        assert last["missed"] == [ts("2026-11-30T02:00:00"), ts("2026-12-01T02:00:00")]
        assert runs.run_name("tickets", last["scheduled_for"]) in [p.name for p in (home.root / "evals").iterdir()]
    finally:
        rig.close()


def test_a_second_daemon_on_the_same_log_never_runs_a_time_again(home):
    import_scheduled(home)
    rig = rig_of(home)
    store2 = EventStore(home.db)
    engine2 = Engine(home, load_config(home, environ={}), store2, MemoryProvider(), load_pricing())
    try:
        engine2.steps.schedules.run(T0)
        at(rig, T0)
        assert at(rig, ts("2026-11-29T02:00:01")) == 1
        # the second daemon has not read the first one's events: its append of the same time is refused
        assert engine2.steps.schedules.run(ts("2026-11-29T02:00:03")) == 0
        assert len(rig.events("ScheduledRunStarted")) == 1
        assert len([e for e in rig.events("JobAccepted") if e["file"].startswith("tickets-2026")]) == 1
    finally:
        store2.close()
        rig.close()


def test_items_the_eval_cannot_grade_are_reported_and_nothing_is_sent(home):
    import_scheduled(home)
    bad = (home.root / "data" / "items.jsonl").read_text().replace('"category": "', '"category": "X-', 1)
    (home.root / "data" / "items.jsonl").write_text(bad)
    rig = rig_of(home)
    try:
        at(rig, T0)
        run_to_end(rig)
        assert at(rig, ts("2026-11-29T02:00:01")) == 0
        problems = json.loads((home.outbox / "tickets-20261129T0200Z_problems.json").read_text())["problems"]
        assert problems[0]["field"] == "items" and "item_schema" in problems[0]["problem"] and problems[0]["fix"]
        assert rig.events("ScheduledRunStarted") == []
        shutil.copy(FIX / "ticket_items.jsonl", home.root / "data" / "items.jsonl")  # corrected: the time runs
        assert at(rig, ts("2026-11-29T02:10:00")) == 1
    finally:
        rig.close()


def test_a_schedule_is_checked_at_import(home):
    with pytest.raises(EvalInputError) as exc:
        importer.prepare_import(
            home,
            FIX / "ticket_eval.json",
            data_path=FIX / "ticket_items.jsonl",
            name="x",
            schedule="0 25 * * *",
            schedule_source="items.jsonl",
        )
    assert [p.where for p in exc.value.problems] == ["--schedule"]
    with pytest.raises(EvalInputError) as exc:
        importer.prepare_import(home, FIX / "ticket_eval.json", data_path=FIX / "ticket_items.jsonl", name="x", schedule=NIGHTLY)
    assert [p.where for p in exc.value.problems] == ["--schedule-source"]


# --- end to end: a real daemon subprocess (the sandbox), a schedule due within the test -------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_scheduled_eval_runs_in_a_real_daemon(tmp_path):
    from harness import FAST_CONFIG, bgctl, events_of, start_daemon, wait_for

    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    shutil.copy(FIX / "ticket_items.jsonl", home / "data" / "items.jsonl")
    (home / "config.yaml").write_text(FAST_CONFIG)
    done = bgctl(
        home,
        "evals",
        "import",
        str(FIX / "ticket_eval.json"),
        "--data",
        str(FIX / "ticket_items.jsonl"),
        "--name",
        "tickets",
        "--schedule",
        "* * * * *",
        "--schedule-source",
        "data/items.jsonl",
        key=None,
    )
    assert done.returncode == 0, done.stderr
    daemon = start_daemon(home, None, "--sandbox", key=None)
    try:
        # every minute: the next whole minute is the first time this daemon runs
        wait_for(lambda: list((home / "outbox").glob("tickets-*_run.json")), timeout=150, what="a scheduled run's results")
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    (first,) = events_of(home, "ScheduledRunStarted")[:1]
    run_file = home / "outbox" / f"{runs.run_name('tickets', first['scheduled_for'])}_run.json"
    assert json.loads(run_file.read_text())["result_counts"]["total"] == 4
    # restarted (to the end of its work, --once): the time it ran is never run again
    again = bgctl(home, "daemon", "--sandbox", "--once", key=None, timeout=180)
    assert again.returncode == 0, again.stderr
    times = [e["scheduled_for"] for e in events_of(home, "ScheduledRunStarted")]
    assert len(times) == len(set(times)) and first["scheduled_for"] in times

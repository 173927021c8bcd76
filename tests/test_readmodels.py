"""Read models (job_status, usage, projection_state), the bgctl queries over them, their
rendering, and docs/events.md against the event catalogue."""

from __future__ import annotations

import dataclasses
import json
import queue
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from batchgrader.cli.render_costs import bar, render_costs
from batchgrader.cli.render_events import render_events
from batchgrader.cli.render_job import render_job
from batchgrader.cli.render_status import render_status
from batchgrader.core.host.home import Home
from batchgrader.core.log.schema import EVENTS, EVENTS_DDL
from batchgrader.core.log.state import fold
from batchgrader.store import costs as costs_mod
from batchgrader.store import log_queries, queries, readmodels
from batchgrader.store.eventstore import Event, EventStore, NewEvent
from batchgrader.store.readmodels import JOB_STATUS_COLUMNS, USAGE_COLUMNS, StatusProjector, job_row, projectors, rebuild

GOLDEN = Path(__file__).parent / "golden"
DOCS = Path(__file__).parent.parent / "docs" / "events.md"


def golden(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (GOLDEN / f"{name}.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]


ALL_GOLDEN = sorted(p.stem for p in GOLDEN.glob("*.jsonl"))


def json_events(name: str) -> list[Event]:
    return [Event(d["seq"], d["job_id"], d["job_seq"], d["type"], d["version"], d["ts"], d["payload"]) for d in golden(name)]


def feed(store: EventStore, names: list[str] = ALL_GOLDEN, group: int = 1, suffix: str = "") -> None:
    """Append the golden logs as the daemon would: jobs interleaved, a few events per append.
    Job ids are ``<log name>-<recorded job id><suffix>``."""
    logs = [(f"{n}-{d[0]['job_id']}{suffix}", d) for n in names for d in [golden(n)]]
    pos = {jid: 0 for jid, _ in logs}
    while any(pos[jid] < len(evs) for jid, evs in logs):
        for jid, evs in logs:
            i = pos[jid]
            if i < len(evs):
                batch = evs[i : i + group]
                store.append(jid, [NewEvent(e["type"], e["payload"]) for e in batch], expected_version=i)
                pos[jid] = i + len(batch)


def tables(db: Path) -> dict[str, list[tuple]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in readmodels.READ_TABLES}
    finally:
        conn.close()


@pytest.fixture
def db(home: Home) -> Path:
    return home.db


# --- the projector ------------------------------------------------------------------------------------------------


def test_projectors_create_the_read_tables_by_migration_and_leave_events_alone(db: Path):
    with EventStore(db, projectors=projectors()) as s:
        conn = s.conn
        cols = [r[1] for r in conn.execute("PRAGMA table_info(job_status)")]
        assert cols == list(JOB_STATUS_COLUMNS)
        assert [r[1] for r in conn.execute("PRAGMA table_info(usage)")] == list(USAGE_COLUMNS)
        applied = [
            r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations WHERE migration_set = ?", (readmodels.MIGRATION_SET,))
        ]
        assert applied == list(readmodels.MIGRATION_NAMES)
        events_sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
        assert " ".join(events_sql.split()) == " ".join(EVENTS_DDL[0].replace("IF NOT EXISTS ", "").split())
        assert conn.execute("SELECT last_seq FROM projection_state").fetchall() == [(0,)]
    with EventStore(db, projectors=projectors()):  # reopening migrates nothing twice
        pass
    assert tables(db)["projection_state"] == [("status", 0)]


def _schema(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")]


def test_the_read_side_is_the_schema_sqlite_utils_made(tmp_path: Path):
    """A new home's read side is, to the text, what sqlite-utils' Migrations made (a home from an
    earlier version and a new one are alike); an old home (at 0006, before the later columns) gets
    them added, each migration recorded once; a migration that fails leaves neither its changes
    nor its record."""
    golden_sql = (GOLDEN / "readmodel_schema.sql").read_text(encoding="utf-8").split("\n\n", 1)[1]
    new = sqlite3.connect(tmp_path / "new.db", isolation_level=None)
    new.execute("BEGIN")
    readmodels.migrate(new)
    new.execute("COMMIT")
    assert ";\n\n".join(_schema(new)) + ";\n" == golden_sql

    sql_type = {str: "TEXT", int: "INTEGER", float: "REAL"}
    late = ["cache_write_tokens", "cache_saved_usd", "route"]  # added by 0007 and 0008
    old = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    old.execute("BEGIN")
    for table, columns in (("job_status", JOB_STATUS_COLUMNS), ("usage", USAGE_COLUMNS)):
        old.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {sql_type[t]}' for c, t in columns.items() if c not in late)})")
    for sql in _schema(new):  # the other tables, and every index
        if not sql.startswith(('CREATE TABLE "job_status"', 'CREATE TABLE "usage"')):
            old.execute(sql)
    for name in readmodels.MIGRATION_NAMES[:6]:
        old.execute(
            "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES (?, ?, 'then')",
            (readmodels.MIGRATION_SET, name),
        )
    readmodels.migrate(old)
    old.execute("COMMIT")
    for table, columns in (("job_status", JOB_STATUS_COLUMNS), ("usage", USAGE_COLUMNS)):
        have = [r[1] for r in old.execute(f"PRAGMA table_info({table})")]
        assert sorted(have) == sorted(columns) and have[-3:] == late
    assert (
        old.execute("SELECT sql FROM sqlite_master WHERE name = 'usage'")
        .fetchone()[0]
        .endswith(
            ', "cache_write_tokens" INTEGER, "cache_saved_usd" REAL, "route" TEXT)'  # as sqlite-utils' add_column writes them
        )
    )
    assert [r[0] for r in old.execute("SELECT name FROM _sqlite_migrations ORDER BY id")] == list(readmodels.MIGRATION_NAMES)

    failing = sqlite3.connect(tmp_path / "failing.db", isolation_level=None)
    failing.execute("BEGIN")
    failing.execute("CREATE TABLE job_status (job_id TEXT)")  # in the way of migration 0001
    with pytest.raises(sqlite3.OperationalError, match="already exists"):
        readmodels.migrate(failing)
    assert failing.execute("SELECT COUNT(*) FROM _sqlite_migrations").fetchone() == (0,)
    assert failing.execute("SELECT name FROM sqlite_master WHERE name = 'usage'").fetchone() is None


def test_job_row_follows_the_column_order():
    job = fold(json_events("v1_failed_rows_retry")).jobs["32c86eafae56"]
    assert list(job_row(job)) == list(JOB_STATUS_COLUMNS)
    assert list(readmodels.usage_row(json_events("v1_happy_multichunk")[20], False)) == list(USAGE_COLUMNS)


def test_incrementally_maintained_tables_equal_a_rebuild_from_the_log(db: Path):
    with EventStore(db, projectors=projectors()) as s:
        feed(s, group=1)
        feed(s, ["v1_happy_multichunk", "v1_cancelled"], group=3, suffix="-again")
    n_events = sum(len(golden(n)) for n in ALL_GOLDEN) + len(golden("v1_happy_multichunk")) + len(golden("v1_cancelled"))
    n_usage = sum(1 for n in ALL_GOLDEN + ["v1_happy_multichunk", "v1_cancelled"] for e in golden(n) if e["type"] == "TokensUsed")
    incremental = tables(db)
    assert incremental["projection_state"] == [("status", n_events)]
    assert len(incremental["usage"]) == n_usage and len(incremental["job_status"]) == len(ALL_GOLDEN) + 2
    report = rebuild(db)
    assert report == {"last_seq": n_events, "jobs": len(ALL_GOLDEN) + 2, "usage_rows": n_usage}
    assert tables(db) == incremental


def test_job_status_is_exactly_the_fold(db: Path):
    with EventStore(db, projectors=projectors()) as s:
        feed(s, group=2)
        state = fold(s.read())
    rows = {r["job_id"]: r for r in queries.status(db)}
    assert {j: r["state"] for j, r in rows.items()} == {j: job.state for j, job in state.jobs.items()}
    for jid, job in state.jobs.items():
        expected = job_row(job)
        got = rows[jid]
        for k in queries.STATUS_COLUMNS:
            if k in ("chunks", "sandbox", "cancel_requested"):
                continue
            assert got[k] == expected[k], k
        assert got["batches"] == json.loads(expected["chunks"])
        assert "chunks" not in got
    for jid in list(state.jobs)[:2]:  # the detail has every column
        detail = queries.job_detail(db, jid)
        expected = job_row(state.jobs[jid])
        assert {k: detail[k] for k in JOB_STATUS_COLUMNS if k not in ("chunks", "sandbox", "cancel_requested")} == {
            k: expected[k] for k in JOB_STATUS_COLUMNS if k not in ("chunks", "sandbox", "cancel_requested")
        }
    assert rows["v1_held-194352796bbb"]["state"] == "held" and rows["v1_held-194352796bbb"]["held_reason"].startswith(
        "estimated cost"
    )
    assert rows["v1_cancelled-194352796bbb"]["sandbox"] is True
    assert rows["v1_happy_multichunk-194352796bbb"]["input_tokens"] == 273  # JobPrepared.input_tokens
    assert rows["v1_rejected_file-x-52fbb30faf37"]["error"].startswith("notes.txt: unsupported file type")


def test_rebuilt_job_status_matches_the_golden_expectations(db: Path):
    with EventStore(db) as s:
        feed(s, group=3)
    rebuild(db)
    rows = {r["job_id"]: r for r in queries.status(db)}
    for name in ALL_GOLDEN:
        expected = json.loads((GOLDEN / f"{name}.expected.json").read_text(encoding="utf-8"))
        for jid, job in expected["jobs"].items():
            row = rows[f"{name}-{jid}"]
            assert (row["state"], row["chunks_total"], row["chunks_done"], row["succeeded"]) == (
                job["state"],
                job["chunks_total"],
                job["chunks_done"],
                job["succeeded_rows"],
            ), name
            assert row["cost_usd"] == pytest.approx(job["cost_usd"])


def test_status_at_every_step_of_a_job(db: Path):
    """After every append the read model says what the fold of the log so far says."""
    with EventStore(db, projectors=projectors()) as s:
        for i, e in enumerate(golden("v1_failed_rows_retry")):
            s.append("J", [NewEvent(e["type"], e["payload"])], expected_version=i)
            (row,) = queries.status(db)
            assert row["source"] == "read_model"
            job = fold(s.read()).jobs["J"]
            assert job.version == i + 1
            expected = job_row(job)
            assert row["state"] == job.state == expected["state"]
            assert row["batches"] == json.loads(expected["chunks"])
            assert (row["chunks_done"], row["succeeded"], row["failed"], row["cost_usd"]) == (
                expected["chunks_done"],
                expected["succeeded"],
                expected["failed"],
                expected["cost_usd"],
            )


def test_a_rolled_back_append_does_not_desynchronise_the_projector(db: Path):
    class FailOnce:
        armed = True

        def setup(self, conn):
            pass

        def apply(self, conn, events):
            if self.armed:
                self.armed = False
                raise RuntimeError("boom")

    p = StatusProjector()
    evs = golden("v1_happy_multichunk")
    with EventStore(db, projectors=[StatusProjector()]) as s:
        s.append("J", [NewEvent(e["type"], e["payload"]) for e in evs[:5]])
    with EventStore(db, projectors=[p, FailOnce()]) as s:
        with pytest.raises(RuntimeError):
            s.append("J", [NewEvent(e["type"], e["payload"]) for e in evs[5:10]], expected_version=5)
        assert p.last_seq == 10 and p.jobs["J"].jobs["J"].version == 10  # memory ran ahead of the rolled-back log
        s.append("J", [NewEvent(e["type"], e["payload"]) for e in evs[5:12]], expected_version=5)
        assert p.last_seq == 12  # caught up from the log
        s.append("J", [NewEvent(e["type"], e["payload"]) for e in evs[12:15]], expected_version=12)
        assert p.last_seq == 15
        assert dataclasses.asdict(p.jobs["J"].jobs["J"]) == dataclasses.asdict(fold(s.read()).jobs["J"])
    incremental = tables(db)
    rebuild(db)
    assert tables(db) == incremental


def test_events_appended_without_the_projector_are_caught_up(db: Path):
    with EventStore(db, projectors=projectors()) as s:
        feed(s, ["v1_held"])
    with EventStore(db) as plain:  # e.g. an older daemon, or a tool
        feed(plain, ["v1_happy_multichunk"])
    rows = queries.status(db)
    assert {r["source"] for r in rows} == {"log"}
    assert "behind the log" in rows[0]["note"]
    assert {r["state"] for r in rows} == {"held", "completed"}

    with EventStore(db, projectors=projectors()) as s:  # next start: set-up catches up
        assert queries.status(db)[0]["source"] == "read_model"
        with EventStore(db) as plain:  # another writer appends while this store is open
            plain.append("other", [NewEvent("CancelRequested", {"reason": "x"})])
        s.append("v1_held-194352796bbb", [NewEvent("JobReleased", {"reason": "ok", "override": True})])
    incremental = tables(db)
    assert {r[0] for r in incremental["job_status"]} >= {"other", "v1_held-194352796bbb"}
    rebuild(db)
    assert tables(db) == incremental


def test_set_up_reads_nothing_when_the_tables_are_current(db: Path, monkeypatch: pytest.MonkeyPatch):
    with EventStore(db, projectors=projectors()) as s:
        feed(s, ["v1_held", "v1_happy_multichunk"])
    before = tables(db)

    def no_fold(*a, **k):
        raise AssertionError("the log was folded")

    monkeypatch.setattr(readmodels, "fold", no_fold)
    p = StatusProjector()
    with EventStore(db, projectors=[p]):
        assert p.last_seq == before["projection_state"][0][1] and p.jobs == {}
    assert tables(db) == before


def test_the_projector_keeps_only_unfinished_jobs_in_memory(db: Path):
    p = StatusProjector()
    with EventStore(db, projectors=[p]) as s:
        feed(s, ["v1_held", "v1_happy_multichunk"])
    assert set(p.jobs) == {"v1_held-194352796bbb"}


@pytest.mark.parametrize("bulk", [0, 10_000])
def test_catching_up_in_bulk_or_per_job_gives_the_same_tables(db: Path, monkeypatch: pytest.MonkeyPatch, bulk: int):
    with EventStore(db, projectors=projectors()) as s:
        feed(s, ALL_GOLDEN[:3], group=2)
    expected = tables(db)
    monkeypatch.setattr(StatusProjector, "BULK_CATCH_UP", bulk)
    rebuild(db)
    assert tables(db) == expected


def test_status_falls_back_to_the_log_when_the_tables_are_missing(db: Path):
    with EventStore(db) as s:
        feed(s, group=4)
    folded = queries.status(db, now=2e9)
    assert folded and all(r["source"] == "log" for r in folded)
    assert "missing" in folded[0]["note"]
    rebuild(db)
    fresh = queries.status(db, now=2e9)
    assert all(r["source"] == "read_model" and r["note"] is None for r in fresh)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("source", "note")} for r in rows]  # noqa: E731
    assert strip(fresh) == strip(folded)


def test_read_tables_dropped_by_hand_come_back(db: Path):
    with EventStore(db, projectors=projectors()) as s:
        feed(s, ["v1_held"])
        s.conn.execute("DROP TABLE job_status")  # while the daemon runs
        s.append("v1_held-194352796bbb", [NewEvent("RetryRequested", {"reason": "go"})])
        assert queries.status(db)[0]["source"] == "read_model"
        s.conn.execute("DROP TABLE usage")
    with EventStore(db, projectors=projectors()):  # or before it starts
        pass
    incremental = tables(db)
    assert len(incremental["job_status"]) == 1
    rebuild(db)
    assert tables(db) == incremental


def test_rebuild_catches_up_with_events_appended_while_it_folded(db: Path, monkeypatch: pytest.MonkeyPatch):
    with EventStore(db, projectors=projectors()) as s:
        feed(s, ["v1_held", "v1_cancelled"])
    real_fold = readmodels.fold
    calls = []

    def fold_while_the_daemon_appends(events):
        state = real_fold(events)
        calls.append(1)
        if len(calls) == 1:  # the snapshot fold; later ones are the catch-up inside the write lock
            with EventStore(db) as daemon:  # commits after rebuild's read snapshot was taken
                daemon.append("v1_held-194352796bbb", [NewEvent("RetryRequested", {"reason": "go"})])
                daemon.append("new", [_accept("new"), _usage_event("2026-01-01", 0.5)])
        return state

    monkeypatch.setattr(readmodels, "fold", fold_while_the_daemon_appends)
    report = rebuild(db)
    monkeypatch.setattr(readmodels, "fold", real_fold)
    caught_up = tables(db)
    assert report["last_seq"] == len(golden("v1_held")) + len(golden("v1_cancelled")) + 3
    assert {r[0] for r in caught_up["job_status"]} >= {"new"} and caught_up["projection_state"] == [
        ("status", report["last_seq"])
    ]
    rebuild(db)
    assert tables(db) == caught_up


def test_rebuild_needs_a_database(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        rebuild(tmp_path / "nope.db")
    assert not (tmp_path / "nope.db").exists()


# --- queries -----------------------------------------------------------------------------------------------------


@pytest.fixture
def fed(db: Path, home: Home) -> Home:
    with EventStore(db, projectors=projectors()) as s:
        feed(s, group=3)
    return home


def test_status_row_shape(fed: Home):
    rows = queries.status(fed)
    assert [r["job_id"] for r in rows] == sorted(
        [r["job_id"] for r in rows], key=lambda j: next(x["created_ts"] for x in rows if x["job_id"] == j)
    )
    need = {
        "job_id",
        "file",
        "profile",
        "state",
        "rows",
        "chunks_total",
        "chunks_done",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "error",
        "sandbox",
        "age_seconds",
        "batches",
        "held_reason",
        "result_path",
    }
    for r in rows:
        assert need <= set(r)
        assert r["age_seconds"] >= 0
        for b in r["batches"]:
            assert set(b) == {"chunk", "batch_id", "status", "request_counts", "requested_ts"}
    happy = queries.status(fed, "v1_happy")[0]
    assert happy["state"] == "completed" and happy["chunks_done"] == happy["chunks_total"] == 3
    assert [b["status"] for b in happy["batches"]] == ["done"] * 3
    assert all(b["batch_id"].startswith("batch_") for b in happy["batches"])
    assert happy["result_path"].endswith("essays_results.csv")
    json.dumps(rows)  # --json


def test_job_ids_may_be_given_as_a_unique_prefix(fed: Home):
    assert queries.status(fed, "v1_held")[0]["job_id"] == "v1_held-194352796bbb"
    assert queries.status(fed, "v1_held-194352796bbb")[0]["state"] == "held"
    with pytest.raises(queries.AmbiguousJob) as exc:
        queries.status(fed, "v1_")
    assert len(exc.value.candidates) > 1
    with pytest.raises(queries.UnknownJob):
        queries.status(fed, "zzz")
    with pytest.raises(queries.UnknownJob):
        log_queries.events(fed, "v1_held-194352796bbbX")


def test_job_detail(fed: Home):
    d = queries.job_detail(fed, "v1_failed")
    assert d["state"] == "completed_with_errors" and d["succeeded"] == 5 and d["failed"] == 2
    assert d["failed_rows_total"] == 2 and {r["code"] for r in d["failed_rows"]} == {"invalid_value"}
    assert [c["retry"] for c in d["chunks"]] == [False, False, False, True]
    assert d["events_total"] == 58 and len(d["recent_events"]) == 10 and d["recent_events"][-1]["type"] == "JobCompleted"


def test_events_query(fed: Home):
    everything = log_queries.events(fed)
    assert [e["seq"] for e in everything] == list(range(1, len(everything) + 1))
    held = log_queries.events(fed, "v1_held")
    assert [e["type"] for e in held] == ["JobAccepted", "JobPrepared", "JobHeld"]
    assert [e["job_seq"] for e in held] == [1, 2, 3]
    assert [e["seq"] for e in log_queries.events(fed, after=10, limit=3)] == [11, 12, 13]
    assert [e["seq"] for e in log_queries.events(fed, last=2)] == [everything[-2]["seq"], everything[-1]["seq"]]
    assert log_queries.events(fed, after=everything[-1]["seq"]) == []


def test_follow_events_yields_new_events_as_they_are_appended(fed: Home, db: Path):
    start = log_queries.events(fed, last=1)[0]["seq"]
    got: queue.Queue = queue.Queue()
    done = threading.Event()

    def consume() -> None:
        for e in log_queries.follow_events(fed, "v1_held", poll=0.01, after=start, stop=done.is_set):
            got.put(e)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    with EventStore(db, projectors=projectors()) as s:
        s.append("v1_held-194352796bbb", [NewEvent("RetryRequested", {"reason": "go"})])
        s.append("other", [NewEvent("CancelRequested", {"reason": "not followed"})])
        s.append("v1_held-194352796bbb", [NewEvent("JobReleased", {"reason": "go", "override": True})])
    first, second = got.get(timeout=10), got.get(timeout=10)
    done.set()
    t.join(timeout=10)
    assert not t.is_alive()
    assert [first["type"], second["type"]] == ["RetryRequested", "JobReleased"]
    assert got.empty()


def _usage_event(day: str, cost: float, model: str = "gpt-5.4-mini", prompt: int = 1000, completion: int = 100) -> NewEvent:
    return NewEvent(
        "TokensUsed",
        {
            "chunk": 0,
            "batch_id": "b",
            "model": model,
            "prompt_tokens": prompt,
            "cached_tokens": 10,
            "completion_tokens": completion,
            "reasoning_tokens": 0,
            "cost_usd": cost,
            "day": day,
        },
    )


def _accept(job: str, sandbox: bool = False) -> NewEvent:
    name = f"{job}.csv"
    return NewEvent(
        "JobAccepted",
        {
            "file": name,
            "source": name,
            "profile": "default",
            "sha256": "0" * 64,
            "bytes": 1,
            "input_path": name,
            "result_name": name,
            "sandbox": sandbox,
        },
    )


def test_costs_are_the_billed_figures_grouped(db: Path):
    with EventStore(db, projectors=projectors()) as s:
        s.append("j1", [_accept("j1"), _usage_event("2026-01-01", 0.5), _usage_event("2026-01-02", 0.25, model="gpt-4o")])
        s.append("j2", [_accept("j2"), _usage_event("2026-01-02", 1.0)])
        s.append("sim", [_accept("sim", sandbox=True), _usage_event("2026-01-02", 9.0)])
    by_day = costs_mod.costs(db)
    assert by_day["source"] == "read_model"
    assert [(r["key"], r["cost_usd"], r["simulated_usd"], r["batches"], r["jobs"]) for r in by_day["rows"]] == [
        ("2026-01-01", 0.5, 0.0, 1, 1),
        ("2026-01-02", 1.25, 9.0, 3, 3),
    ]
    t = by_day["totals"]
    # billed cost as recorded (1,000 prompt tokens of gpt-5.4-mini would never cost $0.50): not re-estimated
    assert (
        t["cost_usd"],
        t["simulated_usd"],
        t["prompt_tokens"],
        t["cached_tokens"],
        t["completion_tokens"],
        t["batches"],
        t["jobs"],
    ) == (1.75, 9.0, 4000, 40, 400, 4, 3)
    assert by_day["daily"] == [
        {"day": "2026-01-01", "cost_usd": 0.5, "simulated_usd": 0.0},
        {"day": "2026-01-02", "cost_usd": 1.25, "simulated_usd": 9.0},
    ]
    by_model = costs_mod.costs(db, by="model")
    assert [(r["key"], r["cost_usd"]) for r in by_model["rows"]] == [("gpt-5.4-mini", 1.5), ("gpt-4o", 0.25)]
    by_job = costs_mod.costs(db, by="job", since="2026-01-02")
    assert [(r["key"], r["file"], r["cost_usd"], r["simulated_usd"]) for r in by_job["rows"]] == [
        ("sim", "sim.csv", 0.0, 9.0),
        ("j2", "j2.csv", 1.0, 0.0),
        ("j1", "j1.csv", 0.25, 0.0),
    ]
    only_first = costs_mod.costs(db, until="2026-01-01")
    assert only_first["totals"]["cost_usd"] == 0.5 and only_first["until"] == "2026-01-01"
    assert costs_mod.costs(db, since="2026-02-01")["rows"] == []
    with pytest.raises(queries.QueryError):
        costs_mod.costs(db, by="week")
    with pytest.raises(queries.QueryError):
        costs_mod.costs(db, since="yesterday")
    with pytest.raises(queries.QueryError):
        costs_mod.costs(db, since="2026-02-01", until="2026-01-01")


def test_costs_from_the_log_equal_costs_from_the_read_model(db: Path):
    with EventStore(db) as s:
        feed(s, group=5)
        s.append("j1", [_accept("j1"), _usage_event("2026-01-01", 0.5)])
    for by in costs_mod.COST_GROUPS:
        from_log = costs_mod.costs(db, by=by)
        assert from_log["source"] == "log" and "missing" in from_log["note"]
        rebuild(db)
        from_model = costs_mod.costs(db, by=by)
        assert from_model["source"] == "read_model" and from_model["note"] is None
        for k in ("rows", "totals", "daily"):
            assert from_log[k] == from_model[k]
        with sqlite3.connect(db) as c:  # back to "no read model" for the next grouping
            for t in readmodels.READ_TABLES:
                c.execute(f"DROP TABLE {t}")


def test_queries_do_not_wait_for_the_writer(fed: Home, db: Path):
    with EventStore(db, projectors=projectors()) as s:
        with s.write() as c:  # the daemon in the middle of a write transaction
            c.execute(
                "INSERT INTO events (job_id, job_seq, type, version, ts, payload) VALUES ('v1_held-194352796bbb', 4, 'CancelRequested', 1, 't', '{}')"
            )
            rows = queries.status(fed)
            assert all(r["source"] == "read_model" for r in rows)  # the committed snapshot, current
            assert costs_mod.costs(fed)["source"] == "read_model"
            assert len(log_queries.events(fed, "v1_held")) == 3


def test_queries_say_when_there_is_no_database(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="has the daemon run yet"):
        queries.status(tmp_path / "empty-home")


# --- rendering -----------------------------------------------------------------------------------------------------


def _console() -> Console:
    return Console(record=True, width=200, color_system=None)


def test_render_status_and_job(fed: Home):
    c = _console()
    render_status(queries.status(fed), c)
    out = c.export_text()
    for label in ("completed", "completed_with_errors", "failed", "held", "cancelled"):
        assert label in out
    assert out.count("SIMULATED") >= 1  # the sandbox job is labelled
    assert "held: estimated cost" in out
    c = _console()
    render_job(queries.job_detail(fed, "v1_cancelled"), c)
    out = c.export_text()
    assert "SIMULATED" in out and "Chunks" in out and "cancelled" in out
    c = _console()
    render_status([], c)
    assert "No jobs yet" in c.export_text()


def test_rendering_never_reads_data_as_markup():
    row = {
        "job_id": "j1",
        "file": "[red]a[/red].csv",
        "state": "failed",
        "error": "[bad_input] line 2",
        "error_code": "x",
        "chunks": [{"index": 0, "status": "failed", "batch_id": None, "request_counts": {}, "error": "[b]oom"}],
    }
    c = _console()
    render_status([row], c)
    render_job(row, c)
    render_costs(
        {
            "by": "job",
            "rows": [
                {
                    "key": "[j]",
                    "file": "[f].csv",
                    "batches": 1,
                    "jobs": 1,
                    "prompt_tokens": 1,
                    "cached_tokens": 0,
                    "completion_tokens": 1,
                    "cost_usd": 1.0,
                    "simulated_usd": 0.0,
                }
            ],
            "totals": {
                "batches": 1,
                "jobs": 1,
                "prompt_tokens": 1,
                "cached_tokens": 0,
                "completion_tokens": 1,
                "cost_usd": 1.0,
                "simulated_usd": 0.0,
            },
            "daily": [],
        },
        c,
    )
    out = c.export_text()
    for literal in ("[red]a[/red].csv", "[bad_input] line 2", "[b]oom", "[j]", "[f].csv"):
        assert literal in out


def test_render_status_leaves_out_old_finished_jobs(fed: Home):
    rows = queries.status(fed)
    c = _console()
    render_status(rows, c, max_finished=2)
    out = c.export_text()
    finished = [r for r in rows if r["state"] in ("completed", "completed_with_errors", "failed", "cancelled")]
    assert f"and {len(finished) - 2:,} older finished jobs not shown" in out
    assert rows[-1]["job_id"][:12] in out  # the newest stay
    assert "v1_held" in out  # unfinished jobs are always shown
    c = _console()
    render_status(rows, c, max_finished=None)
    assert "not shown" not in c.export_text()


def test_render_status_shows_the_fallback_note(db: Path):
    with EventStore(db) as s:
        feed(s, ["v1_held"])
    c = _console()
    render_status(queries.status(db), c)
    assert "folded from the event log" in c.export_text()


def test_render_events_one_line_each_when_it_fits(fed: Home):
    """One line per event; a payload too long for the line goes on the lines below, whole."""
    c = _console()
    evs = log_queries.events(fed, "v1_happy")
    render_events(evs, c)
    lines = [ln for ln in c.export_text().splitlines() if ln.strip()]
    heads = [ln for ln in lines if not ln.startswith("        ")]
    assert len(heads) == len(evs)
    assert "JobCompleted" in heads[-1]
    assert "…" not in c.export_text()
    short = [h for h, e in zip(heads, evs) if e["type"] == "JobCompleted"]
    assert "succeeded=" in short[0]  # a payload that fits stays on the event's line


def test_render_costs_with_a_bar_chart(db: Path):
    with EventStore(db, projectors=projectors()) as s:
        s.append("j1", [_accept("j1"), _usage_event("2026-01-01", 1.0), _usage_event("2026-01-02", 0.25)])
    c = _console()
    render_costs(costs_mod.costs(db), c, chart_width=16)
    out = c.export_text()
    assert "2026-01-01 " + "█" * 16 in out
    assert "2026-01-02 " + "████" in out and "$1.2500" in out
    c = _console()
    render_costs(costs_mod.costs(db, since="2030-01-01"), c)
    assert "No billed usage" in c.export_text()


def test_bar_uses_eighth_blocks():
    assert bar(1, 1, 4) == "████"
    assert bar(0.5, 1, 4) == "██"
    assert bar(1, 8 * 4, 4) == "▏"
    assert bar(0, 1, 4) == "" and bar(1, 0, 4) == ""


# --- docs ------------------------------------------------------------------------------------------------------------


def test_every_event_type_is_documented():
    text = DOCS.read_text(encoding="utf-8")
    headings = set(re.findall(r"^### `?(\w+)`?", text, flags=re.M))
    missing = sorted(set(EVENTS) - headings)
    assert not missing, f"docs/events.md lacks a section for: {', '.join(missing)}"
    for name, et in EVENTS.items():
        section = text.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0]
        assert f"version {et.version}" in section, f"{name}: version not documented"
        for field in et.fields:
            assert f"`{field}`" in section, f"{name}: payload field {field!r} not documented"


def _cached_usage_event(day: str, cost: float, saved: float, writes: int) -> NewEvent:
    e = _usage_event(day, cost, model="claude-sonnet-4-5", prompt=5000)
    return NewEvent("TokensUsed", {**e.payload, "cached_tokens": 2000, "cache_write_tokens": writes, "cache_saved_usd": saved})


def test_what_prompt_caching_saved_shows_in_costs_and_status_job(db: Path, home: Home):
    with EventStore(db, projectors=projectors()) as s:
        s.append("j1", [_accept("j1"), _cached_usage_event("2026-01-01", 0.5, 0.25, 2000), _usage_event("2026-01-02", 0.1)])
        s.append("sim", [_accept("sim", sandbox=True), _cached_usage_event("2026-01-02", 0.2, 0.125, 0)])
    for source in ("read_model", "log"):
        if source == "log":
            with sqlite3.connect(db) as conn:
                conn.execute("DROP TABLE usage")
        result = costs_mod.costs(db, by="job")
        t = result["totals"]
        assert (t["cache_saved_usd"], t["simulated_cache_saved_usd"]) == (0.25, 0.125)
        console = Console(width=200, record=True, color_system=None)
        render_costs(result, console=console)
        out = console.export_text()
        assert "cache saved" in out and "$0.25" in out and f"cache saved {'SIMULATED'}" in out
    detail = queries.job_detail(db, "j1")
    assert (detail["cached_tokens"], detail["cache_write_tokens"], detail["cache_saved_usd"]) == (2010, 2000, 0.25)
    console = Console(width=120, record=True, color_system=None)
    render_job(detail, console=console)
    assert re.search(r"prompt cache\s+2,010 tokens read, 2,000 written; saved \$0\.25", console.export_text())
    # a job whose provider reported no cache use shows no such line, and its events carry no cache fields
    with EventStore(db, projectors=projectors()) as s:
        s.append("j2", [_accept("j2"), NewEvent("TokensUsed", {**_usage_event("2026-01-03", 0.1).payload, "cached_tokens": 0})])
    console = Console(width=120, record=True, color_system=None)
    render_job(queries.job_detail(db, "j2"), console=console)
    assert "prompt cache" not in console.export_text()

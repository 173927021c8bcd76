"""The event store's contract (batchgrader.store): durability settings, per-job ordering and
optimistic concurrency, immutability, non-blocking readers, projectors in the append
transaction, upcasting on read."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from batchgrader.core.host.home import Home
from batchgrader.core.log import schema
from batchgrader.core.log.state import fold
from batchgrader.store import eventstore as store_mod
from batchgrader.store.eventstore import ConcurrencyError, Event, EventStore, NewEvent, UnknownEventType


def ev(type_: str = "CancelRequested", **payload) -> NewEvent:
    return NewEvent(type_, payload or {"reason": "r"})


@pytest.fixture
def db(home: Home) -> Path:
    return home.db


@pytest.fixture
def store(db: Path):
    s = EventStore(db)
    yield s
    s.close()


# --- settings ------------------------------------------------------------------------------------------


def test_wal_and_synchronous_full(store: EventStore, db: Path):
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert store.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600
    assert store.integrity_check() == "ok"


def test_unknown_event_types_are_refused():
    with pytest.raises(UnknownEventType):
        NewEvent("SomethingHappened", {})


# --- appending -----------------------------------------------------------------------------------------


def test_append_assigns_contiguous_per_job_seqs(store: EventStore):
    a1 = store.append("A", [ev(), ev(), ev()])
    b1 = store.append("B", [ev(), ev()])
    a2 = store.append("A", [ev(), ev()], expected_version=3)
    assert [e.job_seq for e in a1 + a2] == [1, 2, 3, 4, 5]
    assert [e.job_seq for e in b1] == [1, 2]
    assert [e.seq for e in a1 + b1 + a2] == list(range(1, 8))
    assert len({e.ts for e in a1}) == 1  # one append, one timestamp
    assert [(e.job_id, e.job_seq) for e in store.read()] == [(e.job_id, e.job_seq) for e in a1 + b1 + a2]
    assert [e.job_seq for e in store.read(job_id="A")] == [1, 2, 3, 4, 5]
    assert [e.seq for e in store.read(after=2, limit=3)] == [3, 4, 5]
    assert store.last_seq() == 7
    assert store.append("A", []) == []


def test_stored_events_round_trip(store: EventStore):
    (e,) = store.append("A", [ev("JobHeld", code="c", reason="ünïcode ✓")])
    (back,) = list(store.read())
    assert back == e
    assert back.payload == {"code": "c", "reason": "ünïcode ✓"} and back.version == schema.EVENTS["JobHeld"].version


def test_reading_spans_decode_batches(store: EventStore, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(store_mod, "READ_BATCH", 7)
    store.append("A", [ev("JobHeld", code=str(i), reason="r") for i in range(30)])
    events = list(store.read())
    assert [e.payload["code"] for e in events] == [str(i) for i in range(30)]
    assert events == [Event(e.seq, e.job_id, e.job_seq, e.type, e.version, e.ts, e.payload) for e in events]
    assert [e.seq for e in store.read(after=5, limit=10)] == list(range(6, 16))


def test_payloads_decoded_together_or_one_by_one_give_the_same_result():
    texts = ['{"a": 1}', ' {"b": [1, 2]} ', '"x"', "null"]
    assert store_mod.json_loads_many(texts) == [{"a": 1}, {"b": [1, 2]}, "x", None]
    assert store_mod.json_loads_many([]) == []
    with pytest.raises(ValueError):  # a row holding two values cannot shift the others
        store_mod.json_loads_many(['{"a": 1}', "1, 2"])
    with pytest.raises(ValueError):
        store_mod.json_loads_many(['{"a": 1}', "{"])


def test_stale_expected_version_raises_and_appends_nothing(store: EventStore):
    store.append("A", [ev(), ev()], expected_version=0)
    with pytest.raises(ConcurrencyError):
        store.append("A", [ev()], expected_version=1)
    with pytest.raises(ConcurrencyError):
        store.append("B", [ev()], expected_version=2)  # a new job is at version 0
    assert [e.job_seq for e in store.read()] == [1, 2]


def test_payloads_must_be_json(store: EventStore):
    with pytest.raises(ValueError):
        store.append("A", [ev("JobHeld", code="c", reason=float("nan"))])
    assert list(store.read()) == []


_WRITER = r"""
import json, sys
from batchgrader.core.log.state import fold
from batchgrader.store.eventstore import ConcurrencyError, EventStore, NewEvent
db, job, wid, n, mode = sys.argv[1:]
s = EventStore(db)
print("ready", flush=True)
sys.stdin.readline()
ok = conflicts = 0
for i in range(int(n)):
    while True:
        folded = fold(s.read(job_id=job)).jobs.get(job) if mode == "expected" else None  # as the daemon knows it
        version = (folded.version if folded else 0) if mode == "expected" else None
        try:
            s.append(job, [NewEvent("CancelRequested", {"reason": f"{wid}:{i}:a"}),
                           NewEvent("RetryRequested", {"reason": f"{wid}:{i}:b"})], expected_version=version)
            ok += 1
            break
        except ConcurrencyError:
            conflicts += 1
s.close()
print(json.dumps({"ok": ok, "conflicts": conflicts}), flush=True)
"""


@pytest.mark.parametrize("mode", ["expected", "append_after"])
def test_two_processes_appending_to_one_job_never_interleave_or_duplicate(db: Path, mode: str):
    EventStore(db).close()
    n, writers = 40, 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(db), "J", f"w{w}", str(n), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(writers)
    ]
    try:
        for p in procs:  # every writer is connected and waiting
            assert p.stdout.readline().strip() == "ready"
        for p in procs:  # release them together
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs)
    assert sum(r["ok"] for r in results) == n * writers

    with EventStore(db, readonly=True) as reader:
        events = list(reader.read(job_id="J"))
    assert [e.job_seq for e in events] == list(range(1, 2 * n * writers + 1))  # contiguous, no duplicate
    reasons = [e.payload["reason"] for e in events]
    assert len(set(reasons)) == len(reasons)
    for a, b in zip(events[0::2], events[1::2]):  # each append's two events stay adjacent
        assert a.payload["reason"][:-2] == b.payload["reason"][:-2]
        assert (a.type, b.type, b.job_seq) == ("CancelRequested", "RetryRequested", a.job_seq + 1)
    for w in range(writers):  # and each writer's appends keep their order
        mine = [int(r.split(":")[1]) for r in reasons if r.startswith(f"w{w}:") and r.endswith(":a")]
        assert mine == list(range(n))


# --- immutability ---------------------------------------------------------------------------------------


def test_events_cannot_be_updated_or_deleted(store: EventStore):
    store.append("A", [ev()])
    with pytest.raises(sqlite3.DatabaseError, match="immutable"):
        store.conn.execute("UPDATE events SET payload = '{}' WHERE seq = 1")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store.conn.execute("DELETE FROM events")
    with pytest.raises(sqlite3.IntegrityError):  # and a (job_id, job_seq) slot is taken once
        store.conn.execute(
            "INSERT INTO events (job_id, job_seq, type, version, ts, payload) VALUES ('A', 1, 'CancelRequested', 1, 't', '{}')"
        )
    assert [e.payload for e in store.read()] == [{"reason": "r"}]


# --- readers -----------------------------------------------------------------------------------------------


def test_a_read_only_reader_is_not_blocked_by_a_write_transaction(store: EventStore, db: Path):
    store.append("A", [ev()])
    with store.write() as c:
        c.execute(
            "INSERT INTO events (job_id, job_seq, type, version, ts, payload) VALUES ('A', 2, 'CancelRequested', 1, 't', '{}')"
        )
        with EventStore(db, readonly=True) as reader:
            reader.conn.execute("PRAGMA busy_timeout=0")  # any wait for a lock would raise at once
            assert [e.job_seq for e in reader.read()] == [1]  # the last committed snapshot
            assert reader.last_seq() == 1
    with EventStore(db, readonly=True) as reader:
        assert reader.last_seq() == 2


def test_a_read_only_store_cannot_write(store: EventStore, db: Path):
    store.append("A", [ev()])
    with EventStore(db, readonly=True) as reader:
        with pytest.raises(PermissionError):
            reader.append("A", [ev()])
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.conn.execute(
                "INSERT INTO events (job_id, job_seq, type, version, ts, payload) VALUES ('A', 2, 'x', 1, 't', '{}')"
            )


def test_a_read_only_store_needs_an_existing_database(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no database"):
        EventStore(tmp_path / "none.db", readonly=True)
    assert not (tmp_path / "none.db").exists()


def test_a_reader_opens_the_database_after_the_writer_closed(db: Path):
    with EventStore(db) as w:
        w.append("A", [ev()])
    with EventStore(db, readonly=True) as reader:
        assert reader.last_seq() == 1


# --- projectors ---------------------------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.calls: list[list[int]] = []

    def setup(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS rec (seq INTEGER PRIMARY KEY)")

    def apply(self, conn: sqlite3.Connection, events) -> None:
        self.calls.append([e.seq for e in events])
        conn.executemany("INSERT INTO rec (seq) VALUES (?)", [(e.seq,) for e in events])


class Failing(Recorder):
    def apply(self, conn, events) -> None:
        raise RuntimeError("projector bug")


def test_projectors_run_in_the_append_transaction(db: Path):
    rec = Recorder()
    with EventStore(db, projectors=[rec]) as s:
        s.append("A", [ev(), ev()])
        assert rec.calls == [[1, 2]]
        assert [r[0] for r in s.conn.execute("SELECT seq FROM rec")] == [1, 2]


def test_a_failing_projector_rolls_the_append_back(db: Path):
    rec = Recorder()
    with EventStore(db, projectors=[rec, Failing()]) as s:
        with pytest.raises(RuntimeError, match="projector bug"):
            s.append("A", [ev(), ev()])
        assert list(s.read()) == []
        assert s.conn.execute("SELECT COUNT(*) FROM rec").fetchone()[0] == 0
        assert not s.conn.in_transaction


# --- upcasting --------------------------------------------------------------------------------------------------


def _insert_raw(store: EventStore, job_id: str, job_seq: int, type_: str, version: int, payload: dict) -> None:
    with store.write() as c:
        c.execute(
            "INSERT INTO events (job_id, job_seq, type, version, ts, payload) VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, job_seq, type_, version, "2025-01-01T00:00:00+00:00", json.dumps(payload)),
        )


def test_an_upcaster_for_an_old_version_is_applied_on_read(store: EventStore, monkeypatch: pytest.MonkeyPatch):
    # A fake version 0 of JobHeld that called the reason "why" and had no code.
    def v0_to_v1(p: dict) -> dict:
        return {"code": p.get("limit", "unknown"), "reason": p["why"]}

    monkeypatch.setitem(schema.UPCASTERS, ("JobHeld", 0), v0_to_v1)  # restored after the test
    accepted = {"file": "a.csv", "source": "/in/a.csv", "profile": "default", "sha256": "s", "bytes": 1}
    accepted |= {"input_path": "/w/a.csv", "result_name": "a_results.csv", "sandbox": False}
    _insert_raw(store, "A", 1, "JobAccepted", 1, accepted)  # complete: the fold reads every field it needs
    _insert_raw(store, "A", 2, "JobHeld", 0, {"why": "over budget"})
    events = list(store.read())
    assert isinstance(events[1], Event)
    assert (events[1].version, events[1].payload) == (
        schema.EVENTS["JobHeld"].version,
        {"code": "unknown", "reason": "over budget"},
    )
    assert fold(events).jobs["A"].held == {"code": "unknown", "reason": "over budget"}
    # the stored row is never rewritten
    assert store.conn.execute("SELECT version, payload FROM events WHERE seq = 2").fetchone() == (
        0,
        json.dumps({"why": "over budget"}),
    )


def test_upcasters_chain_through_every_version(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(schema.EVENTS, "JobHeld", schema.EventType("JobHeld", 3, "budget", {"code": "", "reason": ""}))
    monkeypatch.setitem(schema.UPCASTERS, ("JobHeld", 1), lambda p: {**p, "v2": True})
    monkeypatch.setitem(schema.UPCASTERS, ("JobHeld", 2), lambda p: {**p, "v3": True})
    assert schema.upcast("JobHeld", 1, {"code": "c"}) == {"code": "c", "v2": True, "v3": True}
    assert schema.upcast("JobHeld", 3, {"code": "c"}) == {"code": "c"}


def test_a_missing_upcaster_is_an_error_not_a_silent_misread(store: EventStore):
    assert ("JobHeld", 0) not in schema.UPCASTERS
    _insert_raw(store, "A", 1, "JobHeld", 0, {"why": "x"})
    with pytest.raises(KeyError):
        list(store.read())


def test_upcasters_are_left_as_found():
    # the tests above patch the registry; none of it may leak into later tests
    assert ("JobHeld", 0) not in schema.UPCASTERS and schema.EVENTS["JobHeld"].version == 1

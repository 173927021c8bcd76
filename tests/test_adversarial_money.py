"""Issue 23: the money paths under faults (never pay twice, never pay for nothing), each against
the real engine, the real SDK and the emulator over real HTTP with its fault hooks."""

from __future__ import annotations

import time

import pytest

from adversarial_engine import CreateTracker, all_ended, make_engine, paid_per_key, run_until, write_rows
from batchgrader.emulator import Emulator, EmulatorConfig, Fault
from batchgrader.store.eventstore import EventStore
from harness import TEST_KEY

pytestmark = pytest.mark.timeout(120)


def rows_paid_twice(emu: Emulator) -> int:
    """Requests answered by a second (or later) batch of the same chunk attempt."""
    twice = {k for k, n in paid_per_key(emu).items() if n > 1}
    by_key: dict[str, list[int]] = {}
    for b in emu.batches():
        key = b["metadata"]["bg_key"]
        if key in twice:
            counts = b["request_counts"] or {}
            by_key.setdefault(key, []).append(counts.get("completed", 0) + counts.get("failed", 0))
    return sum(sum(sorted(n)[:-1]) for n in by_key.values())


@pytest.mark.slow
def test_several_late_creates_in_one_tick_are_each_waited_for_from_when_they_left(home):
    """Four files dropped at once: four creates in one tick, each carried out 3 s after it left,
    each given up after 1 s.  The settle wait of each counts from its own request (not from the
    tick's start), so every late batch is adopted: 4 batches, no row paid twice."""
    for k in range(4):
        write_rows(home.inbox / f"f{k}.csv", 25)
    creates = CreateTracker()
    with Emulator(EmulatorConfig(api_key=TEST_KEY, on_request=creates)) as emu, EventStore(home.db) as store:
        emu.script_fault("POST", "/v1/batches", Fault("delay", seconds=3.0), times=4)
        engine = make_engine(home, emu, store, "request_timeout_seconds: 1\n")
        run_until(engine, lambda: all_ended(engine) and creates.settled(), timeout=90)
        assert emu.batches_created() == 4, "a chunk was created again while its late create was landing"
        assert rows_paid_twice(emu) == 0
        assert {j.ended for j in engine.ctx.state.jobs.values()} == {"completed"}


@pytest.mark.slow
def test_a_late_duplicate_is_listed_and_cancelled_before_it_runs(home):
    """A create carried out 5 s after it left (reply given up after 0.5 s): it is believed absent
    at 3.5 s and created again; the late one lands at 5 s and validates for 1.5 s.  The duplicate
    watch lists every 2 s from the new create on, so it is cancelled before it runs (one listing
    at the end of the watch, 7 s, came after it had run)."""
    write_rows(home.inbox / "a.csv", 5)
    creates = CreateTracker()
    cfg = EmulatorConfig(api_key=TEST_KEY, validating_s=1.5, on_request=creates)
    with Emulator(cfg) as emu, EventStore(home.db) as store:
        emu.script_fault("POST", "/v1/batches", Fault("delay", seconds=5.0))
        engine = make_engine(home, emu, store, "request_timeout_seconds: 0.5\n")
        # the job can end while the emulator is still moving the cancelled batch from cancelling
        # to cancelled (it takes a moment under load): wait for that too
        run_until(
            engine,
            lambda: all_ended(engine) and creates.settled() and all(b["status"] != "cancelling" for b in emu.batches()),
            timeout=90,
        )
        assert sorted(b["status"] for b in emu.batches()) == ["cancelled", "completed"]
        assert all(n == 1 for n in paid_per_key(emu).values()), "the late batch ran: its rows were paid twice"
        (checked,) = [e.payload for e in store.read() if e.type == "DuplicateBatchesChecked"]
        assert len(checked["extras"]) == 1 and checked["cancelled"] == checked["extras"]


def test_a_create_reply_that_shows_the_batch_ended_is_read_back_before_it_is_collected(home):
    """A server that validates and runs each batch before its create reply returns (the reply
    says ``completed`` and names no result file): each batch is retrieved for its files, every row
    is answered once, and nothing is sent again."""
    write_rows(home.inbox / "a.csv", 30)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu, EventStore(home.db) as store:
        emu.script_fault("POST", "/v1/batches", Fault("ended_reply", seconds=10.0), times=3)
        engine = make_engine(home, emu, store, "split_row_limit: 10\n")
        run_until(engine, lambda: all_ended(engine), timeout=60)
        assert emu.batches_created() == 3 and rows_paid_twice(emu) == 0, "rows were sent again"
        created = [e.payload for e in store.read() if e.type == "BatchCreated"]
        (job,) = engine.ctx.state.jobs.values()
        assert [c["status"] for c in created] == ["completed"] * 3  # the replies said so
        assert job.ended == "completed" and not job.failed_rows
        assert emu.request_count("GET", "/v1/batches/{id}") + emu.request_count("GET", "/v1/batches") >= 1


def test_a_5xx_answer_to_a_create_is_reconciled_after_a_short_settle(home):
    """The provider answered the create with a 500 (it did not carry it out): its batch list says
    so at once, so the chunk is created again a second later, not after the request timeout
    (20 s here) plus 3 s."""
    write_rows(home.inbox / "a.csv", 5)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu, EventStore(home.db) as store:
        emu.script_fault("POST", "/v1/batches", Fault("status", status=500))
        engine = make_engine(home, emu, store, "request_timeout_seconds: 20\n")
        started = time.monotonic()
        run_until(engine, lambda: all_ended(engine), timeout=15)
        took = time.monotonic() - started
        (job,) = engine.ctx.state.jobs.values()
        assert job.ended == "completed" and emu.batches_created() == 1
        failed = [e.payload for e in store.read() if e.type == "BatchCreateFailed"]
        assert len(failed) == 1 and "absent" in failed[0]["error"]
        assert took < 12

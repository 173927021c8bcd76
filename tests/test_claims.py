"""Work any of several daemons may do, decided in the shared PostgreSQL store (store/claims.py): an
inbox input claimed exactly once by racing daemons, a claim resumed after its claimant died, and
a job lease held around a step's work; and a daemon's state kept up with the others' appends
(store/backend.py catch_up, emit_decided).  Every "daemon" is a store connection of its own to a
real PostgreSQL server."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from batchgrader.core.log.events import NewEvent
from batchgrader.core.log.state import fold
from batchgrader.store.backend import Follower, catch_up, emit_decided
from batchgrader.store.claims import claim_input, claimed, working
from batchgrader.store.leases import LeaseLost, Leases, job_lease
from batchgrader.store.pgstore import PostgresEventStore

TTL = 60.0


def ids(base: str):
    yield base
    n = 2
    while True:
        yield f"{base}-{n}"
        n += 1


def ev(reason: str) -> NewEvent:
    return NewEvent("CancelRequested", {"reason": reason})


@pytest.fixture
def stores(pg_url: str):
    opened: list[PostgresEventStore] = []

    def open_() -> PostgresEventStore:
        s = PostgresEventStore(pg_url)
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


def test_racing_daemons_claim_an_input_exactly_once(stores):
    daemons = [Leases(stores(), f"daemon-{i}") for i in range(5)]
    barrier = threading.Barrier(len(daemons))
    won: list[Any] = []
    lost: list[str] = []

    def claim(d: Leases) -> None:
        barrier.wait(timeout=30)
        c = claim_input(d, "inbox/a.csv|7|100|1", ids("abc"), TTL)
        (won if c is not None else lost).append(c or d.holder)

    threads = [threading.Thread(target=claim, args=(d,)) for d in daemons]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(won) == 1 and len(lost) == 4
    (c,) = won
    assert c.job_id == "abc" and not c.resumed and c.lease.name == job_lease("abc") and c.lease.fence == 1
    assert claimed(daemons[0], "inbox/a.csv|7|100|1") == ("abc", c.lease.holder)


def test_two_inputs_with_the_same_content_become_two_jobs(stores):
    a, b = Leases(stores(), "a"), Leases(stores(), "b")
    ca = claim_input(a, "x.csv", ids("abc"), TTL)
    cb = claim_input(b, "y.csv", ids("abc"), TTL)
    assert (ca.job_id, cb.job_id) == ("abc", "abc-2")
    a.store.append("abc-3", [ev("an older job holds this id")])
    assert claim_input(a, "z.csv", ids("abc"), TTL).job_id == "abc-4"


def test_a_claim_whose_claimant_died_before_accepting_is_resumed_once_its_lease_lapses(stores):
    a, b = Leases(stores(), "a"), Leases(stores(), "b")
    t = 1_000_000.0
    ca = claim_input(a, "x.csv", ids("abc"), TTL, now=t)
    assert claim_input(b, "x.csv", ids("abc"), TTL, now=t + 1) is None  # a holds it
    cb = claim_input(b, "x.csv", ids("abc"), TTL, now=t + TTL + 1)  # a died: its lease lapsed
    assert cb is not None and cb.resumed and cb.job_id == ca.job_id and cb.lease.fence == ca.lease.fence + 1
    with pytest.raises(LeaseLost):  # the old claimant, waking, can no longer record the job
        a.append_held(ca.lease, "abc", [ev("accepted by a")], expected_version=0, now=t + TTL + 2)
    b.append_held(cb.lease, "abc", [ev("accepted by b")], expected_version=0, now=t + TTL + 2)
    assert claim_input(a, "x.csv", ids("abc"), TTL, now=t + 10 * TTL) is None  # accepted: never claimed again
    assert [e.payload["reason"] for e in a.store.read(job_id="abc")] == ["accepted by b"]


def test_a_step_works_under_the_job_lease_and_releases_it(stores):
    a, b = Leases(stores(), "a"), Leases(stores(), "b")
    t = 1_000_000.0
    with working(a, "J", TTL, now=t) as w:
        assert w is not None
        with working(b, "J", TTL, now=t) as other:
            assert other is None  # another daemon works on the job
        assert w.keep(now=t + 1).expires_at == t + TTL  # not due yet: no round trip
        assert w.keep(now=t + TTL / 3 + 1).expires_at == t + TTL / 3 + 1 + TTL
        w.append("J", [ev("merged")], expected_version=0, now=t + TTL / 2)
    with working(b, "J", TTL, now=t + 1) as w2:  # released: the next step may run anywhere
        assert w2 is not None and w2.lease.fence == 2


def test_a_step_whose_lease_was_taken_over_writes_nothing(stores):
    a, b = Leases(stores(), "a"), Leases(stores(), "b")
    t = 1_000_000.0
    with working(a, "J", TTL, now=t) as w:
        assert b.acquire(job_lease("J"), TTL, now=t + TTL + 1) is not None  # a paused past its lease
        with pytest.raises(LeaseLost):
            w.keep(now=t + TTL + 2)
        with pytest.raises(LeaseLost):
            w.append("J", [ev("late merge")], expected_version=0, now=t + TTL + 2)
    assert list(a.store.read(job_id="J")) == []
    assert b.current(job_lease("J")).holder == "b"  # a's exit did not release b's lease


def test_catch_up_folds_other_daemons_events_before_ones_own(stores):
    mine, other = stores(), stores()
    mine.append("A", [ev("a1")])
    state = fold(mine.read())
    follower = Follower(mine, state.last_seq)
    other.append("B", [ev("b1")])  # committed before my next append
    stored = mine.append("A", [ev("a2")], expected_version=1)
    naive = fold(mine.read(job_id="A", limit=1))
    naive.apply(stored[0])  # what a single daemon does: the other's event, committed before, is then skipped
    assert "B" not in naive.jobs and naive.last_seq == stored[0].seq
    assert [e.job_id for e in catch_up(state, follower)] == ["B", "A"]  # in log order, own events included
    assert set(state.jobs) == {"A", "B"} and state.last_seq == stored[0].seq
    assert state.jobs["A"].version == 2 and catch_up(state, follower) == []


def test_emit_decided_folds_a_conflicting_append_and_decides_again(stores):
    mine, other = stores(), stores()
    mine.append("J", [ev("accepted")])
    state = fold(mine.read())
    follower = Follower(mine, state.last_seq)
    other.append("K", [ev("another job")])
    seen: list[int] = []

    def decide(job) -> list[NewEvent]:
        seen.append(job.version)
        if len(seen) == 1:  # another daemon records a step of this job meanwhile
            other.append("J", [ev("other daemon")], expected_version=1)
        return [ev(f"decided at {job.version}")] if job.version < 3 else []

    stored = emit_decided(mine, state, follower, "J", decide)
    assert seen == [1, 2] and stored[0].job_seq == 3 and stored[0].payload["reason"] == "decided at 2"
    assert state.jobs["J"].version == 3 and "K" in state.jobs  # nothing another daemon appended is skipped
    assert state.last_seq == mine.last_seq()
    assert fold(mine.read()).jobs["J"].version == state.jobs["J"].version
    assert emit_decided(mine, state, follower, "J", decide) == []

"""Leases with fencing numbers (store/leases.py) between two "daemons" (two store connections to a
real PostgreSQL server) and a fake clock: one account lease, job leases, intents that re-check
the lease in their own transaction, and connections killed by the server."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from batchgrader.core.log.events import NewEvent
from batchgrader.store.leases import Lease, LeaseLost, Leases, LeaseTooShort, account_lease, job_lease
from batchgrader.store.pgstore import PostgresEventStore

TTL = 60.0
BOUND = 20.0  # the longest a provider call may take (request_timeout_seconds + margin)
ACCOUNT = account_lease("openai", "org-test:proj-test")


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def upload(chunk: int = 0) -> NewEvent:
    return NewEvent("UploadStarted", {"chunk": chunk, "attempt": 1, "filename": f"c{chunk}.jsonl", "bytes": 10})


@pytest.fixture
def daemons(pg_url: str):
    """Two daemons: each its own store connection and its own name."""
    stores = [PostgresEventStore(pg_url), PostgresEventStore(pg_url)]
    yield Leases(stores[0], "daemon-a@host1"), Leases(stores[1], "daemon-b@host2")
    for s in stores:
        s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_one_holder_at_a_time_and_the_fence_goes_up_at_each_takeover(daemons, clock: Clock):
    a, b = daemons
    la = a.acquire(ACCOUNT, TTL, clock())
    assert la is not None and la.fence == 1 and la.holder == "daemon-a@host1"
    assert b.acquire(ACCOUNT, TTL, clock()) is None
    clock.advance(TTL / 2)
    la = a.renew(la, TTL, clock())
    assert la.fence == 1 and la.remaining(clock()) == TTL  # renewing keeps the fence
    assert a.acquire(ACCOUNT, TTL, clock()).fence == 1  # acquiring what one holds is a renewal
    clock.advance(TTL / 2 + 1)
    assert b.acquire(ACCOUNT, TTL, clock()) is None  # still A's: renewed
    clock.advance(TTL)
    lb = b.acquire(ACCOUNT, TTL, clock())  # A lapsed: B takes over with the next fence
    assert lb is not None and lb.fence == 2
    with pytest.raises(LeaseLost):
        a.renew(la, TTL, clock())
    assert a.acquire(ACCOUNT, TTL, clock()) is None
    assert b.release(lb) and not a.release(la)
    la2 = a.acquire(ACCOUNT, TTL, clock())  # released: taken at once, next fence
    assert la2 is not None and la2.fence == 3
    assert [(x.name, x.holder, x.fence) for x in b.all()] == [(ACCOUNT, "daemon-a@host1", 3)]


def test_a_lapsed_holder_that_wakes_makes_no_call(daemons, clock: Clock):
    """A is paused past its lease (SIGSTOP, a long GC, a network partition); B takes over and
    records its intent; A wakes and tries its intent: refused in the append's transaction,
    nothing appended, so A makes no provider call."""
    a, b = daemons
    a.store.append("J", [NewEvent("CancelRequested", {"reason": "setup"})])  # the job exists (version 1)
    la = a.acquire(ACCOUNT, TTL, clock())
    clock.advance(TTL + 1)
    lb = b.acquire(ACCOUNT, TTL, clock())
    assert lb is not None and lb.fence == la.fence + 1
    stored = b.append_intent(lb, "J", [upload()], expected_version=1, bound=BOUND, now=clock())
    with pytest.raises(LeaseLost, match="no call is made"):
        a.append_intent(la, "J", [upload(1)], expected_version=2, bound=BOUND, now=clock())
    assert [e.type for e in a.store.read(job_id="J")] == ["CancelRequested", "UploadStarted"]
    assert a.fences_of("J") == {stored[0].seq: (ACCOUNT, "daemon-b@host2", 2)}


def test_a_holder_whose_lease_is_shorter_than_the_calls_bound_makes_no_call(daemons, clock: Clock):
    a, _ = daemons
    la = a.acquire(ACCOUNT, TTL, clock())
    clock.advance(TTL - BOUND + 1)  # held, but a call now could outlast the lease
    assert not la.may_call(clock(), BOUND)
    with pytest.raises(LeaseTooShort, match="less than the call's bound"):
        a.append_intent(la, "J", [upload()], expected_version=0, bound=BOUND, now=clock())
    assert list(a.store.read()) == []
    la = a.renew(la, TTL, clock())
    assert la.may_call(clock(), BOUND)
    stored = a.append_intent(la, "J", [upload()], expected_version=0, bound=BOUND, now=clock())
    assert a.fences_of("J") == {stored[0].seq: (ACCOUNT, "daemon-a@host1", 1)}


def test_many_daemons_acquiring_at_once_get_one_holder(pg_url: str, clock: Clock):
    stores = [PostgresEventStore(pg_url) for _ in range(4)]
    try:
        leases = [Leases(s, f"d{i}") for i, s in enumerate(stores)]
        barrier = threading.Barrier(len(leases))
        got: list[Lease | None] = []

        def take(x: Leases) -> None:
            barrier.wait(timeout=30)
            got.append(x.acquire(ACCOUNT, TTL, clock()))

        threads = [threading.Thread(target=take, args=(x,)) for x in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        winners = [g for g in got if g is not None]
        assert len(got) == 4 and len(winners) == 1 and winners[0].fence == 1
    finally:
        for s in stores:
            s.close()


def test_job_leases_split_the_work_and_a_dead_daemons_job_is_taken_over(daemons, clock: Clock):
    a, b = daemons
    jobs = [job_lease(j) for j in ("j1", "j2", "j3")]
    la = a.acquire_any(jobs, TTL, clock())
    lb = b.acquire_any(jobs, TTL, clock())
    assert la is not None and lb is not None and la.name != lb.name
    lb2 = b.acquire_any([j for j in jobs if j != lb.name], TTL, clock())
    assert lb2 is not None and lb2.name not in (la.name, lb.name)
    assert b.acquire_any(jobs, TTL, clock()) is not None  # b may take again what it holds (a renewal) ...
    assert b.acquire_any([la.name], TTL, clock()) is None  # ... but not a's
    clock.advance(TTL / 2)
    b.renew(lb, TTL, clock())
    b.renew(lb2, TTL, clock())
    clock.advance(TTL / 2 + 1)  # a stopped renewing (died): its job is free, the others are not
    taken = b.acquire_any(jobs, TTL, clock())
    assert taken is not None and taken.fence in (1, 2)
    assert b.acquire(la.name, TTL, clock()).fence == 2


def test_a_takeover_waits_for_an_intent_being_committed_under_the_old_fence(daemons, clock: Clock, pg_url: str):
    """The intent's lease check holds the lease row FOR SHARE until its append commits: a takeover
    at that moment waits, so an intent is never recorded under a fence already superseded."""
    a, b = daemons
    la = a.acquire(ACCOUNT, TTL, clock())
    inside, release = threading.Event(), threading.Event()

    def hold(_conn: Any) -> None:  # runs after the lease check, inside A's transaction
        inside.set()
        assert release.wait(timeout=30)

    t = threading.Thread(
        target=lambda: a.append_intent(la, "J", [upload()], expected_version=0, bound=BOUND, now=clock(), also=hold)
    )
    t.start()
    assert inside.wait(timeout=30)
    later = clock() + TTL + 1
    got: list[Lease | None] = []
    tb = threading.Thread(target=lambda: got.append(b.acquire(ACCOUNT, TTL, later)))
    tb.start()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        wait_until(lambda: admin.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0] >= 1)
    assert got == []  # B waits for A's intent transaction
    release.set()
    t.join(timeout=30)
    tb.join(timeout=30)
    assert got[0] is not None and got[0].fence == 2
    assert list(b.fences_of("J").values()) == [(ACCOUNT, "daemon-a@host1", 1)]


def test_a_lease_outlives_its_holders_connections_being_killed(daemons, clock: Clock, pg_url: str):
    """Unlike a session advisory lock, a lease row is not tied to a connection: the server killing
    the holder's connections (pg_terminate_backend) loses nothing; the holder renews and appends
    its intent through a new connection, and an intent whose connection dies writes nothing."""
    a, b = daemons
    la = a.acquire(ACCOUNT, TTL, clock())
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]
    assert killed >= 2  # both daemons' pooled connections
    assert b.acquire(ACCOUNT, TTL, clock()) is None  # still A's
    la = a.renew(la, TTL, clock())

    def kill_own_connection(conn: Any) -> None:  # after the check and the fence record, before the commit
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))

    with pytest.raises(psycopg.OperationalError):
        a.append_intent(la, "J", [upload()], expected_version=0, bound=BOUND, now=clock(), also=kill_own_connection)
    assert list(a.store.read()) == [] and a.fences_of("J") == {}
    stored = a.append_intent(la, "J", [upload()], expected_version=0, bound=BOUND, now=clock())
    assert a.fences_of("J") == {stored[0].seq: (ACCOUNT, "daemon-a@host1", 1)}


def test_without_a_clock_the_databases_own_clock_decides(daemons):
    a, b = daemons
    la = a.acquire(ACCOUNT, TTL)
    assert la is not None and b.acquire(ACCOUNT, TTL) is None
    assert la.may_call(la.acquired_at, BOUND)


def wait_until(cond: Any, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_helpers_are_the_other_live_daemons_holding_no_account(daemons, clock: Clock, pg_url: str):
    """``Leases.helpers``: the daemons other than this one whose ``daemon:`` lease is unexpired
    and that hold no account's lease (a lapsed account lease does not count)."""
    from batchgrader.store.leases import daemon_lease

    a, b = daemons
    store = PostgresEventStore(pg_url)
    try:
        c = Leases(store, "daemon-c@host3")
        for d in (a, b, c):
            assert d.acquire(daemon_lease(d.holder), TTL, clock()) is not None
        assert a.acquire(ACCOUNT, TTL, clock()) is not None
        assert (a.helpers(clock()), b.helpers(clock()), c.helpers(clock())) == (2, 1, 1)  # b and c; c; b
        other = c.acquire(account_lease("openai", "org-2:proj-2"), TTL / 2, clock())
        assert other is not None
        assert a.helpers(clock()) == 1  # c holds an account now
        clock.advance(TTL / 2)  # c's account lease lapses; the daemon leases have TTL / 2 left
        assert a.helpers(clock()) == 2
        clock.advance(TTL)  # every daemon lease lapsed: nobody is live
        assert a.helpers(clock()) == 0
    finally:
        store.close()

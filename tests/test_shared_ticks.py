"""Several daemons on one PostgreSQL store, tick by tick (daemon/shared.py): two real Engines,
each on its own connection to a real PostgreSQL server, one home, the in-memory provider (one
provider account) and one fake clock that the leases are decided at.  No subprocess, no sleeps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.core.log.events import NewEvent
from batchgrader.daemon.engine import Engine
from batchgrader.daemon.shared import ASK_AGAIN, CALL_INTENTS, SharedWork
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.memory import MemoryProvider
from batchgrader.provider.protocol import BatchInfo
from batchgrader.store.leases import LeaseLost, Leases, job_lease
from ticks import SHARED_CONFIG, SHARED_TTL, config_text, shared_engines

TTL = SHARED_TTL  # lease_seconds
WRITES = ("upload", "create_batch", "cancel", "delete_file")


class PausingProvider(MemoryProvider):
    """The in-memory provider, whose next call of an operation can be made to last past the
    leases' lifetime (:meth:`pause_next`: the daemon making it is paused mid-action, while
    ``meanwhile``, another daemon's work, happens)."""

    def __init__(self) -> None:
        super().__init__()
        self.paused: dict[str, Callable[[], None]] = {}

    def pause_next(self, operation: str, meanwhile: Callable[[], None]) -> None:
        self.paused[operation] = meanwhile

    def _pause(self, operation: str) -> None:
        meanwhile = self.paused.pop(operation, None)
        if meanwhile is not None:
            meanwhile()

    def cancel(self, batch_id: str) -> BatchInfo:
        self._pause("cancel")
        return super().cancel(batch_id)

    def delete_file(self, file_id: str) -> bool:
        self._pause("delete_file")
        return super().delete_file(file_id)


class Pair:
    """Two daemons, ``a`` and ``b`` (or one per letter of ``names``), on one shared store and home."""

    def __init__(self, home: Home, pg_url: str, config: str = "", names: str = "ab") -> None:
        self.home = home
        home.config_file.write_text(config_text(SHARED_CONFIG + config))
        self.provider = PausingProvider()
        self.now = 1_000_000.0
        self.provider.now = self.now
        self.stores, self.engines = shared_engines(home, pg_url, self.provider, lambda: self.now, names)

    def close(self) -> None:
        for s in self.stores:
            s.close()

    def tick(self, name: str, seconds: float = 1.0) -> list[tuple[str, str]]:
        """Move the clock, run one tick of daemon ``name``: the (job, event type) it appended."""
        before = self.stores[0].last_seq()
        self.now += seconds
        self.provider.now = self.now
        self.engines[name].tick(self.now)
        return [(e.job_id, e.type) for e in self.stores[0].read(after=before)]

    def writes(self) -> int:
        return sum(1 for op, _ in self.provider.calls if op in WRITES)

    def holder(self, lease: str) -> Any:
        current = self.engines["a"].shared.leases.current(lease)  # type: ignore[union-attr]
        return None if current is None else (current.holder if current.expires_at > self.now else None)

    def drop(self, name: str = "a.csv", rows: int = 3, word: str = "review") -> None:
        (self.home.inbox / name).write_text("id,response\n" + "".join(f"{i},{word} {i}\n" for i in range(rows)))
        for engine in self.engines.values():
            engine.scan_requested = True  # as each daemon's inbox watcher would

    def job_id(self, file: str = "a.csv") -> str:
        (job,) = [j for j in self.engines["a"].ctx.state.jobs.values() if j.file == file]
        return job.job_id


@pytest.fixture
def pair(home: Home, pg_url: str):
    p = Pair(home, pg_url)
    yield p
    p.close()


def _until_created(pair: Pair, name: str) -> str:
    """Tick daemon ``name`` until a.csv's batch is created; its job id."""
    pair.drop()
    for _ in range(6):
        if ("BatchCreated" in {t for _, t in pair.tick(name)}) and pair.provider.batches:
            return pair.job_id()
    raise AssertionError("no batch created")


def test_two_daemons_never_both_act_on_one_job(pair: Pair):
    """While ``a`` holds a job's lease, ``b`` appends nothing to it and makes no provider call,
    however many of its ticks find the job due.  ``a``, the account's holder, leaves the polls
    and the local work (download, merge, the result) to ``b``, which holds no account; ``b``
    leaves the deletes to ``a``, which ends the job and releases its lease."""
    job_id = _until_created(pair, "a")
    assert pair.holder(job_lease(job_id)) == "a"
    pair.tick("b")  # b folds the job (its first look at the log)
    pair.provider.finish_all()
    writes = pair.writes()
    retrieves = sum(1 for op, _ in pair.provider.calls if op == "retrieve")
    for _ in range(5):
        assert pair.tick("b", 2.0) == []  # the batch has ended, and b's own timers say poll: b leaves it
    assert pair.writes() == writes
    assert sum(1 for op, _ in pair.provider.calls if op == "retrieve") == retrieves
    assert pair.tick("a") == []  # a leaves the poll, and the local work after it, to b
    assert pair.holder(job_lease(job_id)) is None
    # b asks again for the lease it was refused within ASK_AGAIN s (a leaves the job to it for twice that)
    by_b = [t for _, t in pair.tick("b", ASK_AGAIN)]
    assert {"OutputDownloaded", "ChunkCompleted", "ResultWritten"} <= set(by_b)
    assert "ProviderFileDeleteRequested" not in by_b and pair.writes() == writes  # the deletes are a's
    appended = pair.tick("a")
    assert (job_id, "JobCompleted") in appended and (job_id, "ChunkCompleted") not in appended
    assert pair.engines["a"].ctx.state.jobs[job_id].ended == "completed"
    assert pair.holder(job_lease(job_id)) is None  # released at the end
    assert len(pair.provider.batches) == 1
    assert [r.split(",")[0] for r in (pair.home.outbox / "a_results.csv").read_text().splitlines()[1:]] == ["0", "1", "2"]


def test_an_input_is_claimed_by_one_daemon_and_the_job_of_a_dead_daemon_is_taken_over(pair: Pair):
    """Both daemons see the same inbox file: the database gives it to one.  That daemon dies
    after its batch was created; the other carries the job on, and once the dead one's account
    lease has lapsed takes it (the next fence) for the deletes: one batch, every row answered once."""
    pair.drop()
    pair.tick("a")  # first look: not yet stable
    pair.tick("b")
    assert [t for _, t in pair.tick("a")][:2] == ["JobAccepted", "JobPrepared"]
    assert [t for _, t in pair.tick("b")] == []  # b found the same file: claimed already, in the database
    job_id = pair.job_id()
    created = pair.tick("a")
    assert (job_id, "BatchCreated") in created
    # a let the job go when it began to wait (b is live and holds no account), and dies here: no
    # more ticks of a.  b polls, merges and writes the result, but calls nothing while a's
    # account lease lives ...
    pair.provider.finish_all()
    writes = pair.writes()
    for _ in range(int(TTL // 5)):
        assert not {t for _, t in pair.tick("b", 4.0)} & CALL_INTENTS
    assert pair.writes() == writes
    assert (pair.home.outbox / "a_results.csv").exists()
    # ... and deletes the files, and ends the job, once it has lapsed (the account's next fence)
    for _ in range(3):
        pair.tick("b", 5.0)
    job = pair.engines["b"].ctx.state.jobs[job_id]
    assert job.ended == "completed"
    account = pair.engines["b"].account_of(job)
    lease = pair.engines["b"].shared.leases.current(account)  # type: ignore[union-attr]
    assert lease is not None and lease.holder == "b" and lease.fence == 2
    fences = pair.engines["b"].shared.leases.fences_of(job_id)  # type: ignore[union-attr]
    assert {f for _, f, _ in fences.values()} == {"a", "b"}
    assert len(pair.provider.batches) == 1
    rows = (pair.home.outbox / "a_results.csv").read_text().splitlines()[1:]
    assert sorted(r.split(",")[0] for r in rows) == ["0", "1", "2"]


def test_a_new_account_holder_reconciles_the_old_holders_open_create_before_sending(pair: Pair):
    """``a`` sends a create that the provider carries out, but the reply is lost and its listing
    fails: a dies with the intent open.  ``b``, the account's next holder, treats it as an unknown
    outcome: it lists the provider's batches by ``bg_key`` and adopts the batch; none is created
    twice."""
    pair.drop()
    pair.tick("a")
    pair.tick("a")  # accepted, prepared
    job_id = pair.job_id()
    pair.provider.fail_next("create_batch", "lost")  # carried out, the reply lost
    pair.provider.fail_next("find_batches", "unavailable")  # and a's listing fails: a stops here
    appended = [t for _, t in pair.tick("a")]
    assert appended[-1] == "BatchCreateRequested" and len(pair.provider.batches) == 1
    # a dies; b takes the job and the account once a's leases lapse
    for _ in range(8):
        pair.tick("b", 5.0)
    job = pair.engines["b"].ctx.state.jobs[job_id]
    assert job.chunks[0].batch_id == next(iter(pair.provider.batches))  # adopted, not created again
    assert sum(1 for op, _ in pair.provider.calls if op == "create_batch") == 1
    created = [e.payload for e in pair.stores[0].read(job_id=job_id) if e.type == "BatchCreated"]
    assert [c["reconciled"] for c in created] == [True]


def test_intents_record_the_account_lease_fence(pair: Pair):
    job_id = _until_created(pair, "a")
    leases = pair.engines["a"].shared.leases  # type: ignore[union-attr]
    fences = leases.fences_of(job_id)
    intents = {e.seq: e.type for e in pair.stores[0].read(job_id=job_id) if e.type in ("UploadStarted", "BatchCreateRequested")}
    assert set(intents) <= set(fences)
    account = pair.engines["a"].account_of(pair.engines["a"].ctx.state.jobs[job_id])
    assert {fences[s] for s in intents} == {(account, "a", 1)}


def test_a_paused_holder_that_wakes_makes_no_provider_call(pair: Pair):
    """``a`` holds the account's lease and is about to upload a chunk: it is paused past the
    lease's lifetime, ``b`` takes the account over, ``a`` wakes: its intent is refused in the
    append's transaction, nothing is appended and no call leaves (the engine leaves the job)."""
    from batchgrader.core.rules.actions import Upload

    pair.drop()
    pair.tick("a")
    pair.tick("a")  # accepted, prepared: the next action is the upload
    job_id = pair.job_id()
    a = pair.engines["a"]
    job = a.ctx.state.jobs[job_id]
    account = a.account_of(job)
    upload = Upload(job_id, 0, 1, "x.jsonl")
    with a.shared.acting(job_id, upload, account) as allowed:  # type: ignore[union-attr]
        assert allowed  # a holds the account's lease, fresh
        pair.now += TTL + 1  # a is paused (SIGSTOP) past the lease's lifetime
        assert pair.engines["b"].shared.account(account) is not None  # type: ignore[union-attr]
        version = a.ctx.state.jobs[job_id].version
        with pytest.raises(LeaseLost):
            a.ctx.emit(job_id, NewEvent("UploadStarted", {"chunk": 0, "attempt": 1, "filename": "x.jsonl", "bytes": 1}))
        assert a.ctx.state.jobs[job_id].version == version  # nothing appended
    writes = pair.writes()
    appended = pair.tick("a", 0.0)  # a's next tick: the account is b's, the job handed over
    assert not [t for _, t in appended if t == "UploadStarted"]
    assert pair.writes() == writes == 0
    assert pair.holder(job_lease(job_id)) is None  # a let the job go: the account's holder takes it
    assert "UploadStarted" in {t for _, t in pair.tick("b")}
    assert sum(1 for op, _ in pair.provider.calls if op == "upload") == 1  # b's, under the account's next fence


def _account_taken_by_b(pair: Pair, account: str) -> Callable[[], None]:
    """What happens while ``a`` is paused in a call: the leases' lifetime passes, ``b`` takes the account."""

    def meanwhile() -> None:
        pair.now += TTL + 1
        pair.provider.now = pair.now
        assert pair.engines["b"].shared.account(account) is not None  # type: ignore[union-attr]

    return meanwhile


def _intents(pair: Pair, job_id: str, kind: str) -> list[tuple[Any, tuple[str, str, int] | None]]:
    """(payload, (lease, holder, fence) it was appended under) of each ``kind`` intent of the job."""
    fences = pair.engines["a"].shared.leases.fences_of(job_id)  # type: ignore[union-attr]
    return [(e.payload, fences.get(e.seq)) for e in pair.stores[0].read(job_id=job_id) if e.type == kind]


def test_cancels_are_fenced_a_holder_that_lost_the_account_cancels_nothing_more(home: Home, pg_url: str):
    """A cancelled job with two running batches: ``a``'s first cancel lasts past the leases'
    lifetime and ``b`` takes the account meanwhile.  The second cancel's intent is refused in its
    append's transaction: nothing appended, no second call from ``a``.  ``b`` then takes the job
    and cancels under the account's next fence."""
    from batchgrader.daemon.control import apply_control

    pair = Pair(home, pg_url, "split_row_limit: 2\n")
    try:
        pair.drop(rows=4)
        for _ in range(8):
            pair.tick("a")
            if len(pair.provider.batches) == 2 and all(b.status != "validating" for b in pair.provider.batches.values()):
                break
        assert len(pair.provider.batches) == 2
        job_id = pair.job_id()
        a = pair.engines["a"]
        account = a.account_of(a.ctx.state.jobs[job_id])
        assert apply_control(a, {"action": "cancel", "job_id": job_id, "reason": "test"}) is None
        pair.provider.pause_next("cancel", _account_taken_by_b(pair, account))
        appended = pair.tick("a", 0.0)
        assert [t for _, t in appended if t == "BatchCancelRequested"] == ["BatchCancelRequested"]
        assert [op for op, _ in pair.provider.calls if op == "cancel"] == ["cancel"]  # the second one never left
        (first,) = _intents(pair, job_id, "BatchCancelRequested")
        assert first[0]["reason"] == "cancelled" and first[1] == (account, "a", 1)
        cancels = sum(1 for op, _ in pair.provider.calls if op == "cancel")
        for _ in range(3):
            pair.tick("a")
        assert sum(1 for op, _ in pair.provider.calls if op == "cancel") == cancels  # a makes no call any more
        for _ in range(3):
            pair.tick("b")
        later = _intents(pair, job_id, "BatchCancelRequested")[1:]
        assert later and {f for _, f in later} == {(account, "b", 2)}  # b's, under the next fence
        assert sum(1 for op, _ in pair.provider.calls if op == "cancel") == cancels + len(later)  # one call per intent
        assert {b.status for b in pair.provider.batches.values()} == {"cancelling"}
    finally:
        pair.close()


def test_deletes_are_fenced_a_holder_that_lost_the_account_deletes_nothing_more(pair: Pair):
    """At a job's end ``a`` deletes its files at the provider, each delete's intent appended
    through the fence check: the first delete lasts past the leases' lifetime and ``b`` takes
    the account meanwhile; the second intent is refused, no second delete leaves ``a``.  ``b``
    finishes the job: its deletes under the account's next fence, one ``JobCompleted``."""
    job_id = _until_created(pair, "a")
    account = pair.engines["a"].account_of(pair.engines["a"].ctx.state.jobs[job_id])
    pair.provider.finish_all()
    pair.provider.pause_next("delete_file", _account_taken_by_b(pair, account))
    appended = [t for _, t in pair.tick("a")]
    assert "ResultWritten" in appended and "JobCompleted" not in appended
    assert appended.count("ProviderFileDeleteRequested") == 1
    assert [op for op, _ in pair.provider.calls if op == "delete_file"] == ["delete_file"]
    for _ in range(3):
        pair.tick("a")
    assert [op for op, _ in pair.provider.calls if op == "delete_file"] == ["delete_file"]  # none more from a
    for _ in range(3):
        pair.tick("b")
    assert pair.engines["b"].ctx.state.jobs[job_id].ended == "completed"
    intents = _intents(pair, job_id, "ProviderFileDeleteRequested")
    assert intents[0][1] == (account, "a", 1)
    assert len(intents) == 3 and {f for _, f in intents[1:]} == {(account, "b", 2)}  # b asks both again
    assert sum(1 for op, _ in pair.provider.calls if op == "delete_file") == len(intents)
    assert not pair.provider.files  # every file of the job deleted
    types = [e.type for e in pair.stores[0].read(job_id=job_id)]
    assert types.count("JobCompleted") == 1 and types.count("ResultWritten") == 1


def test_a_control_request_is_applied_once_whichever_daemons_see_it(pair: Pair):
    """``bgctl cancel`` leaves one file in the shared home's control/ that both daemons list.
    ``b`` (not the job's holder) applies it: ``CancelRequested`` with its claim, in one
    transaction.  ``a`` had listed the same file before ``b`` removed it: its append is refused by
    the claim, nothing is appended twice, and ``a``, the job's holder, cancels the batch once."""
    from batchgrader.core.host.control_files import pending_controls, request_control
    from batchgrader.daemon.control import apply_controls
    from batchgrader.store.claims import control_claimed

    job_id = _until_created(pair, "a")
    path = request_control(pair.home, "cancel", job_id, "not needed")
    seen_by_a = path.read_bytes()  # a lists control/ and reads the request ...
    apply_controls(pair.engines["b"], pair.home)  # ... while b applies it and removes the file
    assert pending_controls(pair.home) == []
    path.write_bytes(seen_by_a)  # what a read before the removal
    apply_controls(pair.engines["a"], pair.home)
    assert pending_controls(pair.home) == [] and not (pair.home.root / "control" / "rejected").exists()
    types = [e.type for e in pair.stores[0].read(job_id=job_id)]
    assert types.count("CancelRequested") == 1
    assert control_claimed(pair.engines["a"].shared.leases, path.name) == "b"  # type: ignore[union-attr]
    for _ in range(3):
        pair.tick("a")
        pair.tick("b")
    assert sum(1 for op, _ in pair.provider.calls if op == "cancel") == 1
    assert [e.type for e in pair.stores[0].read(job_id=job_id)].count("BatchCancelRequested") == 1


def _by_engine(appended: dict[str, list[tuple[str, str]]], job_id: str, kind: str) -> list[str]:
    """The daemons that appended each ``kind`` event of the job, in order."""
    return [name for name, events in appended.items() for j, t in events if j == job_id and t == kind]


@pytest.fixture
def trio(home: Home, pg_url: str):
    t = Pair(home, pg_url, "split_row_limit: 2\n", names="abc")
    yield t
    t.close()


def test_the_account_holder_leaves_merging_and_the_result_to_a_daemon_without_an_account(trio: Pair):
    """Three daemons, one account: ``a`` claims, prepares and sends (it takes the account at its
    first upload), polls, and leaves the downloads, merges and the result to a daemon that holds
    no account (``b`` here, the first to ask); that daemon leaves the deletes to ``a``.  Every
    intent is ``a``'s, under the account's one fence; each chunk is merged once."""
    for name in "abc":
        trio.tick(name)  # each daemon live (its daemon: lease)
    job_id = _until_created(trio, "a")
    account = trio.engines["a"].account_of(trio.engines["a"].ctx.state.jobs[job_id])
    trio.provider.finish_all()
    log: dict[str, list[tuple[str, str]]] = {name: [] for name in "abc"}
    log["a"] += trio.tick("a")  # polls: both batches have ended, the downloads are local work
    assert trio.holder(job_lease(job_id)) is None
    log["b"] += trio.tick("b", ASK_AGAIN)
    assert {"ChunkCompleted", "ResultWritten"} <= {t for _, t in log["b"]}
    assert trio.holder(job_lease(job_id)) is None  # b let it go at the deletes
    writes = trio.writes()
    log["c"] += trio.tick("c")  # the deletes need the account: c leaves them too
    assert not {t for _, t in log["c"]} & CALL_INTENTS and trio.writes() == writes
    log["a"] += trio.tick("a")
    job = trio.engines["a"].ctx.state.jobs[job_id]
    assert job.ended == "completed" and len(job.chunks) == 2
    assert _by_engine(log, job_id, "ChunkCompleted") == ["b", "b"]
    assert _by_engine(log, job_id, "ResultWritten") == ["b"]
    assert _by_engine(log, job_id, "JobCompleted") == ["a"]
    fences = trio.engines["a"].shared.leases.fences_of(job_id)  # type: ignore[union-attr]
    assert fences and set(fences.values()) == {(account, "a", 1)}
    assert sum(1 for op, _ in trio.provider.calls if op in WRITES) == len(fences)  # one call per fenced intent


def test_a_lone_daemon_does_all_the_work_and_a_silent_one_delays_it_a_bounded_time(pair: Pair):
    """A job is never left waiting for a daemon that does not come: ``a`` alone (``b`` never ran)
    merges at once; with ``b`` live but not asking, ``a`` leaves each stretch of local work (the
    preparing; the polls, download, merge and result after the batch) to it for ``leave_for`` seconds,
    then does it itself; once ``b``'s lease has lapsed (``b`` died), ``a`` does not wait at all."""
    job_id = _until_created(pair, "a")
    pair.provider.finish_all()
    assert (job_id, "ChunkCompleted") in pair.tick("a")  # nobody else is live
    assert pair.engines["a"].ctx.state.jobs[job_id].ended == "completed"

    pair.tick("b")  # b live, then silent
    pair.drop("b.csv", word="second")  # not a's answers again: sent and merged
    shared = pair.engines["a"].shared
    assert shared is not None
    at: dict[str, float] = {}
    for _ in range(60):
        for _, t in pair.tick("a"):
            at.setdefault(t, pair.now)
        pair.provider.finish_all()
        if "JobCompleted" in at:
            break
    assert "JobCompleted" in at, "a left the job to a daemon that never took it"
    assert shared.leave_for <= at["JobPrepared"] - at["JobAccepted"] <= shared.leave_for + 1.0  # left to b a while
    # the polls too (from the first one due); then a does the rest at once
    assert shared.leave_for <= at["OutputDownloaded"] - at["BatchCreated"] <= shared.leave_for + 2.0
    assert at["BatchStatusChanged"] == at["ChunkCompleted"] == at["ResultWritten"] == at["OutputDownloaded"]
    assert at["JobCompleted"] - at["JobAccepted"] <= 3 * shared.leave_for

    pair.now += TTL  # b's lease lapses (b died): a is alone again and leaves nothing
    pair.drop("c.csv", word="third")
    appended: list[str] = []
    for _ in range(6):
        appended += [t for _, t in pair.tick("a")]
        pair.provider.finish_all()
    assert appended.count("JobCompleted") == 1


def test_three_daemons_in_any_order_spread_the_local_work_and_one_makes_every_call(trio: Pair):
    """Four inputs, three daemons ticking in a random (seeded) order, batches ending now and
    then: every job completes; each chunk is merged once and each result written once; every
    intent was made by the one daemon holding the account, under its one fence, and that daemon
    merged nothing and wrote no result: those were the others'."""
    import random

    rnd = random.Random(37)
    for name in "abc":
        trio.tick(name)
    for k in range(4):
        trio.drop(f"f{k}.csv", rows=4, word=f"file{k}")
    log: dict[str, list[tuple[str, str]]] = {name: [] for name in "abc"}
    for _ in range(300):
        name = rnd.choice("abc")
        log[name] += trio.tick(name, rnd.choice((0.5, 1.0, 2.0)))
        if rnd.random() < 0.2:
            trio.provider.finish_all()
        states = trio.engines["a"].ctx.state.jobs.values()
        if len(states) == 4 and all(j.ended for j in states):
            break
    jobs = list(trio.engines["a"].ctx.state.jobs.values())
    assert len(jobs) == 4 and {j.ended for j in jobs} == {"completed"}
    holders = set()
    for job in jobs:
        events = [e.type for e in trio.stores[0].read(job_id=job.job_id)]
        assert events.count("ChunkCompleted") == len(job.chunks) == 2
        assert events.count("ResultWritten") == 1
        holders |= {h for _, h, _ in trio.engines["a"].shared.leases.fences_of(job.job_id).values()}  # type: ignore[union-attr]
        rows = (trio.home.outbox / f"{job.file.removesuffix('.csv')}_results.csv").read_text().splitlines()[1:]
        assert sorted(r.split(",")[0] for r in rows) == ["0", "1", "2", "3"]
    (caller,) = holders
    merged = {name for name, events in log.items() for _, t in events if t in ("ChunkCompleted", "ResultWritten")}
    assert merged and caller not in merged
    assert sum(1 for op, _ in trio.provider.calls if op in WRITES) == sum(
        len(trio.engines["a"].shared.leases.fences_of(j.job_id))  # type: ignore[union-attr]
        for j in jobs
    )


def test_a_row_refused_on_the_synchronous_route_fails_and_the_job_ends_on_a_shared_store(home: Home, pg_url: str):
    """A row the provider refused for good on the synchronous route is taken at prepare as a
    failed answer under a key of ours alone, which is never asked of the answers store: in
    PostgreSQL (whose text refuses a NUL byte) that lookup raised at every prepare, and the job
    never ended.  Found by the combination matrix's shared store."""
    pair = Pair(home, pg_url, "route: online\nmodel: gpt-5.4-mini\nonline_concurrency: 1\n")
    try:
        pair.provider.fail_next("complete", "refused", status_code=400, message="the request is wrong", match="-2")
        pair.drop(rows=3)
        for _ in range(12):
            for name in "ab":
                pair.tick(name)
            pair.engines["a"].ctx.catch_up()
            job = pair.engines["a"].ctx.state.jobs.get(pair.job_id()) if pair.engines["a"].ctx.state.jobs else None
            if job is not None and job.ended:
                break
        assert job is not None and job.ended == "completed_with_errors"
        assert (job.succeeded_rows, len(job.failed_rows)) == (2, 1)
        assert pair.writes() == 0  # every row through the synchronous route: no upload, no batch
    finally:
        pair.close()


def test_a_job_let_go_for_the_account_holder_is_taken_at_its_next_tick(pair: Pair):
    """A job whose next call needs the account another daemon holds is let go by its holder, and
    taken by the account's holder at its very next tick (the release is announced: ReleaseWatch
    wakes it, and SharedWork.recheck asks again for what it was refused), not after ASK_AGAIN:
    a cancel reaches the provider at once."""
    job_id = _until_created(pair, "a")
    pair.tick("b", 0.1)  # b's first look: a holds the job, b is refused
    pair.tick("a", 0.1)  # a leaves the polls to b, which holds no account: released
    assert pair.holder(job_lease(job_id)) is None
    pair.tick("b", 0.1)  # refused a moment ago, asked again at once: the lease is free
    assert pair.holder(job_lease(job_id)) == "b"  # b polls; a holds the account
    pair.engines["a"].ctx.catch_up()  # as a daemon applying `bgctl cancel` does (daemon/control.py)
    pair.engines["a"].ctx.emit(job_id, NewEvent("CancelRequested", {"reason": "test"}))
    pair.tick("a", 0.1)  # b holds the job: a is refused
    assert pair.provider.calls.count(("cancel", next(iter(pair.provider.batches)))) == 0
    pair.tick("b", 0.1)  # the next action is a cancel, on a's account: b lets the job go
    assert pair.holder(job_lease(job_id)) is None
    pair.tick("a", 0.1)  # well within ASK_AGAIN
    assert [op for op, _ in pair.provider.calls if op == "cancel"] == ["cancel"]  # by a, under the account's fence


def test_a_hand_over_wakes_only_the_daemons_it_is_for(pair: Pair):
    """ReleaseWatch: a job let go for a daemon holding an account (``call``) wakes such a daemon,
    one let go for daemons holding none (``work``) wakes those; a plain release, a daemon's own
    release, and a hand-over to the other kind wake nobody (two daemons that cannot carry a job
    on never pass it between them)."""
    import threading

    from batchgrader.daemon.shared import ReleaseWatch
    from batchgrader.store.leases import account_lease

    a, b = pair.engines["a"].shared, pair.engines["b"].shared
    assert a is not None and b is not None
    woken = threading.Event()
    watch = ReleaseWatch(a, woken.set, interval=0.2).start()

    def release(by: Any, announce: str | None) -> bool:
        lease = by.leases.acquire(job_lease("x"), TTL, pair.now)
        assert lease is not None
        woken.clear()
        assert by.leases.release(lease, announce)
        return woken.wait(1.0)

    try:
        assert not release(b, None)  # a release that hands nothing over
        assert not release(b, "call")  # a holds no account: a call is not for it
        assert release(b, "work")
        assert a.account(account_lease("openai", "default")) is not None
        assert release(b, "call")
        assert not release(b, "work")  # a holds an account now
        assert not release(a, "call")  # its own
        assert a.leases.free([job_lease("x")], pair.now) == {job_lease("x")}
    finally:
        watch.stop()

"""Issue 38: the daemon never sleeps past work that is due.

Job states are generated (hypothesis) by driving the real engine through ``tick(now)`` with the
in-memory provider and a fake clock: batches that end in their create reply, while polled or
when told, faults on every call (a lost create: its settle wait; a 429 with Retry-After on the
synchronous route; a failed download; an unwritable outbox), cancels, deadlines (their
straggler thresholds), a preflight the provider cannot answer.  After every tick the time the
daemon would sleep until (:meth:`Engine.next_due`, without the inbox's rescan: work already
known never waits for it) is checked against the rules themselves: at no time before it does
:func:`~batchgrader.core.rules.decide.decide_job` have an action for any job, and work due now is
done by ticking, never looped on.  Then the polling pace: a running batch is seen ended
within the documented bound (15 % of its age, at least 0.5 s) plus one tick, whatever
``poll_interval_seconds`` says, and its download is asked for in the same tick.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchgrader.core.host.home import Home
from batchgrader.core.rules.due import acts_now
from batchgrader.core.rules.polling import AGE_FRACTION, MIN_DELAY
from batchgrader.provider.memory import MemoryProvider
from batchgrader.store.eventstore import NewEvent
from ticks import Rig

QUIET = "rescan_interval_seconds: 86400\n"  # the inbox's rescan never comes in these runs
CONFIGS = {
    "batch": "",
    "errors": "",  # some rows answer with an error: an error file to download besides the output
    "deadline": "deadline: 2h\nmodel: gpt-4.1-nano\n",
    "online": "route: online\nonline_concurrency: 1\n",
    "preflight": "preflight_rows: 2\n",
    "limit": "enqueued_token_limit: {gpt-4.1-nano: 40}\nmodel: gpt-4.1-nano\nsplit_row_limit: 2\n",
}
#: seconds from a batch's create to its end (None: only when the test says so; 0: in the create reply)
LIFETIMES = (None, 0.0, 0.6, 6.0, 45.0)
FAULTS = (
    ("create_batch", "lost", {}),
    ("create_batch", "dropped", {}),
    ("create_batch", "refused", {"status_code": 429, "message": "Rate limit reached", "code": "rate_limit_exceeded"}),
    ("upload", "lost", {}),
    ("upload", "unavailable", {}),
    ("retrieve", "unavailable", {}),
    ("list_batches", "unavailable", {}),
    ("download", "unavailable", {}),
    ("find_batches", "unavailable", {}),
    ("cancel", "unavailable", {}),
    ("complete", "unavailable", {}),
    ("complete", "refused", {"status_code": 429, "message": "Rate limit reached", "retry_after": 40.0}),
)
OPS = st.one_of(
    st.tuples(st.just("tick"), st.sampled_from((0.05, 0.5, 2.0, 7.0, 60.0, 700.0))),
    st.tuples(st.just("due")),
    st.tuples(st.just("finish")),
    st.tuples(st.just("fault"), st.sampled_from(range(len(FAULTS)))),
    st.tuples(st.just("cancel")),
    st.tuples(st.just("outbox"), st.booleans()),
    st.tuples(st.just("drop")),
)
#: offsets (s) after a tick at which the rules are asked whether they act
PROBES = (0.0, 0.01, 0.3, 0.51, 1.0, 2.5, 6.0, 20.0, 41.0, 100.0, 601.0, 3000.0, 7300.0)


class Driver:
    """A rig whose provider's timed batches move with the clock."""

    def __init__(self, home: Home, config: str, lifetime: float | None) -> None:
        self.rig = Rig(home, QUIET + config)
        self.rig.provider.lifetime = None if lifetime is None else (lambda b: lifetime)
        if config is CONFIGS["errors"]:
            self.rig.provider.row_errors = {f"{n}": ("server_error", "scripted") for n in range(0, 50, 2)}
        self.files = 0
        self.outbox_locked = False

    @property
    def provider(self) -> MemoryProvider:
        return self.rig.provider

    def tick(self, seconds: float) -> list[str]:
        rig = self.rig
        rig.now += seconds
        self.provider.advance(rig.now)
        before = rig.store.last_seq()
        rig.engine.tick(rig.now)
        return [e.type for e in rig.store.read(after=before)]

    def drop(self) -> None:
        self.files += 1
        name = f"f{self.files}.csv"
        (self.rig.home.inbox / name).write_text("id,response\n" + "".join(f"{i},text {self.files} {i}\n" for i in range(5)))
        self.rig.engine.scan_requested = True  # what the inbox watcher does

    def lock_outbox(self, locked: bool) -> None:
        outbox = self.rig.home.outbox
        if locked == self.outbox_locked:
            return
        self.outbox_locked = locked
        if locked:
            shutil.rmtree(outbox)
            outbox.symlink_to("/sys")  # nobody may write there, root included
        else:
            outbox.unlink()
            outbox.mkdir()

    def due(self) -> float | None:
        return self.rig.engine.next_due(self.rig.now, inbox=False)

    def acting(self, at: float) -> list[str]:
        """The jobs for which the rules have an action at ``at`` (the state as it is now)."""
        engine = self.rig.engine
        ctx = engine.ctx
        timers = ctx.timers(at)
        return [
            j.job_id
            for j in engine.ctx.state.jobs.values()
            if not j.corrupt
            and ctx.left_alone_because(j) is None
            and acts_now(engine.ctx.state, j.job_id, engine.ctx.config, at, timers, ctx.queue_url_for(j))
        ]

    def check_never_sleeps_past_due_work(self) -> None:
        due = self.due()
        for off in PROBES:
            at = self.rig.now + off
            if due is not None and at >= due:
                return
            acting = self.acting(at)
            assert not acting, f"jobs {acting} have work due at +{off} s, but the daemon sleeps until {due} (now {self.rig.now})"

    def settle(self) -> None:
        """Tick while work is due now (as the daemon does, at its floor): it is done, never looped on."""
        for _ in range(12):
            due = self.due()
            if due is None or due > self.rig.now:
                return
            self.tick(0.05)
            self.check_never_sleeps_past_due_work()
        raise AssertionError(f"work still due after 12 ticks in a row: {self.acting(self.rig.now)}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    config=st.sampled_from(sorted(CONFIGS)),
    lifetime=st.sampled_from(LIFETIMES),
    ops=st.lists(OPS, min_size=1, max_size=25),
)
def test_the_daemon_never_sleeps_past_work_that_is_due(config, lifetime, ops):
    with tempfile.TemporaryDirectory(prefix="bg-due-") as tmp:
        home = Home(Path(tmp))
        home.ensure()
        d = Driver(home, CONFIGS[config], lifetime)
        try:
            d.drop()
            d.tick(0.05)
            d.check_never_sleeps_past_due_work()
            for op in ops:
                if op[0] == "tick":
                    d.tick(op[1])
                elif op[0] == "due":
                    due = d.due()
                    d.tick(max(0.05, (due if due is not None else d.rig.now + 3000.0) - d.rig.now))
                elif op[0] == "finish":
                    d.provider.finish_all()
                    continue  # known only once polled: nothing the daemon must see now
                elif op[0] == "fault":
                    operation, kind, details = FAULTS[op[1]]
                    d.provider.fail_next(operation, kind, **details)
                    continue
                elif op[0] == "cancel":
                    jobs = [j for j in d.rig.engine.ctx.state.jobs.values() if not j.terminal and not j.rejected]
                    if jobs:
                        d.rig.engine.ctx.emit(jobs[0].job_id, NewEvent("CancelRequested", {"reason": "test"}))
                elif op[0] == "outbox":
                    d.lock_outbox(op[1])
                    continue
                elif op[0] == "drop":
                    d.drop()
                    d.tick(0.05)
                d.check_never_sleeps_past_due_work()
                d.settle()
        finally:
            if d.outbox_locked:
                d.lock_outbox(False)
            d.rig.close()


# --- the pace of polls (issue 38 item 2) -----------------------------------------------------------


def _seen_ended(home: Home, lifetime: float, poll_interval: float, earlier: float | None) -> tuple[float, float, list[str]]:
    """Run one batch of ``lifetime`` s (after one of ``earlier`` s of the same model, when given:
    the expected run time then points elsewhere), ticking only at the engine's due times; the
    seconds from its end to the tick that saw it ended, the batch's age at its end, and that
    tick's events."""
    d = Driver(home, f"poll_interval_seconds: {poll_interval}\n", None)
    try:
        if earlier is not None:  # a job before it: what batches of the model take
            d.provider.lifetime = lambda b: earlier
            d.drop()
            _follow(d, "JobCompleted")
        d.provider.lifetime = lambda b: lifetime
        d.drop()
        created = _follow(d, "BatchCreated")[0]
        seen, events = _follow(d, "OutputDownloadStarted")
        return seen - (created + lifetime), lifetime, events
    finally:
        d.rig.close()


def _follow(d: Driver, until: str) -> tuple[float, list[str]]:
    """Tick only at the engine's due times (as the daemon does) until an event ``until``: the
    time of that tick and its events."""
    for _ in range(400):
        due = d.rig.engine.next_due(d.rig.now)  # with the inbox's waits: the file dropped is taken at once
        assert due is not None, "work in flight and nothing due"
        events = d.tick(max(0.0, due - d.rig.now))
        if until in events:
            return d.rig.now, events
    raise AssertionError(f"no {until}")


@pytest.mark.parametrize("poll_interval", [60.0, 600.0, 2.0])
@pytest.mark.parametrize(
    ("lifetime", "earlier"),
    [(6.0, None), (30.0, None), (0.6, None), (6.0, 60.0), (6.0, 0.6), (100.0, 300.0)],
)
def test_a_running_batch_is_seen_ended_within_the_documented_bound(home, poll_interval, lifetime, earlier):
    late, age, events = _seen_ended(home, lifetime, poll_interval, earlier)
    bound = max(AGE_FRACTION * (age + late), MIN_DELAY)  # the last wait, planned at most at this age
    assert 0 <= late <= min(bound, poll_interval) + 0.05 + 1e-6, (late, bound)
    assert events.index("BatchStatusChanged") < events.index("OutputDownloadStarted")  # asked for in the same tick


def test_a_batch_ended_in_its_create_reply_is_downloaded_at_once(home):
    """A fast server (or a small batch on a quiet day) ends the batch before the create reply: it is
    read back in the create step, and its download is due at once, not at the inbox's rescan."""
    rig = Rig(home, QUIET)
    try:
        rig.provider.lifetime = lambda b: 0.0
        rig.drop(3)
        events = rig.tick(0.05)
        assert events[-2:] == ["BatchCreated", "BatchStatusChanged"]  # ended, read back in the create step
        assert rig.engine.next_due(rig.now, inbox=False) == rig.now  # its download: at once
        assert rig.engine.next_due(rig.now) == rig.now
        after = rig.tick(0.05)
        assert after[:2] == ["OutputDownloadStarted", "OutputDownloaded"] and "JobCompleted" in after
    finally:
        rig.close()

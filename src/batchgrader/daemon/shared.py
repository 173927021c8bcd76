"""Several daemons on one shared store: the leases each daemon works under (docs/scaling.md).

On a PostgreSQL store (``store_url``) any number of daemons run at once.  :class:`SharedWork` is
the one place the engine asks what this daemon may do; the steps know nothing of it:

- **a job** is advanced only by the holder of its lease (:meth:`SharedWork.take_job`): taken when
  free or lapsed, renewed every third of its lifetime while held, released when the job has
  ended, when its next action needs a provider account this daemon does not hold (the holder of
  that account takes the job then), and when the daemon stops.  A job whose daemon died is taken
  over once its lease lapses;
- **a job's local work** (:data:`LOCAL_WORK`: preparing, polling, downloading, merging, writing
  the result) is left by a daemon holding an account's lease to a live daemon holding none
  (:meth:`SharedWork.leaves`; each daemon is live under its own lease, ``daemon:<holder>``):
  it lets the job go (also when the job begins to wait) and does not take it for
  :attr:`SharedWork.leave_for` seconds, then (nobody took it) does that stretch of work itself.
  So the account's holder sends, and the others poll, merge and write.  A job lease refused is
  asked for again once the job has a new event (its holder may have let it go), else after a
  while (:data:`ASK_AGAIN`);
- **a provider call that writes** (upload, create, cancel, delete, and a synchronous request) is
  made only by the holder of the provider account's lease (:meth:`SharedWork.acting`): taken or
  renewed at the start of the action, refused while another daemon holds it.  The action's intent
  events are appended through :meth:`~batchgrader.store.leases.Leases.append_intent`, which
  re-checks the lease in the append's transaction (holder, fence, and more time left than the
  request may take: :attr:`SharedWork.bound`) and records the fence; an intent refused there
  stops the action before its call.  Every other event of a job is appended only while this
  daemon holds the job's lease (:meth:`~batchgrader.store.leases.Leases.append_held`);
- **an inbox input** becomes a job through :func:`~batchgrader.store.claims.claim_input`: the
  database decides which daemon takes it (:meth:`SharedWork.claim`), never a file lock;
- **a control request** (``bgctl cancel`` / ``retry``, a file every daemon sees) is applied by
  the one daemon whose claim of it commits with its event (:meth:`SharedWork.control_claim`).

A new holder of an account lease (the next fence) finds the old holder's open intents in the
log: the rules reconcile each from the provider's records (the ``bg_key`` listing) before
anything of that chunk is sent again, as after a crash.

On the SQLite file none of this exists: one daemon serves a home, under the home's lock.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from batchgrader.core.host.lock import DaemonError
from batchgrader.core.log.events import Event, NewEvent
from batchgrader.core.rules.actions import (
    Action,
    CancelBatch,
    CheckDuplicates,
    Create,
    DeleteProviderFiles,
    Download,
    FailBatch,
    FailUnstarted,
    Merge,
    Poll,
    Preflight,
    Prepare,
    Reconcile,
    Replan,
    SearchRecovered,
    SendOnline,
    SendStragglers,
    StoreAnswers,
    Upload,
    WriteErrorReport,
    WriteResult,
)
from batchgrader.store.claims import claim_control, claim_input
from batchgrader.store.leases import Lease, LeaseLost, Leases, daemon_lease, job_lease

log = logging.getLogger("batchgrader.engine")

#: actions that may write at the provider (upload, create, cancel, delete, a synchronous
#: request), or re-send after a reconcile: carried out only under the provider account's lease
CALLING_ACTIONS: tuple[type[Action], ...] = (
    Upload,
    Create,
    Reconcile,
    CheckDuplicates,
    CancelBatch,
    DeleteProviderFiles,
    FailBatch,
    FailUnstarted,
    Replan,
    SearchRecovered,
    Preflight,
    SendOnline,
    SendStragglers,
)
#: the events recorded before a call that writes leaves: appended through the fence check
CALL_INTENTS = frozenset(
    {
        "UploadStarted",
        "BatchCreateRequested",
        "BatchCancelRequested",
        "ProviderFileDeleteRequested",
        "StragglerCancelRequested",
        "PreflightRequested",
        "OnlineRequestSent",
    }
)
#: a job's local work (no provider call; the CPU and disk of the daemon doing it) that a daemon
#: holding a provider account's lease leaves to a daemon holding none (:meth:`SharedWork.leaves`)
LOCAL_WORK: tuple[type[Action], ...] = (Prepare, Poll, Download, Merge, StoreAnswers, WriteResult, WriteErrorReport)
#: s, the longest a daemon waits before it asks again for a lease another daemon held
ASK_AGAIN = 5.0
#: s, added to the request timeout: a call is made only while the lease has more than this left
CALL_MARGIN = 1.0


def daemon_holder() -> str:
    """This daemon's name in the store's leases: ``host:pid:uuid`` (a pid can come back)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def needs_account(action: Action) -> bool:
    return isinstance(action, CALLING_ACTIONS)


def local_work(action: Action) -> bool:
    return isinstance(action, LOCAL_WORK)


class SharedWork:
    """The job and account leases of one daemon on a shared store (see the module docstring).

    ``ttl``: the leases' lifetime (``lease_seconds``); ``bound``: the longest a call may take
    (the request timeout plus :data:`CALL_MARGIN`), less than ``ttl``.  ``clock``: the time lease
    decisions are made at (seconds); None, the default, is the database server's clock, so the
    hosts' clocks need not agree (tick tests pass their fake clock)."""

    def __init__(self, leases: Leases, ttl: float, bound: float, clock: Callable[[], float | None] = lambda: None) -> None:
        if bound >= ttl:
            raise ValueError(
                f"lease_seconds ({ttl:g}) must be longer than a provider request may take "
                f"(request_timeout_seconds + {CALL_MARGIN:g} = {bound:g}); make it several times longer"
            )
        self.leases = leases
        self.ttl = ttl
        self.bound = bound
        self.clock = clock
        self.jobs: dict[str, Lease] = {}  # the job leases this daemon holds
        self.accounts: dict[str, Lease] = {}  # the account leases this daemon holds
        self._renewed: dict[str, float] = {}  # lease name -> time.monotonic() of the last take or renewal
        self._calling: Lease | None = None  # the account lease of the action under way
        self._refused: dict[str, float] = {}  # lease name -> time.monotonic() before which it is not asked for again
        self._refused_at: dict[str, int] = {}  # job lease name -> the job's version when it was refused
        self.presence: dict[str, Lease] = {}  # this daemon's own lease (daemon:<holder>): it is live
        self._helped: bool | None = None  # whether a daemon holding no account is live (asked once a tick)
        self._leaving: dict[str, tuple[int, float]] = {}  # job id -> (its version, until when) left to such a daemon
        self.watch: ReleaseWatch | None = None  # a daemon's: what wakes it when another daemon releases a lease

    @classmethod
    def for_daemon(cls, store: Any, lease_seconds: float, request_timeout: float, holder: str | None = None) -> SharedWork:
        """The leases a daemon works under on a shared store: ``lease_seconds`` long, a call made
        only while the account's lease outlasts the request timeout (plus :data:`CALL_MARGIN`).
        A lifetime too short for a request is refused (:class:`~batchgrader.core.host.lock.DaemonError`)."""
        try:
            return cls(Leases(store, holder or daemon_holder()), lease_seconds, request_timeout + CALL_MARGIN)
        except ValueError as exc:
            raise DaemonError(str(exc)) from None

    @property
    def holder(self) -> str:
        return self.leases.holder

    # --- taking and keeping -----------------------------------------------------------------------
    def _time(self) -> float:
        """Now on the lease clock when one is given, else on the monotonic clock (local waits only)."""
        now = self.clock()
        return now if now is not None else time.monotonic()

    def _due(self, lease: Lease, need: float = 0.0) -> bool:
        """Whether to renew ``lease``: a third of its lifetime has passed, or it has no more
        than ``need`` seconds (and a second) left."""
        now = self.clock()
        if now is not None:
            return lease.expires_at - now <= max(self.ttl * 2 / 3, need + 1.0)
        elapsed = time.monotonic() - self._renewed.get(lease.name, float("-inf"))
        return elapsed >= min(self.ttl / 3, self.ttl - need - 1.0)

    def _take(self, held: dict[str, Lease], key: str, name: str, need: float = 0.0) -> Lease | None:
        """The lease ``name``, taken (free or lapsed) or renewed when due (:meth:`_due`); None
        (and forgotten) while another daemon holds it."""
        lease = held.get(key)
        if lease is not None and not self._due(lease, need):
            return lease
        if lease is None and self.elsewhere(name):
            return None
        got = self.leases.acquire(name, self.ttl, self.clock())
        if got is None:
            if lease is not None:
                log.warning("lease %s (fence %d) was taken over by another daemon", name, lease.fence)
            held.pop(key, None)
            self._renewed.pop(name, None)
            self._refused[name] = self._time() + min(self.ttl / 4, ASK_AGAIN)
            return None
        self._refused.pop(name, None)
        if lease is None or got.fence != lease.fence:
            log.info("lease %s taken (fence %d)", name, got.fence)
        held[key] = got
        self._renewed[name] = time.monotonic()
        return got

    def elsewhere(self, name: str) -> bool:
        """Whether another daemon held the lease ``name`` when last asked (not asked again for
        a while: :data:`ASK_AGAIN`)."""
        until = self._refused.get(name)
        return until is not None and self._time() < until

    def _job_moved(self, job_id: str, version: int | None) -> None:
        """A job refused at an earlier version (its holder has appended since, and may have let
        it go: a hand-over) is asked for again at once."""
        name = job_lease(job_id)
        if version is not None and self._refused_at.get(name, version) != version:
            self._refused.pop(name, None)
            self._refused_at.pop(name, None)

    def held_elsewhere(self, job_id: str, version: int | None = None) -> bool:
        """Whether another daemon works on ``job_id`` (as last asked, at ``version``, the job's
        last event), or the job's local work is left to one (:meth:`leaves`): it is not this
        daemon's to wait for."""
        if job_id in self.jobs:
            return False
        self._job_moved(job_id, version)
        left = self._leaving.get(job_id)
        return self.elsewhere(job_lease(job_id)) or (left is not None and self._time() < left[1])

    # --- spreading the local work -----------------------------------------------------------------
    @property
    def leave_for(self) -> float:
        """s, the longest a job's local work is left to another daemon before this one does it:
        twice the wait before a refused lease is asked for again, so that daemon has asked."""
        return 2 * min(self.ttl / 4, ASK_AGAIN)

    def helped(self) -> bool:
        """Whether this daemon holds a provider account's lease while another live daemon holds
        none (:meth:`~batchgrader.store.leases.Leases.helpers`; asked at most once a tick)."""
        if not self.accounts:
            return False
        if self._helped is None:
            self._helped = self.leases.helpers(self.clock()) > 0
        return self._helped

    def leaves(self, job_id: str, version: int) -> bool:
        """Whether to leave the local work of ``job_id`` (at ``version``, its last event) to a
        daemon holding no account lease, now: while this daemon holds one and such a daemon is
        live (:meth:`helped`), for at most :attr:`leave_for` seconds; then (nobody took it)
        this daemon does it, and the rest of that local work, until the job's next provider
        call (:meth:`acting`): a job is never left waiting."""
        if not self.helped():
            self._leaving.pop(job_id, None)
            return False
        now = self._time()
        left = self._leaving.get(job_id)
        if left is None or (left[0] != version and job_id not in self.jobs):  # another daemon may have worked on it
            left = self._leaving[job_id] = (version, now + self.leave_for)
        return now < left[1]

    def wait_left(self) -> float | None:
        """s until the first job left to another daemon is this daemon's again (None: none is)."""
        now = self._time()
        waits = [until - now for _, until in self._leaving.values() if until > now]
        return min(waits) if waits else None

    def take_job(self, job_id: str, version: int | None = None) -> bool:
        """Whether this daemon advances ``job_id`` now: its lease taken or kept.  Refused, it is
        not asked for again for a while (:data:`ASK_AGAIN`), or until the job has moved on from
        ``version`` (its last event, when given)."""
        self._job_moved(job_id, version)
        taken = self._take(self.jobs, job_id, job_lease(job_id)) is not None
        if not taken and version is not None:
            self._refused_at[job_lease(job_id)] = version
        return taken

    def let_go(self, job_id: str, why: str, announce: str | None = None) -> None:
        """Release the job's lease (the job ended, or another daemon is to carry it on);
        ``announce``: who is to carry it on, told at once (``call``: a daemon holding an account;
        ``work``: one holding none; :class:`ReleaseWatch`)."""
        lease = self.jobs.pop(job_id, None)
        if lease is not None:
            self._renewed.pop(lease.name, None)
            self.leases.release(lease, announce)
            log.debug("lease %s released: %s", lease.name, why)

    def ended(self, job_id: str) -> None:
        """The job has ended: its lease released, if held, and nothing more kept of it."""
        self._leaving.pop(job_id, None)
        self.let_go(job_id, "the job has ended")

    def lost(self, job_id: str) -> None:
        """The job's lease or the account's was found lost in an append: forget what we thought we held."""
        lease = self.jobs.pop(job_id, None)
        if lease is not None:
            self._renewed.pop(lease.name, None)

    def account(self, name: str) -> Lease | None:
        """The account lease ``name`` (``account:<provider>:<account>``), ours for longer than a
        call may take, or None: no call is made now."""
        return self._take(self.accounts, name, name, need=self.bound)  # renewed when it would not outlast a call

    @contextmanager
    def acting(self, job_id: str, action: Action, account: str) -> Iterator[bool]:
        """Around one action of a job: False when it needs the account lease ``account`` and this
        daemon may not call now (nothing is done); the intents appended meanwhile go through the
        fence check."""
        if not needs_account(action):
            yield True
            return
        self._leaving.pop(job_id, None)  # the local work after this call is left to another daemon again
        lease = self.account(account)
        if lease is None:
            yield False
            return
        self._calling = lease
        try:
            yield True
        finally:
            self._calling = None

    def recheck(self) -> None:
        """At a tick's start: the job leases this daemon was refused that are free now (another
        daemon let the job go, for a call on an account this daemon holds, say) are asked for
        again at once, not after :data:`ASK_AGAIN` (one query)."""
        now = self._time()
        refused = [name for name, until in self._refused.items() if now < until and name.startswith("job:")]
        for name in self.leases.free(refused, self.clock()):
            self._refused.pop(name, None)
            self._refused_at.pop(name, None)

    def keep(self) -> None:
        """Renew every lease held whose renewal is due (each tick, and from a long step's
        heartbeat); a lease lost meanwhile is forgotten (its job's next append is refused).  The
        daemon's own lease (:func:`~batchgrader.store.leases.daemon_lease`) is taken here."""
        self._helped = None
        if not self.presence:
            self._take(self.presence, "daemon", daemon_lease(self.holder))
        for held in (self.jobs, self.accounts, self.presence):
            for key, lease in list(held.items()):
                if self._due(lease):
                    try:
                        held[key] = self.leases.renew(lease, self.ttl, self.clock())
                        self._renewed[lease.name] = time.monotonic()
                    except LeaseLost:
                        log.warning("lease %s (fence %d) lapsed or was taken over", lease.name, lease.fence)
                        held.pop(key, None)
                        if self._calling is not None and self._calling.name == lease.name:
                            self._calling = None  # the action's next intent is refused

    def release_all(self) -> None:
        """Give every lease up (the daemon stops): another daemon takes them at once.  The
        :attr:`watch` of releases, if any, is stopped first."""
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
        for held in (self.jobs, self.accounts, self.presence):
            for lease in list(held.values()):
                try:
                    self.leases.release(lease)
                except Exception as exc:  # noqa: BLE001 - they lapse on their own
                    log.warning("could not release lease %s: %s", lease.name, exc)
            held.clear()
        self._renewed.clear()

    # --- claims and appends -----------------------------------------------------------------------
    def claim(self, key: str, job_ids: Iterable[str]) -> str | None:
        """The job id the inbox input ``key`` becomes, now this daemon's (its job lease held), or
        None when another daemon claimed it first (:func:`~batchgrader.store.claims.claim_input`)."""
        c = claim_input(self.leases, key, job_ids, self.ttl, self.clock())
        if c is None:
            return None
        self.jobs[c.job_id] = c.lease
        self._renewed[c.lease.name] = time.monotonic()
        if c.resumed:
            log.warning("input %s: carrying on job %s, claimed by a daemon that stopped before accepting it", key, c.job_id)
        return c.job_id

    def control_claim(self, name: str) -> Callable[[Any], None]:
        """What the append applying the control request ``name`` also writes: its claim, so one
        daemon applies it (:func:`~batchgrader.store.claims.claim_control`)."""
        return claim_control(name, self.holder)

    def append(
        self,
        job_id: str,
        events: Iterable[NewEvent],
        expected_version: int | None = None,
        also: Callable[[Any], None] | None = None,
    ) -> list[Event]:
        """Append a job's events under this daemon's leases: an intent under the account lease of
        the action under way (fence checked and recorded), else under the job's lease when held
        (checked); a job this daemon holds no lease of (a control request, an eval's record) by
        the log's own version check alone.  :class:`~batchgrader.store.leases.LeaseLost`: nothing
        appended, and no call follows."""
        new: Sequence[NewEvent] = list(events)
        version = int(expected_version or 0)
        if any(e.type in CALL_INTENTS for e in new):
            if self._calling is None:
                raise LeaseLost(f"job {job_id}: an intent without the provider account's lease: no call is made")
            return self.leases.append_intent(self._calling, job_id, new, version, self.bound, self.clock(), also)
        held = self.jobs.get(job_id)
        if held is not None:
            return self.leases.append_held(held, job_id, new, version, self.clock(), also)
        return self.leases.store.append(job_id, new, expected_version=expected_version, also=also)


class ReleaseWatch:
    """Wakes a daemon (``wake``; its leases: ``shared``) when another daemon hands a job over to
    daemons like it (:meth:`~batchgrader.store.leases.Leases.wait_released`, :meth:`for_us`),
    from a thread of its own: a job let go for this daemon to carry on
    (its next call needs an account this daemon holds, or its local work is left to daemons
    holding none) is taken at its next tick (:meth:`SharedWork.recheck`), not at its next due
    time.  A daemon is never woken by its own releases, and one holding no account never by a
    job that needs one: daemons that cannot carry a job on do not pass it between them."""

    def __init__(self, shared: SharedWork, wake: Callable[[], None], interval: float = 1.0) -> None:
        self.shared, self.wake, self.interval = shared, wake, interval
        self.leases = shared.leases  # its listening connection is this thread's alone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-releases", daemon=True)

    def start(self) -> ReleaseWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if any(self.for_us(kind, holder) for kind, holder in self.leases.wait_released(self.interval)):
                    self.wake()
            except Exception as exc:  # noqa: BLE001 - the database unreachable: the leases lapse; try again
                log.debug("waiting for lease releases: %s", exc)
                self._stop.wait(self.interval)

    def for_us(self, kind: str, holder: str) -> bool:
        """Whether a hand-over announced by ``holder`` is for this daemon: another daemon's, a
        ``call`` while this one holds an account, ``work`` while it holds none."""
        return holder != self.shared.holder and (kind == "call") == bool(self.shared.accounts)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.leases.close()

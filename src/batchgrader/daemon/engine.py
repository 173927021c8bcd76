"""The reconciler: from the folded state, take each job one step further.

``Engine.tick(now)`` is the whole daemon logic; the process around it (locks, signals,
scheduling, the inbox watcher, the screen) lives in :mod:`batchgrader.daemon`.  Every external
action is an intent event, then the call, then an outcome event.  After a crash an intent
without an outcome is reconciled against the provider (listing files and batches and matching
them by name, input file and metadata) before anything is sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchgrader.core.configuration.config import Config
from batchgrader.core.host.home import Home
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import (
    Action,
    Archive,
    CancelBatch,
    CheckDuplicates,
    Create,
    DeleteProviderFiles,
    Download,
    FailBatch,
    FailUnstarted,
    Finish,
    Hold,
    Merge,
    PlanRetries,
    PlanStragglers,
    Poll,
    Preflight,
    Prepare,
    Reconcile,
    RecoverEnded,
    Release,
    Replan,
    RestoreInput,
    RouteChunk,
    SearchRecovered,
    SendOnline,
    SendStragglers,
    StoreAnswers,
    Upload,
    WriteErrorReport,
    WriteResult,
)
from batchgrader.core.rules.decide import STEP_FAILED, STEP_FAILURES_MAX, Step, next_action, resubmit_delay, utc_day
from batchgrader.core.rules.due import next_due
from batchgrader.core.rules.panel import CancelJudges, RetryJudges, StartPanel, WritePanelResult
from batchgrader.daemon.context import Context
from batchgrader.daemon.steps.collect import CollectStep, StragglersStep
from batchgrader.daemon.steps.evals import EvalStep, ScheduleStep
from batchgrader.daemon.steps.finish import FinishStep, ReuseStep
from batchgrader.daemon.steps.intake import IntakeStep
from batchgrader.daemon.steps.online import OnlineStep
from batchgrader.daemon.steps.panel import PanelStep
from batchgrader.daemon.steps.preflight import PreflightStep
from batchgrader.daemon.steps.prepare import PrepareStep
from batchgrader.daemon.steps.submit import SubmitStep
from batchgrader.fsio import remove_stale_temp_files
from batchgrader.pipeline import inbox as inbox_mod
from batchgrader.pipeline.pricing import PriceTable
from batchgrader.provider.pool import Providers
from batchgrader.provider.protocol import Provider, ProviderError
from batchgrader.store.backend import DECIDE_ATTEMPTS, EventLog
from batchgrader.store.eventstore import ConcurrencyError, DatabaseMoved

if TYPE_CHECKING:
    from batchgrader.daemon.shared import SharedWork

log = logging.getLogger("batchgrader.engine")

__all__ = ["Engine", "Steps", "action_table", "resubmit_delay", "utc_day"]


# --- the steps and the action table ------------------------------------------------------------

#: carries out one action: (action, its job, the tick's wall clock)
Handler = Callable[[Any, JobState, float], object]


@dataclass(frozen=True)
class Steps:
    """The step objects of one engine, each built over the context alone."""

    ctx: Context
    intake: IntakeStep
    preflight: PreflightStep
    online: OnlineStep
    prepare: PrepareStep
    submit: SubmitStep
    collect: CollectStep
    stragglers: StragglersStep
    reuse: ReuseStep
    finish: FinishStep
    panel: PanelStep
    schedules: ScheduleStep  # around the jobs' pass, not actions: Engine.tick runs them
    evals: EvalStep

    @classmethod
    def build(cls, ctx: Context) -> Steps:
        return cls(
            ctx,
            IntakeStep(ctx),
            PreflightStep(ctx),
            OnlineStep(ctx),
            PrepareStep(ctx),
            SubmitStep(ctx),
            CollectStep(ctx),
            StragglersStep(ctx),
            ReuseStep(ctx),
            FinishStep(ctx),
            PanelStep(ctx),
            ScheduleStep(ctx),
            EvalStep(ctx),
        )


def action_table(s: Steps) -> dict[type[Action], Handler]:
    """Each action type of :mod:`batchgrader.core.rules.actions` and its handler."""
    return {
        RecoverEnded: s.finish.recover_ended,
        RestoreInput: s.finish.restore_input,
        Preflight: lambda a, job, now: preflight(s, a, job, now),
        SendOnline: s.online.send_online,
        Prepare: s.prepare.prepare,
        CancelBatch: s.submit.cancel_batch,
        Release: lambda a, job, now: s.ctx.emit(job.job_id, _e("JobReleased", reason=a.reason, override=False)),
        Reconcile: s.submit.reconcile,
        Poll: s.collect.poll,
        CheckDuplicates: s.submit.check_duplicates,
        SearchRecovered: s.intake.adopt_recovered,
        FailBatch: s.collect.fail_batch,
        Replan: s.prepare.replan,
        Download: s.collect.download,
        Merge: s.collect.merge,
        FailUnstarted: s.collect.fail_unstarted,
        Hold: lambda a, job, now: s.ctx.emit(job.job_id, _e("JobHeld", code=a.code, reason=a.reason)),
        Upload: s.submit.upload,
        Create: lambda a, job, now: create(s, a, job, now),
        PlanRetries: s.collect.plan_retries,
        PlanStragglers: s.stragglers.plan,
        SendStragglers: s.online.send_stragglers,
        RouteChunk: s.stragglers.route,
        WriteResult: s.finish.write_result,
        WriteErrorReport: s.finish.write_error_report,
        StoreAnswers: s.reuse.store_answers,
        Archive: s.finish.archive,
        DeleteProviderFiles: s.finish.delete_provider_files,
        Finish: s.finish.finish,
        StartPanel: s.panel.start,
        CancelJudges: s.panel.cancel_judges,
        RetryJudges: s.panel.retry_judges,
        WritePanelResult: s.panel.write_result,
    }


def preflight(s: Steps, a: Preflight, job: JobState, now: float) -> None:
    """The job's preflight; a job with no row to send in one is prepared at once."""
    if not s.preflight.run(a, job, now):
        s.prepare.prepare(a, job, now)


def create(s: Steps, a: Create, job: JobState, now: float) -> None:
    """The chunk's batch created, then read back at once if its create reply names it ended."""
    s.submit.create(a, job, now)
    s.collect.read_back(a, job, now)


# --- the engine --------------------------------------------------------------------------------


class Engine:
    """The reconciler: each tick asks :mod:`batchgrader.core.rules.decide` for every job's next action
    and carries it out through the handler :func:`action_table`
    gives its type; the steps share one :class:`~batchgrader.daemon.context.Context`."""

    def __init__(
        self,
        home: Home,
        config: Config,
        store: EventLog,
        providers: Providers | Provider | None,
        prices: PriceTable,
        sandbox: bool = False,
    ) -> None:
        """``providers``: the daemon's providers by name, or one provider for every job (tick tests, tools)."""
        pool = providers if isinstance(providers, Providers) else Providers.of(providers)
        self.ctx = Context(home, config, store, pool, prices, sandbox=sandbox)
        self.steps = Steps.build(self.ctx)
        self.handlers: dict[type[Action], Handler] = action_table(self.steps)
        self.idle = False
        self.again = False  # a job stopped its tick after an action with more to do now (tick again at once)
        self.failed = False  # a step of the tick failed (logged; tried again at the next tick)
        self.shared: SharedWork | None = None  # on a store several daemons share: the leases (share())
        self._recovered_at = float("-inf")

    def share_store(self, wake: Callable[[], None], holder: str | None = None) -> SharedWork:
        """Run as one of several daemons on this engine's shared store, under leases of the
        configured ``lease_seconds`` (:meth:`SharedWork.for_daemon`), ``wake`` called whenever
        another daemon releases a lease (:class:`~batchgrader.daemon.shared.ReleaseWatch`); the
        leases, for the process to renew and release."""
        from batchgrader.daemon.shared import ReleaseWatch, SharedWork

        config = self.ctx.config
        shared = SharedWork.for_daemon(self.ctx.store, config.lease_seconds, config.request_timeout_seconds, holder)
        self.share(shared)
        shared.watch = ReleaseWatch(shared, wake).start()
        return shared

    def share(self, shared: SharedWork) -> None:
        """Run beside other daemons on a shared store: fold what they append, and advance a job,
        call a provider, take an input only under its lease (:mod:`batchgrader.daemon.shared`)."""
        self.shared = shared
        self.ctx.shared = shared
        self.ctx.follow()

    @property
    def scan_requested(self) -> bool:
        return self.steps.intake.scan_requested

    @scan_requested.setter
    def scan_requested(self, value: bool) -> None:  # set by the daemon when the watcher saw a change
        self.steps.intake.scan_requested = value

    def reload(self, config: Config, prices: PriceTable) -> None:
        self.ctx.reload(config, prices)
        self.steps.intake.reload()

    def intake(self, now: float) -> None:
        self.steps.intake.intake(now)

    def inbox_pending(self) -> bool:
        """Files seen in the inbox but not yet taken (waiting to be stable)."""
        return self.steps.intake.pending()

    def next_due(self, mono: float, wall: float | None = None, inbox: bool = True) -> float | None:
        """The earliest time (monotonic, ``mono`` now; ``wall`` now on the wall clock, default
        ``mono``: one clock) anything of this engine waits on: :func:`batchgrader.core.rules.due.next_due`
        over the jobs it takes further (and the inbox's waits, unless ``inbox`` is false); the
        daemon's next tick is armed for it."""
        ours = [
            j
            for j in self.ctx.state.jobs.values()
            if not j.corrupt
            and self.ctx.left_alone_because(j) is None
            and not (self.shared is not None and self.shared.held_elsewhere(j.job_id, j.version))
        ]
        wall = mono if wall is None else wall
        queues = {j.job_id: self.ctx.queue_url_for(j) for j in ours}
        ids = [j.job_id for j in ours]
        timers = self.ctx.timers(mono)
        inbox_times = self.steps.intake.times() if inbox else None
        due = next_due(self.ctx.state, self.ctx.schedule, self.ctx.config, wall, mono, inbox_times, ids, timers, queues)
        left = self.shared.wait_left() if self.shared is not None else None
        if left is not None:  # a job's local work left to another daemon is this one's again then
            due = mono + left if due is None else min(due, mono + left)
        fire = self.steps.schedules.next_due(wall)  # a scheduled run's time, on the wall clock
        if fire is None:
            return due
        at = mono + max(0.0, fire - wall)
        return at if due is None else min(due, at)

    def busy(self) -> bool:
        """True while a job can still make progress on its own (held jobs wait for the user, and
        jobs this daemon leaves alone for a daemon of the other mode or endpoint)."""
        return any(not j.held and self.ctx.left_alone_because(j) is None for j in self.ctx.state.active_jobs())

    # --- the tick -------------------------------------------------------------------------------
    def startup(self, now: float) -> None:
        """Recover after a crash: our temp files, claimed-but-unrecorded inputs."""
        self.ctx.wall = now  # the clocks of a tick are set by tick(); what start-up stamps is on the wall clock
        if self.shared is None:  # on a shared home another daemon's temp files are being written
            remove_stale_temp_files(self.ctx.home.outbox)
        self.recover_claims(clean=self.shared is None)
        self.intake(now)

    def recover_claims(self, clean: bool = False) -> None:
        """Accept the inputs claimed (moved into a work folder) but not recorded as jobs: a
        daemon that stopped in between.  On a shared store only under the job's lease, so a
        daemon between its claim and its ``JobAccepted`` keeps its input."""
        for job_dir in sorted(self.ctx.home.work.glob("*")) if self.ctx.home.work.is_dir() else []:
            if clean:
                remove_stale_temp_files(job_dir, recursive=True)
            if job_dir.name in self.ctx.state.jobs or not job_dir.is_dir():
                continue
            record = inbox_mod.read_claim(job_dir)
            if record is None:
                continue
            input_path = inbox_mod.claimed_input(job_dir)
            if input_path is None:
                continue  # the rename never happened: the file is still in the inbox
            if self.shared is not None and not self.shared.take_job(job_dir.name):
                continue  # its claimant is alive (or another daemon recovers it)
            self.steps.intake.accept(job_dir.name, record, input_path)
            self.steps.intake.mark_recovered(job_dir)

    def tick(self, now: float, mono: float | None = None) -> None:
        """One pass over every job. Sets ``idle`` when, at the end of the pass, no job is active
        and no inbox file is waiting (decided here, not by another thread, to avoid races), and
        ``again`` when a job stopped after an action that ends its tick (``Prepare``,
        ``SearchRecovered``, ``PlanRetries``) with what follows due now, and ``failed`` when a job's
        step raised (logged; the daemon ticks again soon).  :meth:`next_due` says when anything
        waits next.

        ``now`` is the wall clock (timestamps, UTC days); ``mono`` the monotonic clock every
        wait runs on (polls, resubmits, settle waits), so a wall-clock step moves none of them;
        None: ``now`` serves as both (a test's one fake clock)."""
        self.ctx.set_clocks(now, mono)
        self.ctx.catch_up()  # what other daemons on a shared log appended
        if self.shared is not None:
            self.shared.keep()  # the leases held, renewed when due
            self.shared.recheck()  # a job let go for this daemon to carry on is taken at once
        self.idle = False
        self.again = False
        self.failed = False
        if self.shared is not None and now - self._recovered_at >= self.ctx.settings.rescan_interval_seconds:
            self._recovered_at = now
            self.recover_claims()  # a daemon that died between its claim and JobAccepted
        self.intake(now)
        self.steps.schedules.run(now)  # a scheduled profile's due runs start as jobs of this pass
        self._advance_all(now)
        if self.steps.evals.run(now):  # an eval's grading was queued: taken in this tick
            self.scan_requested = True
            self.intake(now)
        self.failed |= self.steps.schedules.failed or self.steps.evals.failed
        self.idle = not self.busy() and not self.inbox_pending()

    def _advance_all(self, now: float) -> None:
        if self.shared is None:  # one listing for every job's batches; on a shared store each job is polled by its holder
            self.steps.collect.list_round(self.ctx.mono)  # polls run on the monotonic clock
        for job in sorted(self.ctx.state.jobs.values(), key=lambda j: j.created_ts):
            if self.ctx.should_stop():
                return
            if job.corrupt:
                self.steps.intake.report_corrupt(job)
                continue
            if not self._ours(job):
                continue
            self.ctx.on_progress()
            try:
                self.advance(job, now)
                self.ctx.schedule.step_failures.pop(job.job_id, None)
            except DatabaseMoved:
                raise  # never go on writing to a file nobody reads
            except (ProviderError, OSError) as exc:
                self.failed = True
                log.warning("job %s: %s (will retry)", job.job_id, exc)
            except ConcurrencyError as exc:  # another daemon kept appending to it: decided again at the next tick
                self.failed = True
                log.info("job %s: %s", job.job_id, exc)
            except Exception as exc:  # one job's problem must not stop the others
                self.failed = True
                if self.ctx.store.unavailable(exc):  # the database's connection was lost: tried again, not counted
                    log.warning("job %s: the store is unavailable: %s (will retry)", job.job_id, exc)
                else:
                    self._step_failed(job, exc)

    def _step_failed(self, job: JobState, exc: Exception) -> None:
        """A step of ``job`` raised what no rule foresaw: logged with its traceback and tried again
        at the next tick; :data:`~batchgrader.core.rules.decide.STEP_FAILURES_MAX` in a row hold the job
        with the error (``bgctl retry`` tries again, ``bgctl cancel`` ends it), never a loop."""
        n = self.ctx.schedule.step_failures.get(job.job_id, 0) + 1
        self.ctx.schedule.step_failures[job.job_id] = n
        if n < STEP_FAILURES_MAX or self.ctx.state.jobs[job.job_id].held:
            log.exception("job %s: unexpected error (try %d of %d): %s", job.job_id, n, STEP_FAILURES_MAX, exc)
            return
        log.exception("job %s: unexpected error, %d times in a row: held", job.job_id, n)
        reason = (
            f"an unexpected error, {n} times in a row: {type(exc).__name__}: {exc}. The daemon's log has the "
            f"traceback (`bgctl logs`); after a fix or an upgrade `bgctl retry {job.job_id}` tries again, "
            f"`bgctl cancel {job.job_id}` ends it"
        )
        self.ctx.schedule.step_failures.pop(job.job_id, None)
        try:
            self.ctx.emit(job.job_id, _e("JobHeld", code=STEP_FAILED, reason=reason[:2000]))
        except Exception:  # the log itself may be what fails: tried again after the next failures
            log.exception("job %s: could not record the hold", job.job_id)

    def _ours(self, job: JobState) -> bool:
        """Whether this daemon takes ``job`` further.  A job it must leave alone
        (:meth:`Context.left_alone_because`) gets a ``JobLeftAlone`` with the reason, once per change, for
        ``bgctl status``; a job left alone before, now this daemon's, gets ``JobTakenUp``."""
        why = self.ctx.left_alone_because(job)
        if why is None:
            if job.left_alone is not None:
                self.ctx.emit(job.job_id, _e("JobTakenUp", sandbox=self.ctx.sandbox))
            return True
        code, reason = why
        if not job.terminal and job.left_alone != reason:
            log.warning("job %s left alone: %s", job.job_id, reason)
            self.ctx.emit(job.job_id, _e("JobLeftAlone", code=code, reason=reason))
        return False

    def advance(self, job: JobState, now: float) -> None:
        """Take one job as far as it goes in this tick: ask :func:`next_action`, carry it out,
        ask again with what was done.  On a shared store, only under the job's lease, and an
        action that calls the provider only under its account's lease (:meth:`_act_leased`)."""
        step = Step()
        conflicts = 0
        try:
            while True:
                action = next_action(
                    self.ctx.state, job.job_id, self.ctx.config, now, self.ctx.timers(), step, self.ctx.queue_url_for(job)
                )
                if action is None:
                    if self.shared is not None and job.job_id in self.shared.jobs and self._leaves_waiting(self.shared, job):
                        self.shared.let_go(job.job_id, "it waits: its polls are left to a daemon that holds no account", "work")
                    return
                step = step.after(action)
                try:
                    if self.shared is None:
                        self.act(action, now)
                    elif not self._act_leased(self.shared, action, job, now):
                        return
                except ConcurrencyError as exc:  # another daemon appended to the job: folded; decide again
                    conflicts += 1
                    if self.ctx.follower is None or conflicts >= DECIDE_ATTEMPTS:
                        raise
                    log.info("job %s: %s", job.job_id, exc)
                    continue
                if (
                    action.ends_step and self.ctx.state.jobs[job.job_id].start_failure is None
                ):  # a job that failed to start ends now
                    self.again = True
                    return
        finally:
            if self.shared is not None and self.ctx.state.jobs[job.job_id].ended:
                self.shared.ended(job.job_id)

    def _act_leased(self, shared: SharedWork, action: Action, job: JobState, now: float) -> bool:
        """Carry out ``action`` (:meth:`act`) on a shared store: only while this daemon holds the
        job's lease and, for a provider call, the account's (False: not done, the job is left to
        the lease's holder; a job needing an account another daemon holds is handed to it; a
        job's local work is left a while to a daemon that holds no account: :meth:`_leaves`)."""
        from batchgrader.store.leases import LeaseLost

        if self._leaves(shared, action):
            shared.let_go(job.job_id, "its local work is left to a daemon that holds no account", "work")
            return False
        if not shared.take_job(job.job_id, self.ctx.state.jobs[job.job_id].version):
            return False
        account = self.account_of(job)
        try:
            with shared.acting(job.job_id, action, account) as allowed:
                if not allowed:
                    shared.let_go(job.job_id, f"its next call needs {account}, held by another daemon", "call")
                    return False
                self.act(action, now)
        except LeaseLost as exc:  # lapsed (a pause) or taken over: nothing more is written, no call made
            log.warning("job %s: %s", job.job_id, exc)
            shared.lost(job.job_id)
            return False
        return True

    def _leaves(self, shared: SharedWork, action: Action) -> bool:
        """Whether ``action``, a job's local work, is left to a daemon that holds no account
        (:meth:`SharedWork.leaves`); never while a merge of the job runs in a worker here."""
        from batchgrader.daemon.shared import local_work

        if not local_work(action):
            return False
        if any(job_id == action.job_id for job_id, _ in self.ctx.timers().merging):
            return False
        workers = self.ctx.merge_workers
        if isinstance(action, Merge) and workers is not None and workers.running((action.job_id, action.chunk)):
            return False
        return shared.leaves(action.job_id, self.ctx.state.jobs[action.job_id].version)

    def _leaves_waiting(self, shared: SharedWork, job: JobState) -> bool:
        """Whether a job this daemon holds, with nothing to do now, is let go for a daemon that
        holds no account to poll (:meth:`SharedWork.helped`); never while a merge of it runs here."""
        return shared.helped() and not any(job_id == job.job_id for job_id, _ in self.ctx.timers().merging)

    def account_of(self, job: JobState) -> str:
        """The lease of the provider account a job's calls go to (its queue: the organisation,
        project, workspace or deployment)."""
        from batchgrader.store.leases import account_lease

        try:
            provider = job.provider or self.ctx.profile_of(job).provider
        except Exception:  # noqa: BLE001 - a profile gone: the job fails where the profile is needed
            provider = "unknown"
        return account_lease(provider, self.ctx.queue_url_for(job) or "default")

    def act(self, a: Action, now: float) -> None:
        """Carry out one action through its handler: intent event, call, outcome event."""
        for kind in type(a).__mro__:  # an action that specialises another (CreateStaged) is carried out as it
            handler = self.handlers.get(kind)
            if handler is not None:
                handler(a, self.ctx.state.jobs[a.job_id], now)
                return
        raise TypeError(f"unknown action {a!r}")

"""The reconciler: from the folded state, take each job one step further.

``Engine.tick(now)`` is the whole daemon logic; the process around it (locks, signals,
scheduling, the inbox watcher, the screen) lives in :mod:`batchgrader.daemon`.  Every external
action is an intent event, then the call, then an outcome event.  After a crash an intent
without an outcome is reconciled against the provider (listing files and batches and matching
them by name, input file and metadata) before anything is sent again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from batchgrader.core.decide import (
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
    Poll,
    Preflight,
    Prepare,
    Reconcile,
    RecoverEnded,
    Release,
    Replan,
    RestoreInput,
    SearchRecovered,
    SendOnline,
    Step,
    StoreAnswers,
    Upload,
    WriteResult,
    next_action,
    resubmit_delay,
    utc_day,
)
from batchgrader.core.state import JobState
from batchgrader.daemon.base import _e, stamp
from batchgrader.daemon.collect import CollectSteps
from batchgrader.daemon.finish import FinishSteps
from batchgrader.daemon.intake import IntakeSteps
from batchgrader.daemon.online import OnlineStep
from batchgrader.daemon.preflight import run_preflight
from batchgrader.daemon.reuse import ReuseSteps
from batchgrader.daemon.submit import SubmitSteps
from batchgrader.fsio import move_no_clobber, remove_stale_temp_files
from batchgrader.pipeline import inbox as inbox_mod
from batchgrader.provider.protocol import ProviderError
from batchgrader.store.eventstore import DatabaseMoved

log = logging.getLogger("batchgrader.engine")

__all__ = ["Engine", "resubmit_delay", "utc_day"]


class Engine(SubmitSteps, CollectSteps, FinishSteps, IntakeSteps, ReuseSteps):
    """The reconciler: each tick asks :mod:`batchgrader.core.decide` for every job's next action
    and carries it out through the step classes it is built from."""

    def inbox_pending(self) -> bool:
        """Files seen in the inbox but not yet taken (waiting to be stable)."""
        return self._scanner is not None and self._scanner.pending()

    def intake_due(self) -> float | None:
        """When a file seen in the inbox can next be found stable and taken (None: none waits):
        the daemon ticks then rather than at its next interval."""
        return self._scanner.due() if self._scanner is not None else None

    def busy(self) -> bool:
        """True while a job can still make progress on its own (held jobs wait for the user, and
        jobs this daemon leaves alone for a daemon of the other mode or endpoint)."""
        return any(not j.held and self.left_alone_because(j) is None for j in self.state.active_jobs())

    # --- the tick -------------------------------------------------------------------------------
    def startup(self, now: float) -> None:
        """Recover after a crash: our temp files, claimed-but-unrecorded inputs."""
        self._wall = now  # the clocks of a tick are set by tick(); what start-up stamps is on the wall clock
        remove_stale_temp_files(self.home.outbox)
        for job_dir in sorted(self.home.work.glob("*")) if self.home.work.is_dir() else []:
            remove_stale_temp_files(job_dir, recursive=True)
            if job_dir.name in self.state.jobs or not job_dir.is_dir():
                continue
            record = inbox_mod.read_claim(job_dir)
            if record is None:
                continue
            input_path = inbox_mod.claimed_input(job_dir)
            if input_path is None:
                continue  # the rename never happened: the file is still in the inbox
            self._accept(job_dir.name, record, input_path)
            self._mark_recovered(job_dir)
        self.intake(now)

    def tick(self, now: float, mono: float | None = None) -> None:
        """One pass over every job. Sets ``idle`` when, at the end of the pass, no job is active
        and no inbox file is waiting (decided here, not by another thread, to avoid races), and
        ``again`` when a job stopped after an action that ends its tick (``Prepare``,
        ``SearchRecovered``, ``PlanRetries``) with what follows due now.

        ``now`` is the wall clock (timestamps, UTC days); ``mono`` the monotonic clock every
        wait runs on (polls, resubmits, settle waits), so a wall-clock step moves none of them;
        None: ``now`` serves as both (a test's one fake clock)."""
        self.set_clocks(now, mono)
        self.idle = False
        self.again = False
        self.intake(now)
        self._advance_all(now)
        self.idle = not self.busy() and not self.inbox_pending()

    def _advance_all(self, now: float) -> None:
        try:
            self._list_round(self._mono)  # polls run on the monotonic clock
        except ProviderError as exc:
            log.warning("listing batches: %s (polling them one by one)", exc)
        for job in sorted(self.state.jobs.values(), key=lambda j: j.created_ts):
            if self.should_stop():
                return
            if job.corrupt:
                self._report_corrupt(job)
                continue
            if not self._ours(job):
                continue
            self.on_progress()
            try:
                self.advance(job, now)
            except DatabaseMoved:
                raise  # never go on writing to a file nobody reads
            except (ProviderError, OSError) as exc:
                log.warning("job %s: %s (will retry)", job.job_id, exc)
            except Exception as exc:  # one job's problem must not stop the others
                log.exception("job %s: unexpected error (will retry): %s", job.job_id, exc)

    def _ours(self, job: JobState) -> bool:
        """Whether this daemon takes ``job`` further.  A job it must leave alone
        (:meth:`left_alone_because`) gets a ``JobLeftAlone`` with the reason, once per change, for
        ``bgctl status``; a job left alone before, now this daemon's, gets ``JobTakenUp``."""
        why = self.left_alone_because(job)
        if why is None:
            if job.left_alone is not None:
                self.emit(job.job_id, _e("JobTakenUp", sandbox=self.sandbox))
            return True
        code, reason = why
        if not job.terminal and job.left_alone != reason:
            log.warning("job %s left alone: %s", job.job_id, reason)
            self.emit(job.job_id, _e("JobLeftAlone", code=code, reason=reason))
        return False

    def advance(self, job: JobState, now: float) -> None:
        """Take one job as far as it goes in this tick: ask :func:`next_action`, carry it out,
        ask again with what was done."""
        step = Step()
        while True:
            action = next_action(self.state, job.job_id, self.config, now, self.timers(), step, self.queue_url_for(job))
            if action is None:
                return
            step = step.after(action)
            self.act(action, now)
            if action.ends_step:
                self.again = True
                return

    def act(self, a: Action, now: float) -> None:
        """Carry out one action: intent event, call, outcome event."""
        job = self.state.jobs[a.job_id]
        if isinstance(a, RecoverEnded):
            self._finish_effects(job, now)
        elif isinstance(a, RestoreInput):
            if not Path(job.input_path).exists() and job.archived_path and Path(job.archived_path).exists():
                # reopened by `bgctl retry`: bring the input back into the work area
                os.rename(job.archived_path, job.input_path)
                self.emit(job.job_id, _e("InputRestored", path=job.input_path))
        elif isinstance(a, SendOnline):
            OnlineStep.of(self, job).run()
        elif isinstance(a, Preflight):
            run_preflight(self, job, now)
        elif isinstance(a, Prepare):
            self._prepare(job, now)
        elif isinstance(a, CancelBatch):
            self._cancel_batch(a, self._mono)
        elif isinstance(a, Release):
            self.emit(job.job_id, _e("JobReleased", reason="budget allows it now", override=False))
        elif isinstance(a, Reconcile):
            c = job.chunks[a.chunk]
            if a.intent == "upload":
                self._reconcile_upload(job, c)
            else:
                self._reconcile_create(job, c)
        elif isinstance(a, Poll):
            self._poll(job, job.chunks[a.chunk], self._mono)
        elif isinstance(a, CheckDuplicates):
            self._check_duplicates(job, job.chunks[a.chunk])
        elif isinstance(a, SearchRecovered):
            self._adopt_recovered(job, self._mono)  # its time is when the adopted batches are polled
        elif isinstance(a, FailBatch):
            if a.code in ("request_too_large", "queue_full"):
                self._delete_refused_file_of(job.chunks[a.chunk])  # refused for the queue limit, not sent again
            self.emit(
                job.job_id,
                *self._learned_event(job.model or "", a.learned, a.chunk, a.message, job),
                _e("ChunkFailed", chunk=a.chunk, batch_id=a.batch_id, code=a.code, error=a.error, retryable=a.retryable),
            )
            if a.retryable:
                if a.retry_delay:
                    self._not_before[(job.job_id, a.chunk)] = self._mono + a.retry_delay
            else:
                self._rows_failed_for_chunk(job, job.chunks[a.chunk], a.code, a.error)
        elif isinstance(a, Replan):
            self._replan(job, job.chunks[a.chunk], a.limit, a.exact)
        elif isinstance(a, Download):
            self._download(job, job.chunks[a.chunk], a.kind, a.file_id, self._mono)
        elif isinstance(a, Merge):
            self._merge(job, job.chunks[a.chunk], now)
        elif isinstance(a, FailUnstarted):
            self._delete_refused_file(job.chunks[a.chunk])  # a file uploaded ahead of queue room is not left behind
            self.emit(job.job_id, _e("ChunkFailed", chunk=a.chunk, batch_id=None, code=a.code, error=a.error, retryable=False))
            self._rows_failed_for_chunk(job, job.chunks[a.chunk], a.code, a.row_message)
        elif isinstance(a, Hold):
            self.emit(job.job_id, _e("JobHeld", code=a.code, reason=a.reason))
        elif isinstance(a, Upload):
            self._upload(job, job.chunks[a.chunk], a)
        elif isinstance(a, Create):
            self._create(job, job.chunks[a.chunk])
        elif isinstance(a, PlanRetries):
            self._plan_retries(job, list(a.custom_ids))
        elif isinstance(a, WriteResult):
            self._write_outbox(job, a, now)
        elif isinstance(a, StoreAnswers):
            self._store_answers(job, job.chunks[a.chunk], now)
        elif isinstance(a, Archive):
            src = Path(job.input_path)
            if src.exists():
                dest = move_no_clobber(src, self.home.failed if a.to_failed else self.home.archive, job.file, stamp(now))
                self.emit(job.job_id, _e("InputArchived", path=str(dest)))
        elif isinstance(a, DeleteProviderFiles):
            self._delete_provider_files(job, a.file_ids)
        elif isinstance(a, Finish):
            self.emit(job.job_id, _e(a.event, **a.payload))
            self._after_job_end(job.job_id, now)
        else:  # pragma: no cover - every action type is handled above
            raise TypeError(f"unknown action {a!r}")

"""The engine's steps, built once over one :class:`~batchgrader.daemon.context.Context`, and the
table from each action type of :mod:`batchgrader.core.actions` to the handler that carries it out.

Adding an action is one entry in :func:`action_table` and its handler (a step method, or a
small function here).  A handler takes ``(action, job, now)``: ``now`` is the tick's wall clock;
waits use the context's monotonic clock (``ctx.mono``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgrader.core.actions import (
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
from batchgrader.core.panel import CancelJudges, RetryJudges, StartPanel, WritePanelResult
from batchgrader.core.state import JobState
from batchgrader.daemon import stragglers
from batchgrader.daemon.base import _e, stamp
from batchgrader.daemon.collect import CollectSteps
from batchgrader.daemon.context import Context
from batchgrader.daemon.finish import FinishSteps
from batchgrader.daemon.intake import IntakeSteps
from batchgrader.daemon.online import OnlineStep
from batchgrader.daemon.panel import PanelSteps
from batchgrader.daemon.preflight import PreflightStep
from batchgrader.daemon.prepare import PrepareSteps
from batchgrader.daemon.reuse import ReuseSteps
from batchgrader.daemon.submit import SubmitSteps
from batchgrader.fsio import move_no_clobber

#: carries out one action: (action, its job, the tick's wall clock)
Handler = Callable[[Any, JobState, float], object]


@dataclass(frozen=True)
class EngineSteps:
    """The step objects of one engine; each gets the context and the steps it calls."""

    ctx: Context
    intake: IntakeSteps
    reuse: ReuseSteps
    finish: FinishSteps
    collect: CollectSteps
    submit: SubmitSteps
    prepare: PrepareSteps
    preflight: PreflightStep
    panel: PanelSteps

    @classmethod
    def build(cls, ctx: Context) -> EngineSteps:
        intake = IntakeSteps(ctx)
        reuse = ReuseSteps(ctx)
        finish = FinishSteps(ctx, intake, reuse)
        collect = CollectSteps(ctx, reuse)
        submit = SubmitSteps(ctx, collect)
        prepare = PrepareSteps(ctx, reuse, submit)
        preflight = PreflightStep(ctx, prepare)
        return cls(ctx, intake, reuse, finish, collect, submit, prepare, preflight, PanelSteps(ctx, finish))


def action_table(s: EngineSteps) -> dict[type[Action], Handler]:
    """Each action type of :mod:`batchgrader.core.actions` and its handler."""
    ctx = s.ctx
    return {
        RecoverEnded: lambda a, job, now: s.finish.finish_effects(job, now),
        RestoreInput: lambda a, job, now: restore_input(ctx, job),
        Preflight: lambda a, job, now: s.preflight.run(job, now),
        SendOnline: lambda a, job, now: OnlineStep.of(ctx, job).run(),
        Prepare: lambda a, job, now: s.prepare.prepare(job, now),
        CancelBatch: lambda a, job, now: stragglers.cancel(s, a, job),
        Release: lambda a, job, now: ctx.emit(job.job_id, _e("JobReleased", reason=a.reason, override=False)),
        Reconcile: lambda a, job, now: reconcile(s, a, job),
        Poll: lambda a, job, now: s.collect.poll(job, job.chunks[a.chunk], ctx.mono),
        CheckDuplicates: lambda a, job, now: s.submit.check_duplicates(job, job.chunks[a.chunk]),
        SearchRecovered: lambda a, job, now: s.intake.adopt_recovered(job, ctx.mono),  # adopted batches are polled then
        FailBatch: lambda a, job, now: fail_batch(s, a, job),
        Replan: lambda a, job, now: s.prepare.replan(job, job.chunks[a.chunk], a.limit, a.exact),
        Download: lambda a, job, now: s.collect.download(job, job.chunks[a.chunk], a.kind, a.file_id, ctx.mono),
        Merge: lambda a, job, now: s.collect.merge(job, job.chunks[a.chunk], now),
        FailUnstarted: lambda a, job, now: fail_unstarted(s, a, job),
        Hold: lambda a, job, now: ctx.emit(job.job_id, _e("JobHeld", code=a.code, reason=a.reason)),
        Upload: lambda a, job, now: s.submit.upload(job, job.chunks[a.chunk], a),
        Create: lambda a, job, now: s.submit.create(job, job.chunks[a.chunk]),
        PlanRetries: lambda a, job, now: s.collect.plan_retries(job, list(a.custom_ids)),
        PlanStragglers: lambda a, job, now: stragglers.plan(s, a, job),
        SendStragglers: lambda a, job, now: stragglers.send(s, a, job),
        RouteChunk: lambda a, job, now: stragglers.route(s, a, job),
        WriteResult: lambda a, job, now: s.finish.write_outbox(job, a, now),
        WriteErrorReport: lambda a, job, now: s.finish.write_error_report(job, a, now),
        StoreAnswers: lambda a, job, now: s.reuse.store_answers(job, job.chunks[a.chunk], now),
        Archive: lambda a, job, now: archive(ctx, a, job, now),
        DeleteProviderFiles: lambda a, job, now: s.finish.delete_provider_files(job, a.file_ids),
        Finish: lambda a, job, now: finish(s, a, job, now),
        StartPanel: lambda a, job, now: s.panel.start(job),
        CancelJudges: lambda a, job, now: s.panel.cancel_judges(a),
        RetryJudges: lambda a, job, now: s.panel.retry_judges(job, a),
        WritePanelResult: lambda a, job, now: s.panel.write_result(job, a, now),
    }


def restore_input(ctx: Context, job: JobState) -> None:
    """A job reopened by ``bgctl retry``: bring its input back into the work area."""
    if not Path(job.input_path).exists() and job.archived_path and Path(job.archived_path).exists():
        os.rename(job.archived_path, job.input_path)
        ctx.emit(job.job_id, _e("InputRestored", path=job.input_path))


def reconcile(s: EngineSteps, a: Reconcile, job: JobState) -> None:
    c = job.chunks[a.chunk]
    if a.intent == "upload":
        s.submit.reconcile_upload(job, c)
    else:
        s.submit.reconcile_create(job, c)


def fail_batch(s: EngineSteps, a: FailBatch, job: JobState) -> None:
    """A batch that failed: record why (and what it taught of the queue limit); a retryable one
    waits ``retry_delay``, the rows of one that is not fail."""
    ctx = s.ctx
    if a.code in ("request_too_large", "queue_full"):
        s.submit.delete_refused_file_of(job.chunks[a.chunk])  # refused for the queue limit, not sent again
    ctx.emit(
        job.job_id,
        *ctx.learned_event(job.model or "", a.learned, a.chunk, a.message, job),
        _e("ChunkFailed", chunk=a.chunk, batch_id=a.batch_id, code=a.code, error=a.error, retryable=a.retryable),
    )
    if a.retryable:
        if a.retry_delay:
            ctx.schedule.not_before[(job.job_id, a.chunk)] = ctx.mono + a.retry_delay
    else:
        s.collect.rows_failed_for_chunk(job, job.chunks[a.chunk], a.code, a.error)


def fail_unstarted(s: EngineSteps, a: FailUnstarted, job: JobState) -> None:
    """A chunk that can never be started: its file (uploaded ahead of queue room) is not left
    behind, its rows fail."""
    s.submit.delete_refused_file(job.chunks[a.chunk])
    s.ctx.emit(job.job_id, _e("ChunkFailed", chunk=a.chunk, batch_id=None, code=a.code, error=a.error, retryable=False))
    s.collect.rows_failed_for_chunk(job, job.chunks[a.chunk], a.code, a.row_message)


def archive(ctx: Context, a: Archive, job: JobState, now: float) -> None:
    src = Path(job.input_path)
    if src.exists():
        dest = move_no_clobber(src, ctx.home.failed if a.to_failed else ctx.home.archive, job.file, stamp(now))
        ctx.emit(job.job_id, _e("InputArchived", path=str(dest)))


def finish(s: EngineSteps, a: Finish, job: JobState, now: float) -> None:
    s.ctx.emit(job.job_id, _e(a.event, **a.payload))
    s.finish.after_job_end(job.job_id, now)

"""The engine's steps, built once over one :class:`~batchgrader.daemon.context.Context`, and the
table from each action type of :mod:`batchgrader.core.rules.actions` to the step method that carries
it out.

Adding an action is one entry in :func:`action_table` and its step method.  A handler takes
``(action, job, now)`` (``now``: the tick's wall clock; waits use ``ctx.mono``).  The steps never
call each other: where an action takes two steps in turn, the table says so (``Create``: the
batch created, then read back at once if its reply names it ended; ``Preflight``: a job with no
row to send in a preflight is prepared at once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
from batchgrader.core.rules.panel import CancelJudges, RetryJudges, StartPanel, WritePanelResult
from batchgrader.daemon.context import Context
from batchgrader.daemon.steps.collect import CollectStep
from batchgrader.daemon.steps.evals import EvalStep, ScheduleStep
from batchgrader.daemon.steps.finish import FinishStep
from batchgrader.daemon.steps.intake import IntakeStep
from batchgrader.daemon.steps.online import OnlineStep
from batchgrader.daemon.steps.panel import PanelStep
from batchgrader.daemon.steps.preflight import PreflightStep
from batchgrader.daemon.steps.prepare import PrepareStep
from batchgrader.daemon.steps.reuse import ReuseStep
from batchgrader.daemon.steps.stragglers import StragglersStep
from batchgrader.daemon.steps.submit import SubmitStep

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

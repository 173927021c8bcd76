"""How a job ends, as pure rules: its final event (completed, completed with errors, failed,
cancelled) and the actions that take it there, once its chunks are done
(:func:`finish_actions`) or when it failed before it was prepared (:func:`start_failure_actions`:
a ``PrepareFailed`` or ``PreflightFailed`` recorded).  Every job ends here (a panel's in
:func:`batchgrader.core.rules.panel.decide_panel`, a file refused at intake by its ``JobFailed``
rejection); the steps only carry the actions out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchgrader.core.configuration.config import Config
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import (
    OUTBOX_TIMER,
    Action,
    Archive,
    DeleteProviderFiles,
    Finish,
    Timers,
    WriteErrorReport,
    WriteResult,
)


def first_error(job: JobState) -> str:
    for info in list(job.failed_rows.values())[:1]:
        return f"{info.get('code')}: {info.get('message')}"
    for info in list(job.row_errors.values())[:1]:
        return f"{info.get('code')}: {info.get('message')}"
    return "unknown"


def ending(job: JobState) -> tuple[str, dict[str, Any]]:
    """How a job whose chunks are all done ends: the final event and its payload."""
    succeeded = job.succeeded_rows
    failed = len(job.failed_rows) + len(job.row_errors)
    if job.result_counts is not None and job.panel is None:
        # a row the result file has no answer for is a failed row, even one no event failed
        # (a row lost on the way would otherwise end the job "completed")
        failed = max(failed, job.result_counts[1])
    if job.cancel_requested and job.reopened_from in (None, "cancelled"):
        return "JobCancelled", {"succeeded": succeeded, "failed": failed}
    # a cancelled `bgctl retry` leaves the job as its rows say (completed_with_errors, say), not cancelled
    halted = next((i["message"] for i in job.failed_rows.values() if i.get("code") == "halted"), None)
    if halted:
        return "JobFailed", {
            "code": "halted",
            "error": halted,
            "stage": "submit",
            "hint": f"Fix the cause, then `bgctl retry {job.job_id}` resubmits the rows not done.",
        }
    if succeeded == 0 and failed:
        return "JobFailed", {
            "code": "all_rows_failed",
            "error": f"no row succeeded; first error: {first_error(job)}",
            "stage": "merge",
            "hint": f"See the error column of the result file; fix the cause, then `bgctl retry {job.job_id}`.",
        }
    return "JobCompleted", {
        "state": "completed" if not failed else "completed_with_errors",
        "succeeded": succeeded,
        "failed": failed,
    }


def reopened_archive(job: JobState) -> bool:
    """Whether the job's archived input is to come back: the job was reopened (`bgctl retry`
    resets its result), not stopped between its archive and its end (its result written; a step
    that raised, a crash, or the account's lease held by another daemon), which ends as it was."""
    return bool(job.archived_path) and job.outbox != "done"


def finish_actions(job: JobState, config: Config, store: Sequence[Action], now: float, timers: Timers) -> list[Action]:
    """The job's end once its chunks are done: the result file, the stored answers, the archived
    input, the provider files deleted, the final event (not before an unwritten result's back-off)."""
    if job.outbox != "done" and timers.not_before.get((job.job_id, OUTBOX_TIMER), now) > now:
        return []  # the result could not be written: tried again once the back-off has passed
    final, payload = ending(job)
    failed = final == "JobFailed"
    out: list[Action] = []
    if job.outbox != "done":
        out.append(WriteResult(job.job_id, failed, str(payload.get("error", "")), str(payload.get("hint", ""))))
    out += store  # after the result file: the user has the results first; before the end
    if not job.archived_path and job.panel_of is None:  # a judge's job leaves the panel's input alone
        out.append(Archive(job.job_id, failed))
    if config.default.delete_provider_files and not job.provider_files_deleted:
        ids: list[str] = []
        for c in job.chunks.values():
            ids += [x for x in (c.file_id, c.output_file_id, c.error_file_id) if x]
        out.append(DeleteProviderFiles(job.job_id, tuple(ids)))
    out.append(Finish(job.job_id, final, payload))
    return out


def start_failure_actions(job: JobState) -> list[Action]:
    """A job that failed before it was prepared (``job.start_failure``): its error report first,
    its input moved to failed/, the ``JobFailed`` last (a crash in between leaves a job that is
    not ended, and these are carried out again: the report is on disk and recorded before the
    end, so ``on_job_end`` always finds ``BG_ERROR_PATH``)."""
    failure = job.start_failure or {}
    out: list[Action] = []
    if not (job.outbox == "done" and job.error_path):
        out.append(WriteErrorReport(job.job_id, str(failure.get("error") or ""), str(failure.get("hint") or "")))
    if not job.archived_path and job.panel_of is None:  # a judge's job leaves the panel's input alone
        out.append(Archive(job.job_id, True))
    payload = {k: failure.get(k) for k in ("code", "error", "stage", "hint")}
    out.append(Finish(job.job_id, "JobFailed", payload))
    return out

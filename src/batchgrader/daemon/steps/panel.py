"""The panel step (rules in :mod:`batchgrader.core.rules.panel`): start the panel and
accept its judges' jobs, pass a cancel on to them, and write the panel's combined result.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import ConfigError
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import OUTBOX_TIMER
from batchgrader.core.rules.outcomes import outbox_retry_at
from batchgrader.core.rules.panel import CancelJudges, RetryJudges, StartPanel, WritePanelResult, judge_job_id, judge_jobs
from batchgrader.daemon.context import Context
from batchgrader.fsio import atomic_write, atomic_write_bytes
from batchgrader.pipeline.outbox import error_name, error_report, outbox_error, result_settings
from batchgrader.pipeline.panel import Judge, count_panel_result, write_panel_result

log = logging.getLogger("batchgrader.engine")


class PanelStep:
    """A judge panel's own actions, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def start(self, a: StartPanel, job: JobState, now: float) -> None:
        """``PanelStarted`` once, then ``JobAccepted`` for each judge's job not accepted yet (a
        crash in between: the next tick accepts the missing ones, under the recorded ids)."""
        if job.panel is None:
            judges = self.ctx.config.profile(job.profile).values.get("judges") or []
            listed = [{"profile": str(p), "job_id": judge_job_id(job.job_id, i)} for i, p in enumerate(judges, 1)]
            settings = result_settings(self.ctx.profile_of(job))
            self.ctx.emit(job.job_id, _e("PanelStarted", judges=listed, settings=settings))
        job = self.ctx.state.jobs[job.job_id]
        for judge in job.panel or ():
            if judge["job_id"] not in self.ctx.state.jobs:
                self._accept(job, judge["profile"], judge["job_id"])

    def _accept(self, panel: JobState, profile_name: str, job_id: str) -> None:
        try:  # who answers the judge's job: its own profile's provider, fixed from now on
            answered_by = self.ctx.accepted_as(self.ctx.config.profile(profile_name), panel.sandbox)
        except ConfigError:  # the profile is gone since: the judge's job fails in prepare, naming it
            answered_by = {"sandbox": panel.sandbox}
        self.ctx.home.job_dir(job_id).mkdir(parents=True, exist_ok=True)  # its own requests and chunks (no claim)
        self.ctx.emit(
            job_id,
            _e(
                "JobAccepted",
                file=panel.file,
                source=panel.source,
                profile=profile_name,
                sha256=panel.sha256,
                bytes=panel.bytes,
                input_path=panel.input_path,
                result_name=panel.result_name,
                panel_of=panel.job_id,
                **answered_by,
            ),
        )

    def cancel_judges(self, a: CancelJudges, job: JobState, now: float) -> None:
        for job_id in a.judge_ids:
            self.ctx.emit(job_id, _e("CancelRequested", reason=f"the panel {a.job_id} was cancelled"))

    def retry_judges(self, a: RetryJudges, panel: JobState, now: float) -> None:
        bound = {"max_completion_tokens": panel.retry_bound} if panel.retry_bound else {}
        for job_id in a.judge_ids:
            self.ctx.emit(job_id, _e("RetryRequested", reason=f"bgctl retry of the panel {a.job_id}", **bound))

    def write_result(self, a: WritePanelResult, job: JobState, now: float) -> None:
        """The panel's result (and error report when it failed), named in an intent event first;
        a result that cannot be written is tried again after a back-off, as any job's."""
        try:
            self._write_once(job, a, now)
        except OSError as exc:
            code, error = outbox_error(exc, str(exc.filename or self.ctx.home.outbox))
            n = self.ctx.schedule.outbox_failures.get(job.job_id, 0) + 1
            self.ctx.schedule.outbox_failures[job.job_id] = n
            self.ctx.schedule.not_before[(job.job_id, OUTBOX_TIMER)] = outbox_retry_at(n, now)
            if self.ctx.state.jobs[job.job_id].outbox_error != error:
                log.warning("panel %s: %s (tried again with a back-off)", job.job_id, error)
                self.ctx.emit(job.job_id, _e("OutboxWriteFailed", path=str(exc.filename or ""), error=error, code=code))
            return
        self.ctx.schedule.outbox_written(job.job_id)

    def _write_once(self, job: JobState, a: WritePanelResult, now: float) -> None:
        if a.failed and not self._judged(job):
            return self._error_report_alone(job, a, now)
        if job.outbox == "none":
            path = self.ctx.outbox.reserve(job.result_name, job.job_id, now)
            err = self.ctx.outbox.reserve(error_name(job.file), job.job_id, now) if a.failed else None
            self.ctx.emit(job.job_id, _e("OutboxWriteStarted", path=str(path), error_path=str(err) if err else None))
        job = self.ctx.state.jobs[job.job_id]
        path = Path(job.result_path or "")
        counts = (0, 0)

        def write(f: Any) -> None:
            nonlocal counts
            counts = self._combine(job, f)

        if not path.exists():
            atomic_write(path, write, overwrite=False)
        else:  # written before a crash: its rows counted again
            fixed = self._settings(job)
            judges = [j["profile"] for j in job.panel or ()]
            counts = count_panel_result(path, fixed["output_column"], judges, sheet=fixed.get("sheet"))
        if job.error_path and not Path(job.error_path).exists():
            report = error_report(job.file, job.job_id, a.error, a.hint, f"Partial results: {path.name}.")
            atomic_write_bytes(Path(job.error_path), report.encode(), overwrite=False)
        succeeded, failed = counts
        self.ctx.emit(
            job.job_id,
            _e(
                "ResultWritten",
                path=str(path),
                rows=succeeded + failed,
                succeeded=succeeded,
                failed=failed,
                error_path=job.error_path,
            ),
        )

    def _judged(self, job: JobState) -> bool:
        """Whether a judge wrote a result to combine (a judge that failed before answering, on
        input it could not read for one, wrote none)."""
        return any(j is not None and j.result_path and Path(j.result_path).exists() for j in judge_jobs(self.ctx.state, job))

    def _error_report_alone(self, job: JobState, a: WritePanelResult, now: float) -> None:
        """A failed panel none of whose judges wrote a result: its error report, and no result (the
        input need not be readable: a panel whose judges failed reading it must not read it again)."""
        if job.outbox == "none":
            err = self.ctx.outbox.reserve(error_name(job.file), job.job_id, now)
            self.ctx.emit(job.job_id, _e("OutboxWriteStarted", path=None, error_path=str(err)))
        job = self.ctx.state.jobs[job.job_id]
        path = Path(job.error_path or "")
        if not path.exists():
            atomic_write_bytes(path, error_report(job.file, job.job_id, a.error, a.hint).encode(), overwrite=False)
        self.ctx.emit(job.job_id, _e("ResultWritten", path=None, rows=0, succeeded=0, failed=0, error_path=str(path)))

    def _settings(self, job: JobState) -> dict[str, Any]:
        """The result settings fixed when the panel started (PanelStarted.settings)."""
        return {**result_settings(self.ctx.config.default), **job.settings}

    def _combine(self, job: JobState, f: Any) -> tuple[int, int]:
        fixed = self._settings(job)
        judges = []
        for spec, j in zip(job.panel or (), judge_jobs(self.ctx.state, job), strict=True):
            own = j.settings if j is not None else {}
            judges.append(
                Judge(
                    spec["profile"],
                    j.result_path if j is not None else None,
                    own.get("output_column", "grade"),
                    own.get("response_format"),
                    int(own.get("samples") or 1),
                )
            )
        return write_panel_result(
            f,
            Path(job.input_path),
            judges,
            fixed["output_column"],
            reference_field=fixed.get("reference_field"),
            sheet=fixed.get("sheet"),
            encoding=fixed.get("encoding", "utf-8"),
            formula_guard=bool(fixed.get("csv_formula_guard", True)),
        )

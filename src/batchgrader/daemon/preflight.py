"""The engine step that runs a job's preflight: its first rows through the provider's synchronous
API, with exactly the bodies its batches would carry, before it is prepared into batches.

Intent -> call -> outcome: ``PreflightRequested`` (stamped before the first request leaves),
then one ``complete`` call per row, then one outcome:

* ``PreflightPassed`` (with a ``TokensUsed`` of chunk -1 at the standard price, in the same
  transaction): the rows' answers are kept in the event; when the job is prepared they are
  taken like answers from the answers store (``daemon/reuse.py``), so those rows are not sent in
  a batch;
* ``PreflightFailed``, then the job fails with ``preflight_failed`` (error report, input moved to
  failed/, ``JobFailed``): an HTTP error, or an answer that is ``truncated``, ``refused``,
  ``invalid_output`` or ``unexpected_finish``;
* ``PreflightUnreachable``: the provider could not be reached, answered 5xx or asked to wait
  (429); the preflight is sent again after a backoff (:func:`~batchgrader.core.decide.preflight_delay`).

A synchronous request has no record at the provider to reconcile with, so a daemon killed
between ``PreflightRequested`` and its outcome sends the preflight again on restart: each such
crash costs at most one more preflight (``preflight_rows`` requests at the standard price).
Input that cannot be read, an unknown profile or a missing price are left to prepare, which fails
the job for them with their own codes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from batchgrader.core.config import ConfigError
from batchgrader.core.decide import preflight_delay, utc_day
from batchgrader.core.state import JobState
from batchgrader.daemon.base import _e
from batchgrader.daemon.context import Context
from batchgrader.daemon.finish import FinishSteps
from batchgrader.daemon.prepare import PrepareSteps
from batchgrader.pipeline.answerkey import line_keys
from batchgrader.pipeline.merge import outcome_record
from batchgrader.pipeline.outputschema import schema_of
from batchgrader.pipeline.prepare import first_requests
from batchgrader.pipeline.pricing import PricingError, billed_cost, standard_price
from batchgrader.pipeline.results import RowOutcome, parse_line
from batchgrader.pipeline.tables import InputError
from batchgrader.provider.protocol import OutcomeUnknown, ProviderRejected, ProviderUnavailable

log = logging.getLogger("batchgrader.engine")

USAGE = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")


def fix_for(code: str, job_id: str) -> str:
    """What to do about a preflight that failed with a row ``code``."""
    retry = f"then `bgctl retry {job_id}` runs the preflight again"
    if code == "truncated":
        return f"Raise max_completion_tokens in the profile (reasoning models spend output tokens on reasoning), {retry}."
    if code == "refused":
        return f"Change the prompts so the model answers them, {retry}."
    if code == "invalid_output":
        return f"Check the profile's response_format schema and the prompts, {retry}."
    if code == "unexpected_finish":
        return f"See the provider's documentation of that finish reason, {retry}."
    return f"Fix the setting the provider names (model, parameters, key, deployment) in config.yaml, {retry}."


class PreflightStep:
    """The preflight step, on the shared :class:`~batchgrader.daemon.context.Context`; a job
    with nothing to send goes on to :class:`~batchgrader.daemon.prepare.PrepareSteps`, a failed
    preflight fails the job through :class:`~batchgrader.daemon.finish.FinishSteps`."""

    def __init__(self, ctx: Context, prepare: PrepareSteps, finish: FinishSteps) -> None:
        self.ctx = ctx
        self.prepare = prepare
        self.finish = finish

    def run(self, job: JobState, now: float) -> None:
        """Send ``job``'s preflight and record its outcome (see the module docstring)."""
        try:
            profile = self.ctx.profile_of(job)
            self.ctx.prices.get(profile.model)
            lines = first_requests(Path(job.input_path), profile, self.ctx.home, job.sha256, int(profile.preflight_rows))
        except (ConfigError, InputError, PricingError, UnicodeError, OSError):
            lines = []
        if not lines:  # nothing to send, or input prepare fails the job for
            self.prepare.prepare(job, now)
            return
        keys = dict(line_keys(self.ctx.provider_key_for(job), lines))
        self.ctx.emit(job.job_id, _e("PreflightRequested", rows=list(keys), attempt=job.preflight_attempts + 1))
        assert self.ctx.provider is not None
        schema = schema_of(profile.response_format)
        answers: list[dict[str, Any]] = []
        for raw in lines:
            line = json.loads(raw)
            try:
                got = self.ctx.provider.complete(line, job.job_id)
            except ProviderRejected as exc:
                if exc.retryable:
                    return self._unreachable(job, f"{exc}", now)
                return self._failed(job, line["custom_id"], str(exc.code or f"http_{exc.status_code}"), str(exc), now)
            except (OutcomeUnknown, ProviderUnavailable) as exc:
                return self._unreachable(job, str(exc), now)
            o: RowOutcome = parse_line(got)
            rec = outcome_record(o, schema)
            if not rec["ok"]:
                return self._failed(job, o.custom_id, str(rec["error_code"]), str(rec["error_message"]), now)
            answers.append(
                {
                    "custom_id": o.custom_id,
                    "key": keys[o.custom_id],
                    "content": o.content or "",
                    "finish_reason": o.finish_reason,
                    **{k: int(rec.get(k) or 0) for k in USAGE},
                }
            )
        self._passed(job, profile.model, answers, now)

    def _passed(self, job: JobState, model: str, answers: list[dict[str, Any]], now: float) -> None:
        usage = {k: sum(a[k] for a in answers) for k in USAGE}
        try:
            cost = billed_cost(
                standard_price(self.ctx.prices.get(model)),
                usage["prompt_tokens"],
                usage["cached_tokens"],
                usage["completion_tokens"],
            )
        except PricingError:
            cost = 0.0
        self.ctx.emit(
            job.job_id,
            _e("PreflightPassed", answers=answers, cost_usd=float(cost)),
            _e("TokensUsed", chunk=-1, batch_id=None, model=model, cost_usd=float(cost), day=utc_day(now), **usage),
        )
        log.info("job %s: preflight passed (%d rows, $%.6f at the standard price)", job.job_id, len(answers), cost)

    def _failed(self, job: JobState, custom_id: str, code: str, message: str, now: float) -> None:
        hint = fix_for(code, job.job_id)
        self.ctx.emit(job.job_id, _e("PreflightFailed", custom_id=custom_id, row_code=code, error=message, hint=hint))
        log.warning("job %s: preflight failed on row %s: %s: %s", job.job_id, custom_id, code, message)
        error = f"the preflight (the first rows through the provider's synchronous API, before any batch) failed on row {custom_id}: {code}: {message}"
        self.finish.fail(job, "preflight_failed", error, hint + " No batch was created.", "preflight", now)

    def _unreachable(self, job: JobState, error: str, now: float) -> None:
        attempt = self.ctx.state.jobs[job.job_id].preflight_attempts
        retry_at = now + preflight_delay(attempt)
        self.ctx.emit(job.job_id, _e("PreflightUnreachable", error=error, retry_at=retry_at))
        log.warning(
            "job %s: preflight could not reach the provider (%s); sent again in %.0f s", job.job_id, error, retry_at - now
        )

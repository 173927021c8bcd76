"""Stragglers: with a ``deadline``, a batch still running when the deadline nears is cancelled,
and the rows it did not answer are finished through the synchronous API (issue 26, item 4).

The rules, as :mod:`batchgrader.core.rules.decide` asks them (pure: no clock, no I/O):

* :func:`straggler_cancels`: a batch of a job with a deadline, still in flight at
  ``deadline - margin`` (:func:`margin`: the time the synchronous route needs for the batch's rows
  at the profile's ``online_concurrency``, between :data:`MIN_MARGIN_SECONDS` and
  :data:`MAX_MARGIN_SECONDS`), is cancelled
  (``CancelBatch`` with its reason; the engine records ``StragglerCancelRequested`` before the
  cancel leaves).  The cancelled batch is collected as any other: the rows its partial output
  answered are merged, the others fail ``batch_cancelled``;
* :func:`straggler_actions`: those ``batch_cancelled`` rows of a straggler's chunk are planned as
  a chunk sent through the synchronous route (``PlanStragglers``; ``RetryPlanned`` with its
  ``route``: ``flex`` where the model has a flex tier, else ``online``), never as a new batch;
  that chunk's rows are then sent (``SendStragglers``), each row once (crash: re-sent once,
  counted), and the chunk completes with their answers;
* :func:`unsent_routes`: a chunk not sent yet (:func:`pending`) once the deadline is within the
  margin for its rows is routed to the synchronous route at once (``RouteChunk``; the engine
  records ``ChunkRouted``) and its rows sent as a straggler's: a batch created then would only be
  cancelled;
* :func:`past_cutoff`: once ``deadline - MIN_MARGIN_SECONDS`` has passed, failed rows are not sent
  again in a batch automatically (it could not end in time): the job ends with them failed and
  their codes in the result, ``bgctl retry`` still sends them.

A job reopened by ``bgctl retry`` is no longer bound by its deadline (the user asked for it).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from batchgrader.core.configuration.config import Config, ConfigError, Profile
from batchgrader.core.configuration.routes import deadline_at
from batchgrader.core.log.state import TERMINAL_BATCH, ChunkState, JobState
from batchgrader.core.rules.actions import CancelBatch, PlanStragglers, RouteChunk, SendStragglers, Timers
from batchgrader.core.rules.route_rules import online_waits

#: the least time before the deadline at which a running batch is cancelled: the cancel itself,
#: the download of the partial output and its merge take minutes
MIN_MARGIN_SECONDS = 300.0
#: the most: a large batch is given until an hour before the deadline (sending its rows
#: synchronously would take longer than the batch is likely to)
MAX_MARGIN_SECONDS = 3600.0
#: what one synchronous request is expected to take (a wave of ``online_concurrency`` requests)
REQUEST_SECONDS = 15.0
#: the code of a row a cancelled batch did not answer (pipeline/merge.py)
CANCELLED_ROW = "batch_cancelled"


def deadline_of(value: str | None, arrival: float, now: float) -> float | None:
    """When a job that arrived at ``arrival`` is due, as fixed at its preparation (``now``): a
    duration counts from the arrival, never after ``now``."""
    return deadline_at(value, min(arrival, now))


def job_deadline(job: JobState) -> float | None:
    """When ``job`` is due (epoch seconds, fixed at its preparation: ``JobPrepared.deadline_at``),
    or None: no deadline, or the job was reopened by ``bgctl retry``."""
    return None if job.reopened_from is not None else job.deadline_at


def margin(rows: int, concurrency: int) -> float:
    """How long before the deadline a batch of ``rows`` unanswered rows is cancelled: the
    synchronous route's waves of ``concurrency`` requests at :data:`REQUEST_SECONDS` each, at
    least :data:`MIN_MARGIN_SECONDS`, at most :data:`MAX_MARGIN_SECONDS`."""
    waves = math.ceil(max(0, rows) / max(1, concurrency))
    return min(MAX_MARGIN_SECONDS, max(MIN_MARGIN_SECONDS, waves * REQUEST_SECONDS))


def _profile(job: JobState, config: Config) -> Profile | None:
    try:
        return config.profile(job.profile)
    except ConfigError:
        return None


def _unanswered(c: ChunkState) -> int:
    """Rows of a running batch without an outcome yet (its request counts, as last polled)."""
    counts = c.request_counts or {}
    return max(0, c.requests - int(counts.get("completed") or 0) - int(counts.get("failed") or 0))


def _deadline(job: JobState, config: Config) -> tuple[float, int] | None:
    """When ``job`` is due and its profile's ``online_concurrency``; None: no deadline binds it
    (none set, an unknown profile, or the job is being cancelled)."""
    profile = _profile(job, config)
    due = job_deadline(job)
    if profile is None or due is None or job.cancel_requested:
        return None
    return due, int(profile.get("online_concurrency") or 1)


def _running_lead(c: ChunkState, concurrency: int) -> float:
    """How long before the deadline the running batch of ``c`` is cancelled."""
    return margin(_unanswered(c), concurrency)


def _unsent_lead(c: ChunkState, concurrency: int) -> float:
    """How long before the deadline the unsent chunk ``c`` takes the synchronous route."""
    return margin(c.requests, concurrency)


def straggler_cancels(job: JobState, config: Config, now: float, timers: Timers) -> list[CancelBatch]:
    """The batches of ``job`` to cancel because its deadline nears (see the module docstring)."""
    bound = _deadline(job, config)
    if bound is None:
        return []
    due, concurrency = bound
    out: list[CancelBatch] = []
    for c in job.chunks.values():
        if not (c.in_flight and c.batch_id) or c.batch_id in timers.cancel_sent:
            continue
        if c.status in ("cancelling", *TERMINAL_BATCH):
            continue
        lead = _running_lead(c, concurrency)
        if now >= due - lead:
            reason = (
                f"the deadline ({_iso(due)}) is {max(0.0, due - now):.0f} s away and the batch still runs; "
                f"its {_unanswered(c)} unanswered rows need ~{lead:.0f} s on the synchronous route"
            )
            out.append(CancelBatch(job.job_id, c.index, c.batch_id, reason=reason, deadline_at=due, margin=lead))
    return out


def pending(c: ChunkState) -> bool:
    """Waiting to be sent: never sent, or refused for the token limit and to be sent again (not
    a straggler's rows, which go through the synchronous route)."""
    return (
        c.route is None
        and not c.done
        and not c.in_flight
        and not c.open_intent
        and (
            not (c.create == "done" and c.status in TERMINAL_BATCH)
            or (c.failure is not None and bool(c.failure.get("retryable")))
        )
    )


def unsent_routes(job: JobState, config: Config, now: float) -> list[RouteChunk]:
    """The chunks of ``job`` never sent (or waiting to be sent again) once its deadline is within
    the synchronous route's time for their rows: a batch created now would only be cancelled as a
    straggler, so their rows take the synchronous route at once."""
    bound = _deadline(job, config)
    if bound is None:
        return []
    due, concurrency = bound
    out: list[RouteChunk] = []
    for c in job.chunks.values():
        if not pending(c):
            continue
        lead = _unsent_lead(c, concurrency)
        if now >= due - lead:
            reason = (
                f"the deadline ({_iso(due)}) is {max(0.0, due - now):.0f} s away and the chunk was not sent yet; "
                f"its {c.requests} rows need ~{lead:.0f} s on the synchronous route"
            )
            out.append(RouteChunk(job.job_id, c.index, deadline_at=due, margin=lead, reason=reason))
    return out


def deadline_thresholds(job: JobState, config: Config) -> list[float]:
    """The times (wall clock) at which a rule above changes its answer for ``job``: each running
    batch's and each unsent chunk's ``deadline - margin``, and the cutoff; [] without a deadline."""
    bound = _deadline(job, config)
    if bound is None:
        return []
    due, concurrency = bound
    out = [due - MIN_MARGIN_SECONDS]
    for c in job.chunks.values():
        if c.in_flight and c.batch_id and not c.straggler:
            out.append(due - _running_lead(c, concurrency))
        elif pending(c):
            out.append(due - _unsent_lead(c, concurrency))
    return out


def straggler_rows(job: JobState, c: ChunkState) -> list[str]:
    """The rows of straggler chunk ``c`` that its cancelled batch did not answer (not planned yet)."""
    if not (c.straggler and c.done):
        return []
    return [cid for cid, info in job.failed_rows.items() if info.get("chunk") == c.index and info.get("code") == CANCELLED_ROW]


def straggler_actions(job: JobState, now: float, timers: Timers) -> list[PlanStragglers | SendStragglers]:
    """Plan the unanswered rows of each collected straggler for the synchronous route, and send
    the rows of each chunk so planned (not while the provider's Retry-After holds the job)."""
    if job.cancel_requested:
        return []
    out: list[PlanStragglers | SendStragglers] = []
    for c in job.chunks.values():
        if straggler_rows(job, c):
            out.append(PlanStragglers(job.job_id, c.index))
    waits = online_waits(job, now, timers)
    for c in job.chunks.values():
        if c.route is not None and not c.done and not waits:
            out.append(SendStragglers(job.job_id, c.index))
    return out


def past_cutoff(job: JobState, now: float) -> bool:
    """Whether ``job``'s deadline is less than :data:`MIN_MARGIN_SECONDS` away (or past): its
    failed rows are then not sent again in a batch automatically."""
    due = job_deadline(job)
    return due is not None and now >= due - MIN_MARGIN_SECONDS


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

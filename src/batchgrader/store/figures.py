"""A job's figures, computed in one place: rows, rows answered and failed, requests, tokens,
cost and models, each over one scope.

Every reader shows a job's figures from here: `bgctl status` (the ``job_status`` read model's row,
:func:`~batchgrader.store.readmodels.job_row`, and its panel rows at query time), ``status JOB``,
``report`` / ``report --json``, and the daemon's summary (:func:`figures_of`).  ``costs`` reads
the ``usage`` ledger (one row per ``TokensUsed``: the same events the fold sums into
:class:`Billed`), and ``count`` sums a panel's estimates with :func:`add_estimates`.

The scopes:

* ``rows``, ``answered``, ``failed``: rows of the result: a row is failed when its ``error`` cell
  says why it has no answer: its request failed, its samples' vote failed (``no_majority``), or
  a panel's judges tie (``no_majority``) or none answered (``no_answer``).  Once the result is
  written these are the counts its ``ResultWritten`` recorded; before, the fold's counts so far.
* ``requests``, ``requests_answered``, ``requests_failed``: the job's requests (rows × samples;
  a panel's: its judges'), each answered or failed; ``sources``: the requests by answer source
  (:func:`~batchgrader.core.log.route_state.requests_by_source`).
* :class:`Billed`: tokens in, out and cached, and the cost, of the same requests: every
  ``TokensUsed`` of the job (its preflight, its synchronous route and its batches); a panel runs
  no model, so its billed figures are the sum of its judges' (:func:`panel_figures`), and so
  are its ``models`` and its estimate.

Pure functions of folded state (no I/O): :func:`job_figures` from a job's state and its judges'
states, :func:`panel_figures` to give a panel its judges' billed figures, :func:`billed_from_row`
to read a ``job_status`` row back (the panel rows of `bgctl status` are combined at query time
with the same :func:`panel_figures`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from batchgrader.core.log.route_state import requests_by_source

if TYPE_CHECKING:
    from batchgrader.core.log.jobstate import JobState
    from batchgrader.core.log.state import State

ESTIMATE_KEYS = ("input", "max_output", "max_total")


def add_estimates(estimates: Sequence[Mapping[str, Any] | None]) -> dict[str, float] | None:
    """The sum of several jobs' estimates (``{input, max_output, max_total}``), None when any of
    them has none (a model without a price): a panel's, and ``count --profile PANEL``'s."""
    if not estimates or not all(estimates):
        return None
    return {k: sum(float((e or {}).get(k) or 0.0) for e in estimates) for k in ESTIMATE_KEYS}


@dataclass(frozen=True)
class Billed:
    """What a job's requests were billed (``TokensUsed``), planned and estimated: the figures
    that add up across a panel's judges."""

    sent: int = 0  # requests planned to be sent (the job's requests less those answered at prepare)
    prompt_tokens: int = 0  # billed input tokens (cached and cache writes included)
    cached_tokens: int = 0
    completion_tokens: int = 0  # billed output tokens (reasoning included)
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    cache_saved_usd: float = 0.0
    saved_usd: float = 0.0  # what the answers taken without a request cost when first paid for
    planned_input_tokens: int = 0  # input tokens counted at preparation for the rows planned into batches
    estimated_input: int | None = None  # JobPrepared.input_tokens (None: not prepared)
    estimate: dict[str, float] | None = None  # {input, max_output, max_total} at preparation
    models: tuple[str, ...] = ()

    def __add__(self, other: Billed) -> Billed:
        inputs = [x for x in (self.estimated_input, other.estimated_input) if x is not None]
        return Billed(
            sent=self.sent + other.sent,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            cache_saved_usd=self.cache_saved_usd + other.cache_saved_usd,
            saved_usd=self.saved_usd + other.saved_usd,
            planned_input_tokens=self.planned_input_tokens + other.planned_input_tokens,
            estimated_input=sum(inputs) if inputs else None,
            estimate=add_estimates([self.estimate, other.estimate]),
            models=tuple(dict.fromkeys((*self.models, *other.models))),
        )


def total(parts: Iterable[Billed]) -> Billed:
    """The sum of ``parts`` (the empty sum: nothing billed, no estimate)."""
    out: Billed | None = None
    for b in parts:
        out = b if out is None else out + b
    return out or Billed()


@dataclass(frozen=True)
class JobFigures:
    """A job's figures (see the module docstring for each scope)."""

    job_id: str
    rows: int
    answered: int  # rows of the result with an answer
    failed: int  # rows of the result with an error (a failed vote, a panel's tie, included)
    requests: int  # the requests the job makes: rows x samples (a panel's: its judges')
    requests_answered: int  # of the job's requests (a panel's: its judges')
    requests_failed: int
    billed: Billed
    sources: dict[str, int] | None = None  # requests by answer source (None for a panel: see its judges)
    judges: tuple[JobFigures, ...] = field(default=())  # a panel's judges' own figures, in order

    @property
    def models(self) -> tuple[str, ...]:
        return self.billed.models

    @property
    def cost_usd(self) -> float:
        return self.billed.cost_usd


# --- from a job's folded state -------------------------------------------------------------------


def samples_of(job: JobState) -> int:
    """The requests per row of a job (``samples``, fixed at preparation)."""
    return max(1, int((job.settings or {}).get("samples") or 1))


def billed_of(job: JobState) -> Billed:
    """A job's own billed, planned and estimated figures (a panel's own: nothing)."""
    prepared_input = sum(c.input_tokens for c in job.chunks.values() if c.custom_ids is None)  # retry chunks come later
    return Billed(
        sent=int(job.requests),
        prompt_tokens=job.prompt_tokens,
        cached_tokens=job.cached_tokens,
        completion_tokens=job.completion_tokens,
        reasoning_tokens=job.reasoning_tokens,
        cache_write_tokens=job.cache_write_tokens,
        cost_usd=job.cost_usd,
        cache_saved_usd=job.cache_saved_usd,
        saved_usd=job.saved_usd,
        planned_input_tokens=prepared_input,
        estimated_input=prepared_input if job.prepared else None,
        estimate=dict(job.estimate) if job.estimate else None,
        models=(job.model,) if job.model and job.panel is None else (),
    )


def requests_done(job: JobState) -> tuple[int, int]:
    """(requests answered, requests failed) of a job that is no panel: its batches' answers and
    those taken at prepare (:attr:`JobState.succeeded_rows`), and its failed and unsendable
    requests."""
    return job.succeeded_rows, len(job.failed_rows) + len(job.row_errors)


def result_rows(job: JobState) -> tuple[int, int]:
    """(rows answered, rows failed) of the job's result.

    Once the result is written: the counts its ``ResultWritten`` recorded (a panel's count its
    judges' ties and unanswered rows as failed), when they add up to its rows.  Else (a job
    whose ``ResultWritten`` counted requests rather than rows: one with samples; before its
    result is written) from the fold: a row is failed when every request it made failed (a
    failed vote among answered samples is known only from the written result)."""
    if job.panel is not None:
        return job.result_counts or (0, 0)
    k = samples_of(job)
    if job.outbox == "done" and job.result_counts is not None:
        ok, bad = job.result_counts
        if ok + bad == job.rows:  # counted by row (else by request: a samples job, or a refused row counted twice)
            return ok, bad
    answered, failed = requests_done(job)
    if k == 1:
        return answered, failed
    failed_samples: dict[str, int] = {}
    for cid in {*job.failed_rows, *job.row_errors}:
        row = _row_id(cid)
        failed_samples[row] = failed_samples.get(row, 0) + 1
    failed_rows = sum(1 for n in failed_samples.values() if n >= k)
    return min(job.rows - failed_rows, answered), failed_rows


def _row_id(custom_id: str) -> str:
    """The custom id of the row whose sample ``custom_id`` is (:mod:`batchgrader.pipeline.samples`)."""
    from batchgrader.pipeline.samples import SAMPLE_SUFFIX, sample_number

    j = sample_number(custom_id)
    return custom_id if j == 1 else custom_id[: -len(f"{SAMPLE_SUFFIX}{j}")]


def own_figures(job: JobState, *, sources: bool = True) -> JobFigures:
    """A job's figures from its own fold alone (a panel's: its result's rows, nothing billed);
    ``sources=False``: without the requests by source (the ``job_status`` row keeps them in
    its route summary)."""
    answered, failed = result_rows(job)
    req_ok, req_bad = requests_done(job) if job.panel is None else (0, 0)
    return JobFigures(
        job_id=job.job_id,
        rows=int(job.rows),
        answered=answered,
        failed=failed,
        requests=int(job.rows) * samples_of(job) if job.panel is None else 0,
        requests_answered=req_ok,
        requests_failed=req_bad,
        billed=billed_of(job),
        sources=requests_by_source(job) if job.panel is None and sources else None,
    )


def panel_figures(panel: JobFigures, judges: Sequence[JobFigures]) -> JobFigures:
    """A panel's figures: its own rows (its result's), and its judges' requests, tokens, cost,
    estimate and models (it runs no model of its own: each cost is counted once, in its judge)."""
    if not judges:
        return panel
    billed = total(j.billed for j in judges)
    return replace(
        panel,
        requests=sum(j.requests for j in judges),
        requests_answered=sum(j.requests_answered for j in judges),
        requests_failed=sum(j.requests_failed for j in judges),
        billed=billed,
        judges=tuple(judges),
    )


def job_figures(job: JobState, judges: Sequence[JobState | None] = ()) -> JobFigures:
    """A job's figures: for a judge panel, with ``judges`` (each judge's job's state, None when
    not accepted yet) summed in by :func:`panel_figures`."""
    own = own_figures(job)
    if job.panel is None:
        return own
    return panel_figures(own, [own_figures(j) for j in judges if j is not None])


def figures_of(state: State, job: JobState) -> JobFigures:
    """The figures of ``job`` in the whole fold ``state`` (its judges' jobs found there): what the
    daemon's summary shows."""
    from batchgrader.core.rules.panel import judge_jobs

    return job_figures(job, judge_jobs(state, job))


# --- the job_status row ------------------------------------------------------------------------


def row_values(f: JobFigures) -> dict[str, Any]:
    """The ``job_status`` columns the figures fill (and ``bgctl status --json`` shows)."""
    b = f.billed
    return {
        "model": ", ".join(b.models) or None,
        "rows": f.rows,
        "requests": b.sent,
        "input_tokens": b.planned_input_tokens,
        "prompt_tokens": b.prompt_tokens,
        "cached_tokens": b.cached_tokens,
        "output_tokens": b.completion_tokens,
        "reasoning_tokens": b.reasoning_tokens,
        "cost_usd": b.cost_usd,
        "estimate_usd": (b.estimate or {}).get("max_total"),
        "succeeded": f.answered,
        "failed": f.failed,
        "saved_usd": b.saved_usd,
        "cache_write_tokens": b.cache_write_tokens,
        "cache_saved_usd": b.cache_saved_usd,
    }


def billed_from_row(row: Mapping[str, Any]) -> Billed:
    """The :class:`Billed` figures a ``job_status`` row holds (:func:`row_values`; the estimate
    only as its ``max_total``)."""

    def n(key: str) -> int:
        return int(row.get(key) or 0)

    est = row.get("estimate_usd")
    return Billed(
        sent=n("requests"),
        prompt_tokens=n("prompt_tokens"),
        cached_tokens=n("cached_tokens"),
        completion_tokens=n("output_tokens"),
        reasoning_tokens=n("reasoning_tokens"),
        cache_write_tokens=n("cache_write_tokens"),
        cost_usd=float(row.get("cost_usd") or 0.0),
        cache_saved_usd=float(row.get("cache_saved_usd") or 0.0),
        saved_usd=float(row.get("saved_usd") or 0.0),
        planned_input_tokens=n("input_tokens"),
        estimate={"max_total": float(est)} if est is not None else None,
        models=tuple(m.strip() for m in str(row.get("model") or "").split(",") if m.strip()),
    )


def panel_row(row: dict[str, Any], judges: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A panel's ``job_status`` row given its judges' rows (`bgctl status` combines them at
    query time, as :func:`panel_figures` combines states): the row, updated in place."""
    own = JobFigures(
        job_id=row["job_id"],
        rows=int(row.get("rows") or 0),
        answered=int(row.get("succeeded") or 0),
        failed=int(row.get("failed") or 0),
        requests=0,
        requests_answered=0,
        requests_failed=0,
        billed=billed_from_row(row),
    )
    judged = [
        JobFigures(
            job_id=j["job_id"],
            rows=int(j.get("rows") or 0),
            answered=int(j.get("succeeded") or 0),
            failed=int(j.get("failed") or 0),
            requests=0,
            requests_answered=0,
            requests_failed=0,
            billed=billed_from_row(j),
        )
        for j in judges
    ]
    f = panel_figures(own, judged)
    row.update(row_values(f))
    row["judges"] = [j.job_id for j in judged]
    return row

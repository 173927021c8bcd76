"""The synchronous routes' part of a job's folded state (:class:`RouteState`, ``JobState.online``)
and its fold handlers (``RouteChosen``, ``OnlineRequestSent``, ``OnlineRequestAnswered``,
``OnlineRequestFailed``, ``OnlineRowsDone``), :data:`ROUTE_FOLDS`, which
:mod:`batchgrader.core.log.state` registers with the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchgrader.core.log import payloads as P

#: a row's request is tried at most this many times on a synchronous route; then it goes in the batch
MAX_ATTEMPTS = 4
#: after a 429 without a Retry-After (or a 5xx): the first wait, doubling per attempt of the row
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0


@dataclass
class RouteState:
    """How a job's rows travel (``route``: None until chosen; a job without a ``RouteChosen`` goes
    by batch) and, on a synchronous route, each row's requests and outcomes."""

    route: str | None = None
    reason: str | None = None
    rows: int = 0
    attempts: dict[str, int] = field(default_factory=dict)  # custom_id -> requests sent
    tiers: dict[str, str] = field(default_factory=dict)  # custom_id -> the tier it was last sent at (flex, online)
    open: set[str] = field(default_factory=set)  # sent, no outcome yet (after a crash: uncertain)
    resent: set[str] = field(default_factory=set)  # rows sent again after a crash (once each)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)  # custom_id -> the answer (as PreflightPassed's)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)  # custom_id -> last failure {code, error, final}
    retry_at: float | None = None  # no request before this (wall clock; the provider's Retry-After)
    done: bool = False
    rows_by_tier: dict[str, int] = field(default_factory=dict)
    cost_by_tier: dict[str, float] = field(default_factory=dict)

    @property
    def to_batch(self) -> list[str]:
        """Rows whose requests failed for good: they go in the job's batch."""
        return [cid for cid, f in self.failed.items() if f.get("final") and cid not in self.answers]

    def settled(self, cid: str) -> bool:
        """Whether row ``cid`` needs no more request on this route."""
        return cid in self.answers or bool(self.failed.get(cid, {}).get("final"))


def refused_rows(job: Any) -> list[str]:
    """Rows the provider refused for good on the synchronous route (a 4xx other than 408 and 429,
    recorded with a ``RowsFailed`` of no chunk beside the ``OnlineRequestFailed``): the row fails
    with the refusal's message at once and is not sent in the batch (the same request would be
    refused there too)."""
    return [cid for cid in job.online.to_batch if (job.failed_rows.get(cid) or {"chunk": 0})["chunk"] is None]


def backoff(attempt: int) -> float:
    """The wait after the ``attempt``-th failed request of a row when the provider named none."""
    return min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** max(0, attempt - 1))


def _route_chosen(s: Any, job: Any, p: P.RouteChosen, e: Any) -> None:
    job.online.route, job.online.reason, job.online.rows = p["route"], p["reason"], int(p["rows"])
    if p.get("estimate_usd") is not None and job.estimate is None:  # the budget weighs it before a request leaves
        job.estimate = p["estimate_usd"]


def _online_sent(s: Any, job: Any, p: P.OnlineRequestSent, e: Any) -> None:
    r: RouteState = job.online
    cid = p["custom_id"]
    r.attempts[cid] = int(p["attempt"])
    r.tiers[cid] = p["tier"]
    r.open.add(cid)
    if p.get("resent_after_crash"):
        r.resent.add(cid)


def _online_answered(s: Any, job: Any, p: P.OnlineRequestAnswered, e: Any) -> None:
    r: RouteState = job.online
    cid = p["custom_id"]
    r.open.discard(cid)
    r.failed.pop(cid, None)
    r.answers[cid] = dict(p)
    tier = p["tier"]
    r.rows_by_tier[tier] = r.rows_by_tier.get(tier, 0) + 1
    r.cost_by_tier[tier] = r.cost_by_tier.get(tier, 0.0) + float(p["cost_usd"] or 0.0)


def _online_failed(s: Any, job: Any, p: P.OnlineRequestFailed, e: Any) -> None:
    r: RouteState = job.online
    cid = p["custom_id"]
    r.open.discard(cid)
    r.failed[cid] = {"code": p["code"], "error": p["error"], "final": bool(p["final"]), "status": p["status_code"]}
    if p["retry_at"] is not None:
        r.retry_at = max(r.retry_at or 0.0, float(p["retry_at"]))


def _online_done(s: Any, job: Any, p: P.OnlineRowsDone, e: Any) -> None:
    job.online.done = True


def route_summary(job: Any) -> dict[str, Any]:
    """A job's route and its rows and cost by route, for ``bgctl status``, ``costs`` and the
    report: ``{route, reason, rows: {batch, flex, online}, cost_usd: {...}, to_batch, refused,
    resent_after_crash, stragglers, straggler_rows, preflight_rows, answered_in_job}`` (``batch`` rows are those sent in batches
    and answered there or failed; its cost is the rest of the job's bill, a preflight's included;
    ``stragglers``: batches cancelled as the deadline neared, ``straggler_rows``: their rows sent
    through the synchronous route instead)."""
    r: RouteState = job.online
    straggled = sum(c.requests for c in job.chunks.values() if c.route)  # planned in a batch, sent synchronously
    sync = sent_by_tier(job)
    rows = {"batch": max(0, int(job.requests) - straggled), "flex": sync["flex"], "online": sync["online"]}
    sync_cost = sum(r.cost_by_tier.values())
    cost = {
        "batch": round(max(0.0, job.cost_usd - sync_cost), 6),
        "flex": round(r.cost_by_tier.get("flex", 0.0), 6),
        "online": round(r.cost_by_tier.get("online", 0.0), 6),
    }
    return {
        "route": r.route or "batch",
        "reason": r.reason,
        "rows": rows,
        "cost_usd": cost,
        "to_batch": len(r.to_batch) - len(refused_rows(job)),
        "refused": len(refused_rows(job)),
        "resent_after_crash": len(r.resent),
        "stragglers": sum(1 for c in job.chunks.values() if c.straggler),
        "straggler_rows": straggled,
        "preflight_rows": len(job.preflight_answers),
        "answered_in_job": answered_in_job(job),
        "sources": requests_by_source(job),
    }


def requests_by_source(job: Any) -> dict[str, int]:
    """The job's requests by where their answer came from (:data:`~batchgrader.core.log.answer_sources.SOURCES`,
    in order): ``reused`` (a stored answer of an earlier job), ``duplicate`` (an identical request
    of the file: a leader's outcome copied at merge, or an answer the job paid for copied at
    prepare), ``preflight``, ``batch`` (sent in a batch: answered or failed there), ``online`` and
    ``flex`` (sent synchronously: the route's rows and a straggler's, answered or refused for
    good there: :func:`sent_by_tier`).  `bgctl status`, `report`
    and the result's ``answered_by`` use these words."""
    from batchgrader.core.log.answer_sources import SOURCES

    straggled = sum(c.requests for c in job.chunks.values() if c.route)
    sync = sent_by_tier(job)
    counts = {
        "reused": max(0, int(job.cached_rows) - answered_in_job(job) - int(job.copied_rows)),
        "duplicate": int(job.duplicates_answered) + int(job.copied_rows),
        "preflight": len(job.preflight_answers),
        "batch": max(0, int(job.requests) - straggled),
        "online": sync["online"],
        "flex": sync["flex"],
    }
    return {s.name: counts[s.name] for s in SOURCES}


def sent_by_tier(job: Any) -> dict[str, int]:
    """The requests a job sent synchronously, by tier (``flex``, ``online``): those answered and
    those the provider refused for good (failed there, as a batch's failed requests count
    among the batch's)."""
    r: RouteState = job.online
    out = {"flex": r.rows_by_tier.get("flex", 0), "online": r.rows_by_tier.get("online", 0)}
    for cid in refused_rows(job):
        tier = r.tiers.get(cid) or (r.route if r.route in out else None)
        if tier in out:
            out[tier] += 1
    return out


def shown_route(job: Any) -> bool:
    """Whether a job's rows did not all travel by batch (a synchronous route, a straggler or a
    preflight answered some): ``bgctl status`` then shows its :func:`route_summary`."""
    return (
        job.online.route not in (None, "batch")
        or bool(job.preflight_answers)
        or any(c.straggler or c.route for c in job.chunks.values())
    )


def answered_in_job(job: Any) -> int:
    """Rows the job took at prepare as it takes stored answers, but which it sent itself: its
    preflight's and its synchronous route's, answered or refused for good (not those of a
    straggling batch, sent after prepare).  They are not reused answers and saved nothing."""
    r: RouteState = job.online
    sync = sum(r.rows_by_tier.values()) - sum(c.requests for c in job.chunks.values() if c.route)
    return len(job.preflight_answers) + max(0, sync) + len(refused_rows(job))


def _straggler_cancel(s: Any, job: Any, p: P.StragglerCancelRequested, e: Any) -> None:
    job.chunks[p["chunk"]].straggler = True


def _chunk_routed(s: Any, job: Any, p: P.ChunkRouted, e: Any) -> None:
    job.chunks[p["chunk"]].route = p["route"]


#: (payload type, fold handler) of each route event
ROUTE_FOLDS = (
    (P.RouteChosen, _route_chosen),
    (P.OnlineRequestSent, _online_sent),
    (P.OnlineRequestAnswered, _online_answered),
    (P.OnlineRequestFailed, _online_failed),
    (P.OnlineRowsDone, _online_done),
    (P.StragglerCancelRequested, _straggler_cancel),
    (P.ChunkRouted, _chunk_routed),
)

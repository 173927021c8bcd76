"""The engine's side of stragglers (the rules: :mod:`batchgrader.core.stragglers`): a batch
cancelled as its job's deadline nears, and its unanswered rows finished through the synchronous
route.

* :func:`cancel` carries out a ``CancelBatch``: one with a reason (the deadline) first records
  ``StragglerCancelRequested`` (once per chunk), then the cancel leaves by the usual path; the
  cancelled batch is polled, downloaded and merged as any other;
* :func:`plan` writes the rows its partial output did not answer as a chunk for the synchronous
  route (``RetryPlanned`` with ``route``: ``flex`` where the model has a flex tier, else
  ``online``);
* :func:`send` sends that chunk's rows with the synchronous route's step (:mod:`batchgrader.daemon.online`:
  intent ``OnlineRequestSent`` before each request, ``OnlineRequestAnswered`` with its
  ``TokensUsed`` at the tier's price, a crash's open request sent again once and counted); once
  every row has its outcome, the chunk's results file is written (in the chunk's order, as a
  merged batch's) and ``RowsFailed`` / ``ChunkCompleted`` recorded, so the result file takes the
  answers like a retry chunk's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from batchgrader.core.actions import CancelBatch, PlanStragglers, RouteChunk, SendStragglers
from batchgrader.core.route_state import RouteState
from batchgrader.core.state import ChunkState, JobState
from batchgrader.core.stragglers import straggler_rows
from batchgrader.daemon.base import _e, _lines, chunk_custom_ids
from batchgrader.daemon.online import OnlineStep, has_flex
from batchgrader.fsio import atomic_write_bytes
from batchgrader.pipeline.answerkey import line_keys
from batchgrader.store.eventstore import NewEvent

log = logging.getLogger("batchgrader.engine")


def cancel(s: Any, a: CancelBatch, job: JobState) -> None:
    """Cancel a running batch; for the deadline, its reason is recorded before the cancel leaves."""
    c = job.chunks[a.chunk]
    if a.reason and not c.straggler:
        s.ctx.emit(
            job.job_id,
            _e(
                "StragglerCancelRequested",
                chunk=a.chunk,
                batch_id=a.batch_id,
                deadline_at=float(a.deadline_at or 0.0),
                margin_seconds=float(a.margin),
                reason=a.reason,
            ),
        )
        log.warning("job %s chunk %d: batch %s cancelled: %s", job.job_id, a.chunk, a.batch_id, a.reason)
    s.submit.cancel_batch(a, s.ctx.mono)


def tier_of(s: Any, job: JobState) -> str:
    """The synchronous route a straggler's rows take: flex where the model has it, else online."""
    return "flex" if has_flex(s.ctx.profile_of(job), s.ctx.prices) else "online"


def plan(s: Any, a: PlanStragglers, job: JobState) -> None:
    ids = straggler_rows(job, job.chunks[a.chunk])
    if ids:
        s.collect.plan_retries(job, ids, route=tier_of(s, job))


def route(s: Any, a: RouteChunk, job: JobState) -> None:
    """A chunk never sent, its deadline too near for a batch: its rows take the synchronous route
    (sent by ``SendStragglers`` as a straggler's)."""
    tier = tier_of(s, job)
    s.ctx.emit(
        job.job_id,
        _e(
            "ChunkRouted",
            chunk=a.chunk,
            route=tier,
            deadline_at=float(a.deadline_at),
            margin_seconds=float(a.margin),
            reason=a.reason,
        ),
    )
    log.warning("job %s chunk %d: sent %s, not in a batch: %s", job.job_id, a.chunk, tier, a.reason)


def send(s: Any, a: SendStragglers, job: JobState) -> None:
    """Send the chunk's rows not settled yet; complete the chunk once every row has its outcome."""
    c = job.chunks[a.chunk]
    step = dataclasses.replace(OnlineStep.of(s.ctx, job), tier=c.route, lookup=None)
    lines = list(_lines(Path(c.path)))
    keys = dict(line_keys(step.provider_key, lines))
    if not step.send(lines, keys, set()):
        return  # the provider asked to wait: the rest is sent later
    job = s.ctx.state.jobs[job.job_id]
    complete(s, job, job.chunks[a.chunk], [json.loads(raw)["custom_id"] for raw in lines])


def complete(s: Any, job: JobState, c: ChunkState, sent: list[str]) -> None:
    """Write the chunk's results file and record its outcome, once every row sent has one."""
    r: RouteState = job.online
    if any(cid in r.open or not r.settled(cid) for cid in sent):
        return
    records = {cid: _record(job.job_id, r, cid) for cid in sent}
    here = set(sent)
    leader_of = {d: lead for lead, ds in s.reuse.followers_of(job).items() for d in ds if lead in here}
    riders = [cid for cid in chunk_custom_ids(c) if cid not in here and cid in leader_of]
    lines = [records[cid] for cid in sent]
    lines += [{**records[leader_of[cid]], "custom_id": cid, "reused": "duplicate", "leader": leader_of[cid]} for cid in riders]
    path = Path(s.collect._results_path(job, c))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, b"".join(json.dumps(x, ensure_ascii=False).encode() + b"\n" for x in lines))
    failed = [_failed_row(x) for x in lines if not x["ok"]]
    events: list[NewEvent] = []
    if failed:
        events.append(_e("RowsFailed", chunk=c.index, batch_id=None, rows=failed))
    events.append(
        _e(
            "ChunkCompleted",
            chunk=c.index,
            batch_id=None,
            status=None,
            succeeded=len(lines) - len(failed),
            failed=len(failed),
            results_path=str(path),
        )
    )
    s.ctx.emit(job.job_id, *events)


def _record(job_id: str, r: RouteState, cid: str) -> dict[str, Any]:
    """A row's result record (the shape of a merged chunk's results file) from its outcome on
    the synchronous route."""
    a = r.answers.get(cid)
    if a is not None:
        return {
            "custom_id": cid,
            "ok": True,
            "content": a["content"],
            "status_code": 200,
            "error_code": None,
            "error_message": None,
            "prompt_tokens": a["prompt_tokens"],
            "cached_tokens": a["cached_tokens"],
            "completion_tokens": a["completion_tokens"],
            "reasoning_tokens": a["reasoning_tokens"],
            "finish_reason": a["finish_reason"],
            "reused": a["tier"],  # answered_by: flex or online, billed in this job
            "key": a["key"],
            "answered_in": job_id,
        }
    f = r.failed.get(cid) or {}
    return {
        "custom_id": cid,
        "ok": False,
        "content": None,
        "status_code": f.get("status"),
        "error_code": f.get("code") or "outcome_unknown",
        "error_message": f.get("error") or "no outcome on the synchronous route",
    }


def _failed_row(x: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"custom_id": x["custom_id"], "code": x["error_code"], "message": x["error_message"]}
    if x.get("status_code") is not None:
        row["status"] = int(x["status_code"])
    return row

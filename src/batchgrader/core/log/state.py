"""Job state as a pure fold over events.

No I/O, no clock, no randomness: the same events always give the same state.  The daemon keeps
one :class:`State` and applies each event it appends; ``bgctl`` and recovery rebuild it with
:func:`fold`.  Folding a log in increments equals folding it whole (property-tested).
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from batchgrader.core.log import payloads as P
from batchgrader.core.log.events import CORRUPT_KEY, Event
from batchgrader.core.log.jobstate import (  # noqa: F401 - the job records are part of the fold's interface
    IN_FLIGHT,
    JOB_STATES,
    TERMINAL_BATCH,
    TERMINAL_JOB,
    ChunkState,
    JobState,
)
from batchgrader.core.log.route_state import ROUTE_FOLDS


@dataclass
class State:
    jobs: dict[str, JobState] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # fingerprint -> job_id
    sha_jobs: dict[str, list[str]] = field(default_factory=dict)  # sha256 -> job ids
    batch_index: dict[str, tuple[str, int]] = field(default_factory=dict)  # batch_id -> (job, chunk)
    spend_by_day: dict[str, float] = field(default_factory=dict)
    tokens_by_day: dict[str, int] = field(default_factory=dict)
    # (base_url, model) -> {limit, exact, source, ts}: the latest QueueLimitLearned
    queue_limits: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    last_seq: int = 0
    # (provider, model, schema sha) -> tokens/request: learned apart per sandbox and provider (overhead_provider)
    schema_overhead: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # profile -> its latest ScheduledRunStarted: {scheduled_for, files} (core/rules/cron.py)
    scheduled_runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def apply(self, e: Event) -> None:
        """Apply one event in place (the daemon's private state). Deterministic, no I/O."""
        if e.seq <= self.last_seq:
            return  # already folded (idempotent replay)
        handler = _HANDLERS.get(e.type)
        job = self.jobs.get(e.job_id)
        if job is None:
            job = self.jobs[e.job_id] = JobState(job_id=e.job_id, created_ts=e.ts)
        job.updated_ts = e.ts
        job.version = e.job_seq
        if not job.corrupt:
            _apply_or_set_aside(self, job, handler, e)
        self.last_seq = e.seq

    def active_jobs(self) -> list[JobState]:
        return [j for j in self.jobs.values() if not j.terminal and not j.corrupt]


def _apply_or_set_aside(s: State, job: JobState, handler: Callable[..., None] | None, e: Event) -> None:
    """Fold ``e``; an event this code cannot read (unknown type, unparsable payload, a field
    missing) sets its job aside as ``corrupt`` with the reason instead of stopping the fold."""
    reason = None
    if handler is None:
        reason = f"unknown event type {e.type!r}"
    elif not isinstance(e.payload, dict) or CORRUPT_KEY in e.payload:
        reason = f"{e.type}: {e.payload.get(CORRUPT_KEY) if isinstance(e.payload, dict) else 'payload is not an object'}"
    else:
        try:
            handler(s, job, e.payload, e)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            reason = f"{e.type} cannot be read: {exc!r}"
    if reason is not None:
        job.corrupt = f"event #{e.seq} {reason}; this job is set aside (the others go on)"
        job.last_error = job.corrupt


def fold(events: Iterable[Event], initial: State | None = None) -> State:
    """The state after ``events``, starting from a copy of ``initial`` (never mutated).

    The cyclic garbage collector is paused while folding: a long log allocates millions of
    small objects that all stay alive, and the collector's repeated passes over them took half
    of the time of folding 1,000,000 events (bench/bench_events.py).  Reference counting still
    frees everything as usual; the previous setting is restored afterwards.
    """
    state = copy.deepcopy(initial) if initial is not None else State()
    apply = state.apply
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        for e in events:
            apply(e)
    finally:
        if paused:
            gc.enable()
    return state


# --- handlers ------------------------------------------------------------------------------------

#: event name -> its fold handler, each tied to its payload type by :func:`folds`
_HANDLERS: dict[str, Callable[..., None]] = {}

_H = TypeVar("_H", bound=Callable[..., None])


def folds(payload: type) -> Callable[[_H], _H]:
    """Make the decorated function the fold handler of the event whose payload type is ``payload``."""
    name = P.declaration_of(payload).name

    def register(handler: _H) -> _H:
        if name in _HANDLERS:
            raise TypeError(f"{name} has two fold handlers")
        _HANDLERS[name] = handler
        return handler

    return register


def _chunk(job: JobState, index: int) -> ChunkState:
    return job.chunks[index]


@folds(P.FileRejected)
def _file_rejected(s: State, job: JobState, p: P.FileRejected, e: Event) -> None:
    job.file, job.source, job.rejected = p["file"], p["path"], True
    job.error = {"code": p["code"], "error": p["reason"], "stage": "inbox", "hint": ""}
    job.last_error = p["reason"]
    job.ended = "failed"
    if p["fingerprint"]:
        s.rejected[p["fingerprint"]] = job.job_id


@folds(P.ScheduledRunStarted)
def _scheduled_run_started(s: State, job: JobState, p: P.ScheduledRunStarted, e: Event) -> None:
    last = s.scheduled_runs.get(p["schedule"])
    if last is None or p["scheduled_for"] >= last["scheduled_for"]:
        s.scheduled_runs[p["schedule"]] = {"scheduled_for": float(p["scheduled_for"]), "files": list(p["files"])}


@folds(P.JobAccepted)
def _job_accepted(s: State, job: JobState, p: P.JobAccepted, e: Event) -> None:
    job.file, job.source, job.profile = p["file"], p["source"], p["profile"]
    job.sha256, job.bytes, job.input_path = p["sha256"], p["bytes"], p["input_path"]
    job.result_name, job.sandbox = p["result_name"], bool(p["sandbox"])
    job.provider, job.provider_id = p.get("provider"), p.get("provider_id")  # optional: absent in older logs
    job.panel_of = p.get("panel_of")
    s.sha_jobs.setdefault(job.sha256, []).append(job.job_id)


@folds(P.PanelStarted)
def _panel_started(s: State, job: JobState, p: P.PanelStarted, e: Event) -> None:
    job.panel = [dict(j) for j in p["judges"]]
    job.settings = dict(p["settings"])


@folds(P.JobPrepared)
def _job_prepared(s: State, job: JobState, p: P.JobPrepared, e: Event) -> None:
    job.prepared = True
    job.format, job.model, job.rows = p["format"], p["model"], p["rows"]
    job.requests, job.estimate = p["requests"], p["estimate_usd"]
    job.requests_path, job.warnings = p["requests_path"], list(p["warnings"])
    job.settings = dict(p.get("settings") or {})  # optional: absent before it was added
    job.deadline_at = p.get("deadline_at")
    job.text_encoding = p.get("text_encoding")
    job.empty_rows = p.get("empty_rows", 0)
    for c in p["chunks"]:
        job.chunks[c["index"]] = ChunkState(
            index=c["index"],
            requests=c["requests"],
            input_tokens=c["input_tokens"],
            bytes=c["bytes"],
            path=c["path"],
            start=c["start"],
            end=c["end"],
        )
    for r in p["row_errors"]:
        job.row_errors[r["custom_id"] or f"row-{r['row']}"] = dict(r)


@folds(P.JobHeld)
def _job_held(s: State, job: JobState, p: P.JobHeld, e: Event) -> None:
    job.held = {"code": p["code"], "reason": p["reason"]}


@folds(P.JobReleased)
def _job_released(s: State, job: JobState, p: P.JobReleased, e: Event) -> None:
    job.held = None
    if p["override"]:
        job.override_budget = True


@folds(P.UploadStarted)
def _upload_started(s: State, job: JobState, p: P.UploadStarted, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.attempt, c.upload, c.filename = p["attempt"], "started", p["filename"]
    c.create, c.file_id, c.batch_id, c.status, c.failure = "none", None, None, None, None
    c.downloads, c.output_file_id, c.error_file_id, c.batch_errors, c.request_counts = {}, None, None, [], {}
    c.create_retried, c.dup_check_due, c.malformed_downloads = False, None, 0
    c.ahead = False


@folds(P.FileUploaded)
def _file_uploaded(s: State, job: JobState, p: P.FileUploaded, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.upload, c.file_id = "done", p["file_id"]


@folds(P.UploadFailed)
def _upload_failed(s: State, job: JobState, p: P.UploadFailed, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.upload, c.last_error = "failed", p["error"]
    job.last_error = p["error"]


@folds(P.BatchCreateRequested)
def _batch_create_requested(s: State, job: JobState, p: P.BatchCreateRequested, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.create, c.metadata, c.requested_ts = "requested", dict(p["metadata"]), e.ts
    c.ahead = False


@folds(P.BatchCreated)
def _batch_created(s: State, job: JobState, p: P.BatchCreated, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.create, c.batch_id, c.status = "done", p["batch_id"], p["status"] or "validating"
    c.read_back = False
    s.batch_index[p["batch_id"]] = (job.job_id, c.index)
    if c.create_retried:
        c.dup_check_due = e.ts  # an earlier create of this attempt may land late: look again


@folds(P.OutputDownloadFailed)
def _download_failed(s: State, job: JobState, p: P.OutputDownloadFailed, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.downloads[p["kind"]] = {"state": "failed", "file_id": p["file_id"], "path": None, "error": p["error"]}
    c.last_error = job.last_error = p["error"]


@folds(P.OutputFileMalformed)
def _output_file_malformed(s: State, job: JobState, p: P.OutputFileMalformed, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.malformed_downloads += 1
    for kind in p["kinds"]:
        c.downloads.pop(kind, None)  # downloaded again


@folds(P.JobRecovered)
def _job_recovered(s: State, job: JobState, p: P.JobRecovered, e: Event) -> None:
    job.recovered_since = float(p["since"] or 0.0)


@folds(P.RecoveredBatchesAdopted)
def _recovered_batches_adopted(s: State, job: JobState, p: P.RecoveredBatchesAdopted, e: Event) -> None:
    job.recovered_since = None


@folds(P.DuplicateBatchesChecked)
def _duplicate_batches_checked(s: State, job: JobState, p: P.DuplicateBatchesChecked, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    if p["attempt"] == c.attempt:
        c.dup_check_due = None


@folds(P.BatchCreateFailed)
def _batch_create_failed(s: State, job: JobState, p: P.BatchCreateFailed, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.create, c.last_error = "failed", p["error"]
    c.create_retried = True
    job.last_error = p["error"]


@folds(P.BatchCancelRequested)
def _cancel_requested_of_batch(s: State, job: JobState, p: P.BatchCancelRequested, e: Event) -> None:
    _chunk(job, p["chunk"]).cancels_asked += 1  # the outcome is the batch's status, read by its poll


@folds(P.BatchStatusChanged)
def _batch_status_changed(s: State, job: JobState, p: P.BatchStatusChanged, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    if c.batch_id != p["batch_id"]:
        return
    c.status, c.read_back = p["status"], True
    c.request_counts = dict(p["request_counts"] or {})
    c.output_file_id = p["output_file_id"]
    c.error_file_id = p["error_file_id"]
    c.batch_errors = list(p["errors"] or [])


@folds(P.OutputDownloadStarted)
def _download_started(s: State, job: JobState, p: P.OutputDownloadStarted, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.downloads[p["kind"]] = {"state": "started", "file_id": p["file_id"], "path": None}


@folds(P.OutputDownloaded)
def _downloaded(s: State, job: JobState, p: P.OutputDownloaded, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.downloads[p["kind"]] = {"state": "done", "file_id": p["file_id"], "path": p["path"], "bytes": p["bytes"]}


@folds(P.TokensUsed)
def _tokens_used(s: State, job: JobState, p: P.TokensUsed, e: Event) -> None:
    job.prompt_tokens += p["prompt_tokens"]
    job.cached_tokens += p["cached_tokens"]
    job.completion_tokens += p["completion_tokens"]
    job.reasoning_tokens += p["reasoning_tokens"]
    cost = float(p["cost_usd"] or 0.0)
    job.cost_usd += cost
    job.cache_write_tokens += int(p.get("cache_write_tokens") or 0)
    job.cache_saved_usd += float(p.get("cache_saved_usd") or 0.0)
    if job.sandbox:
        return  # simulated: never counts towards real budgets
    day = p.get("day") or e.ts[:10]  # optional: absent, the event's own day
    s.spend_by_day[day] = s.spend_by_day.get(day, 0.0) + cost
    s.tokens_by_day[day] = s.tokens_by_day.get(day, 0) + p["prompt_tokens"] + p["completion_tokens"]


@folds(P.RowsFailed)
def _rows_failed(s: State, job: JobState, p: P.RowsFailed, e: Event) -> None:
    for r in p["rows"]:
        info: dict[str, Any] = {"code": r["code"], "message": r["message"], "chunk": p["chunk"]}
        if "status" in r:  # the HTTP status of the row's answer (absent in older logs)
            info["status"] = r["status"]
        job.failed_rows[r["custom_id"]] = info


@folds(P.ChunkCompleted)
def _chunk_completed(s: State, job: JobState, p: P.ChunkCompleted, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.done, c.failure = True, None
    c.succeeded, c.failed = p["succeeded"], p["failed"]
    c.results_path = p["results_path"]


@folds(P.ChunkFailed)
def _chunk_failed(s: State, job: JobState, p: P.ChunkFailed, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    c.failure = {"code": p["code"], "error": p["error"], "retryable": bool(p["retryable"]), "ts": e.ts}
    c.last_error = p["error"]
    job.last_error = p["error"]
    if p["retryable"]:
        c.refusals += 1
    else:
        c.done = True
        c.failed = c.requests


@folds(P.RetryPlanned)
def _retry_planned(s: State, job: JobState, p: P.RetryPlanned, e: Event) -> None:
    ids = list(p["custom_ids"])
    job.chunks[p["chunk"]] = ChunkState(
        index=p["chunk"],
        requests=p["requests"],
        input_tokens=p["input_tokens"],
        bytes=p["bytes"],
        path=p["path"],
        custom_ids=ids,
        route=p.get("route"),
    )
    for cid in ids:
        job.failed_rows.pop(cid, None)
        job.row_attempts[cid] = job.row_attempts.get(cid, 0) + 1
    if p["manual"]:
        job.retry_requested = False


@folds(P.OutboxWriteStarted)
def _outbox_started(s: State, job: JobState, p: P.OutboxWriteStarted, e: Event) -> None:
    job.outbox, job.result_path, job.error_path = "started", p["path"], p["error_path"]


@folds(P.ResultWritten)
def _result_written(s: State, job: JobState, p: P.ResultWritten, e: Event) -> None:
    job.outbox, job.result_path, job.error_path = "done", p["path"], p["error_path"]
    job.result_counts = (p["succeeded"], p["failed"])
    if job.panel is not None:
        job.rows = p["rows"]  # a panel is never prepared: its rows are its result's
    if job.outbox_error is not None:  # written after all: the outbox error is over
        if job.last_error == job.outbox_error:
            job.last_error = None
        job.outbox_error = None


@folds(P.InputArchived)
def _input_archived(s: State, job: JobState, p: P.InputArchived, e: Event) -> None:
    job.archived_path = p["path"]


@folds(P.ProviderFileDeleteRequested)
def _file_delete_requested(s: State, job: JobState, p: P.ProviderFileDeleteRequested, e: Event) -> None:
    job.deletes_asked += 1  # a delete is idempotent: asked again after a crash, never reconciled


@folds(P.ProviderFilesDeleted)
def _provider_files_deleted(s: State, job: JobState, p: P.ProviderFilesDeleted, e: Event) -> None:
    job.provider_files_deleted = True


@folds(P.JobCompleted)
def _job_completed(s: State, job: JobState, p: P.JobCompleted, e: Event) -> None:
    job.ended = p["state"]


@folds(P.JobFailed)
def _job_failed(s: State, job: JobState, p: P.JobFailed, e: Event) -> None:
    job.ended = "failed"
    job.error = {"code": p["code"], "error": p["error"], "stage": p["stage"], "hint": p["hint"]}
    job.last_error = p["error"]


@folds(P.CancelRequested)
def _cancel_requested(s: State, job: JobState, p: P.CancelRequested, e: Event) -> None:
    job.cancel_requested = True


@folds(P.JobCancelled)
def _job_cancelled(s: State, job: JobState, p: P.JobCancelled, e: Event) -> None:
    job.ended = "cancelled"


PREFLIGHT_UNREACHABLE = "preflight: the provider could not be reached"


@folds(P.PreflightRequested)
def _preflight_requested(s: State, job: JobState, p: P.PreflightRequested, e: Event) -> None:
    job.preflight = "requested"
    job.preflight_attempts = int(p["attempt"])
    for cid in p["rows"]:
        if cid in job.preflight_open:  # its earlier request had no outcome (a crash): sent again
            job.preflight_resent.add(cid)
        job.preflight_open.add(cid)


@folds(P.PreflightRowAnswered)
def _preflight_row_answered(s: State, job: JobState, p: P.PreflightRowAnswered, e: Event) -> None:
    """One preflight row answered and paid for (its TokensUsed beside it): kept, never sent again."""
    job.preflight_open.discard(p["custom_id"])
    answer = {k: v for k, v in p.items() if k != "cost_usd"}
    job.preflight_answers = [a for a in job.preflight_answers if a["custom_id"] != p["custom_id"]] + [answer]


@folds(P.PreflightPassed)
def _preflight_passed(s: State, job: JobState, p: P.PreflightPassed, e: Event) -> None:
    if (job.last_error or "").startswith(PREFLIGHT_UNREACHABLE):
        job.last_error = None
    job.preflight, job.preflight_retry_at, job.preflight_error = "passed", None, None
    job.preflight_answers = list(p["answers"])
    job.preflight_open.clear()


@folds(P.PreflightFailed)
def _preflight_failed(s: State, job: JobState, p: P.PreflightFailed, e: Event) -> None:
    job.preflight, job.preflight_retry_at = "failed", None
    job.preflight_error = f"{p['row_code']}: {p['error']}"
    job.preflight_open.clear()
    error = (
        "the preflight (a few rows through the provider's synchronous API, before any batch) failed on "
        f"row {p['custom_id']}: {p['row_code']}: {p['error']}"
    )
    job.start_failure = {
        "code": "preflight_failed",
        "error": error,
        "stage": "preflight",
        "hint": p["hint"] + " No batch was created.",
    }


@folds(P.PrepareFailed)
def _prepare_failed(s: State, job: JobState, p: P.PrepareFailed, e: Event) -> None:
    job.start_failure = {"code": p["code"], "error": p["error"], "stage": "prepare", "hint": p["hint"]}
    job.last_error = p["error"]


@folds(P.PreflightUnreachable)
def _preflight_unreachable(s: State, job: JobState, p: P.PreflightUnreachable, e: Event) -> None:
    job.preflight, job.preflight_retry_at, job.preflight_error = "unreachable", float(p["retry_at"]), p["error"]
    job.last_error = f"{PREFLIGHT_UNREACHABLE} or asked to wait ({p['error']}); try {job.preflight_attempts}, it is sent again"
    job.preflight_open.clear()  # the row sent had its outcome: no answer


@folds(P.OutboxWriteFailed)
def _outbox_write_failed(s: State, job: JobState, p: P.OutboxWriteFailed, e: Event) -> None:
    """The result could not be written (the daemon tries again later): the job's last error."""
    job.last_error = job.outbox_error = p["error"]


@folds(P.RetryRequested)
def _retry_requested(s: State, job: JobState, p: P.RetryRequested, e: Event) -> None:
    """`bgctl retry`: a finished job goes back to work on its failed rows."""
    if job.held:
        job.override_budget = True  # retry on a held job means "submit anyway"
    job.retry_requested = True
    job.retry_bound = p.get("max_completion_tokens")
    job.retry_seq = e.seq
    if job.preflight == "failed":  # after a config change the preflight runs again
        job.preflight, job.preflight_attempts, job.preflight_error = None, 0, None
    job.start_failure = None  # prepared (and preflighted) again
    if job.ended:
        job.reopened_from = job.ended
    job.ended = None
    job.error = None
    job.held = None
    job.cancel_requested = False
    job.outbox = "none"
    job.provider_files_deleted = False


@folds(P.SchemaOverheadLearned)
def _schema_overhead_learned(s: State, job: JobState, p: P.SchemaOverheadLearned, e: Event) -> None:
    s.schema_overhead[(overhead_provider(p.get("provider"), job.sandbox), p["model"], p["schema_sha256"])] = float(
        p["per_request"]
    )


def overhead_provider(provider: str | None, sandbox: bool) -> str:
    """Whose schema overhead a ``SchemaOverheadLearned`` is: its ``provider``; in older logs,
    which do not say, ``sandbox`` for a sandbox job's and "" (any real provider) for another's."""
    if provider:
        return provider
    return "sandbox" if sandbox else ""


@folds(P.JobLeftAlone)
def _job_left_alone(s: State, job: JobState, p: P.JobLeftAlone, e: Event) -> None:
    job.left_alone = job.last_error = p["reason"]


@folds(P.JobTakenUp)
def _job_taken_up(s: State, job: JobState, p: P.JobTakenUp, e: Event) -> None:
    if job.last_error == job.left_alone:
        job.last_error = None
    job.left_alone = None


@folds(P.InputRestored)
def _input_restored(s: State, job: JobState, p: P.InputRestored, e: Event) -> None:
    job.archived_path = None
    job.input_path = p["path"]


@folds(P.QueueLimitLearned)
def _queue_limit_learned(s: State, job: JobState, p: P.QueueLimitLearned, e: Event) -> None:
    s.queue_limits[(p["base_url"] or "", p["model"] or "")] = {
        "limit": int(p["limit"] or 0),
        "exact": bool(p["exact"]),
        "source": p["source"],
        "ts": e.ts,
    }


@folds(P.ChunkReplanned)
def _chunk_replanned(s: State, job: JobState, p: P.ChunkReplanned, e: Event) -> None:
    """The refused chunk is done (nothing was answered or billed); its rows live on in new
    chunks.  Unlike RetryPlanned, no row's retry counter moves."""
    c = _chunk(job, p["chunk"])
    c.done, c.failure = True, None
    for n in p["chunks"]:
        job.chunks[n["index"]] = ChunkState(
            index=n["index"],
            requests=n["requests"],
            input_tokens=n["input_tokens"],
            bytes=n["bytes"],
            path=n["path"],
            custom_ids=list(n["custom_ids"]),
        )


@folds(P.UploadAheadPlanned)
def _upload_ahead_planned(s: State, job: JobState, p: P.UploadAheadPlanned, e: Event) -> None:
    c = _chunk(job, p["chunk"])
    if c.attempt == p["attempt"] and c.create == "none":
        c.ahead = True


@folds(P.JobEndHookStarted)
def _job_end_hook_started(s: State, job: JobState, p: P.JobEndHookStarted, e: Event) -> None:
    job.end_hook_seq = p["end_seq"]


@folds(P.FreshAnswersRequested)
def _fresh_requested(s: State, job: JobState, p: P.FreshAnswersRequested, e: Event) -> None:
    job.fresh = True


@folds(P.RequestsReused)
def _requests_reused(s: State, job: JobState, p: P.RequestsReused, e: Event) -> None:
    job.cached_rows = int(p["cached_rows"])
    job.duplicate_rows = int(p["duplicate_rows"])
    job.copied_rows = int(p.get("copied_rows") or 0)
    job.saved_usd += float(p["saved_usd"] or 0.0)
    job.reuse_path = p["path"]


@folds(P.DuplicatesAnswered)
def _duplicates_answered(s: State, job: JobState, p: P.DuplicatesAnswered, e: Event) -> None:
    job.duplicates_answered += int(p["rows"])
    job.saved_usd += float(p["saved_usd"] or 0.0)


@folds(P.AnswersToStore)
def _answers_to_store(s: State, job: JobState, p: P.AnswersToStore, e: Event) -> None:
    _chunk(job, p["chunk"]).answers_due = int(p["rows"])


@folds(P.AnswersStored)
def _answers_stored(s: State, job: JobState, p: P.AnswersStored, e: Event) -> None:
    _chunk(job, p["chunk"]).answers_due = None


@folds(P.InputTokensCounted)
def _input_tokens_counted(s: State, job: JobState, p: P.InputTokensCounted, e: Event) -> None:
    job.input_tokens_exact = bool(p["exact"])


for _payload, _handler in ROUTE_FOLDS:  # the synchronous routes' handlers live with their state
    folds(_payload)(_handler)

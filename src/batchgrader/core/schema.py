"""The event catalogue and the SQL schema of the event log.

Events are immutable, past-tense facts.  Each type has a version; a payload written by an
older version is upcast when read (:func:`upcast`), the stored row is never rewritten.
``docs/events.md`` documents every event; ``tests/test_readmodels.py`` keeps the two in step.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EventType:
    name: str
    version: int
    step: str  # which step emits it
    fields: Mapping[str, str]  # payload field -> description (every field, required or optional)
    intent_for: str | None = None  # for intents: the outcome event(s) that close them
    optional: frozenset[str] = frozenset()  # fields a payload may leave out

    @property
    def required(self) -> frozenset[str]:
        return frozenset(self.fields) - self.optional


def _t(
    name: str, version: int, step: str, fields: dict[str, str], intent_for: str | None = None, optional: tuple[str, ...] = ()
) -> EventType:
    return EventType(name, version, step, fields, intent_for, frozenset(optional))


EVENTS: dict[str, EventType] = {
    e.name: e
    for e in [
        # --- intake ------------------------------------------------------------------------
        _t(
            "FileRejected",
            1,
            "inbox",
            {
                "file": "original file name",
                "path": "where the file was found (left in place when it is not a regular file)",
                "reason": "human-readable reason",
                "code": "machine code (not_regular_file, unsupported_format, ...)",
                "fingerprint": "inode/size/mtime key so the same file is not reported twice",
            },
        ),
        _t(
            "JobAccepted",
            1,
            "inbox",
            {
                "file": "original file name",
                "source": "path in the inbox it came from",
                "profile": "profile name",
                "sha256": "content hash",
                "bytes": "file size",
                "input_path": "its path in the work area",
                "result_name": "outbox file name for the result",
                "sandbox": "true when results are simulated by the emulator",
                "provider": "(optional) the profile's provider when the job was accepted (openai, azure, anthropic, gemini): the job's batches go there, whatever the profile says later",
                "provider_id": "(optional) who answers the job: the endpoint identity of pipeline/answerkey.provider_id_of (sandbox or sandbox:<provider> in the sandbox); its answers are stored under it",
            },
            optional=("provider", "provider_id"),  # absent from payloads written before they were added
        ),
        _t(
            "JobPrepared",
            1,
            "prepare",
            {
                "format": "csv/json/jsonl/xlsx/parquet",
                "model": "model",
                "encoding": "tiktoken encoding",
                "rows": "data rows",
                "requests": "requests in chunks",
                "input_tokens": "exact prompt tokens of those requests",
                "max_request_tokens": "largest single request",
                "chunks": "list of {index, start, end, requests, input_tokens, bytes, path}",
                "row_errors": "rows that cannot be sent: list of {row, custom_id, code, message}",
                "estimate_usd": "{input, max_output, max_total} or null",
                "warnings": "list of strings",
                "requests_path": "JSONL of every row's request, kept for retries",
                "settings": "(optional) the profile settings the result file is written with (output_column, response_format, id_column, csv_formula_guard, sheet, encoding), fixed at preparation",
            },
            optional=("settings",),  # absent from payloads written before it was added
        ),
        _t("JobHeld", 1, "budget", {"code": "budget key that holds it", "reason": "human-readable reason and what to do"}),
        _t(
            "JobReleased",
            1,
            "budget / bgctl retry",
            {"reason": "why it may go on", "override": "true when the user chose to submit despite the budget"},
        ),
        # --- the preflight: the first rows through the synchronous API, before any batch ----
        _t(
            "PreflightRequested",
            1,
            "preflight",
            {
                "rows": "custom_ids of the rows sent (the first `preflight_rows` rows)",
                "attempt": "1 for the first try; one more for each try after the provider could not be reached or a crash",
            },
            intent_for="PreflightPassed|PreflightFailed|PreflightUnreachable",
        ),
        _t(
            "PreflightPassed",
            1,
            "preflight",
            {
                "answers": "per row: {custom_id, key, content, finish_reason, prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens}; these rows are answered and not sent in a batch",
                "cost_usd": "what the rows cost at the standard (not batch) price (also in the TokensUsed with chunk -1 beside it)",
            },
        ),
        _t(
            "PreflightFailed",
            1,
            "preflight",
            {
                "custom_id": "the row that failed",
                "row_code": "its code: the provider's HTTP error code, or truncated, refused, invalid_output, unexpected_finish",
                "error": "the provider's own message",
                "hint": "the fix",
            },
        ),
        _t(
            "PreflightUnreachable",
            1,
            "preflight",
            {
                "error": "why the provider could not be reached (or asked to wait)",
                "retry_at": "when the preflight is sent again (epoch seconds; backoff doubling from 5 s to 5 min)",
            },
        ),
        # --- the synchronous routes (route: flex | online | auto): rows one by one ----------
        _t(
            "RouteChosen",
            1,
            "route",
            {
                "route": "batch, flex or online: how the job's rows travel",
                "reason": "why (the profile's route, or what route: auto weighed)",
                "rows": "rows of the file (the requests the synchronous route sends)",
            },
        ),
        _t(
            "OnlineRequestSent",
            1,
            "route (intent)",
            {
                "custom_id": "the row sent",
                "attempt": "1 for the first try, one more for each try after a 429, a 5xx or a crash",
                "tier": "flex or online",
                "resent_after_crash": "true when an earlier request of the row had no outcome (a crash): sent again once",
            },
            intent_for="OnlineRequestAnswered|OnlineRequestFailed",
        ),
        _t(
            "OnlineRequestAnswered",
            1,
            "route",
            {
                "custom_id": "the row",
                "key": "its request key (the answers store's key)",
                "content": "the answer",
                "finish_reason": "the provider's finish reason",
                "prompt_tokens": "billed input tokens",
                "cached_tokens": "of which read from the prompt cache",
                "completion_tokens": "billed output tokens",
                "reasoning_tokens": "of which reasoning",
                "tier": "flex or online",
                "cost_usd": "its cost (flex: the Batch price; online: the standard price; also in the TokensUsed with chunk -1 beside it)",
            },
        ),
        _t(
            "OnlineRequestFailed",
            1,
            "route",
            {
                "custom_id": "the row",
                "code": "rate_limited, server_error, outcome_unknown, or the provider's error code (http_<status> when it has none)",
                "error": "the provider's message",
                "status_code": "the HTTP status (null: no answer)",
                "retry_at": "when it may be sent again (epoch seconds; the provider's Retry-After when it gave one); null when final",
                "final": "true: not sent on this route again (attempts used up, or refused for good); the row goes in the job's batch",
            },
        ),
        _t(
            "OnlineRowsDone",
            1,
            "route",
            {
                "answered": "rows answered on the route",
                "to_batch": "rows whose requests failed for good: they go in the job's batch",
                "resent_after_crash": "requests sent again because a crash left them without an outcome",
                "cost_usd": "what the answered rows cost",
            },
        ),
        # --- per chunk: upload ---------------------------------------------------------------
        _t(
            "UploadStarted",
            1,
            "upload (intent)",
            {
                "chunk": "chunk index",
                "attempt": "attempt number of this chunk (1-based)",
                "filename": "deterministic upload name",
                "bytes": "size of the chunk file",
            },
            intent_for="FileUploaded|UploadFailed",
        ),
        _t(
            "FileUploaded",
            1,
            "upload (outcome)",
            {
                "chunk": "chunk index",
                "attempt": "attempt",
                "file_id": "provider file id",
                "reconciled": "found by listing after an ambiguous outcome",
            },
        ),
        _t(
            "UploadFailed",
            1,
            "upload (outcome)",
            {"chunk": "chunk index", "attempt": "attempt", "error": "message", "definite": "true when the provider rejected it"},
        ),
        # --- per chunk: batch ----------------------------------------------------------------
        _t(
            "BatchCreateRequested",
            1,
            "submit (intent)",
            {
                "chunk": "chunk index",
                "attempt": "attempt",
                "input_file_id": "uploaded file",
                "metadata": "metadata tags sent with the batch",
            },
            intent_for="BatchCreated|BatchCreateFailed",
        ),
        _t(
            "BatchCreated",
            1,
            "submit (outcome)",
            {
                "chunk": "chunk index",
                "attempt": "attempt",
                "batch_id": "provider batch id",
                "status": "initial status",
                "reconciled": "found by listing after an ambiguous outcome",
            },
        ),
        _t(
            "BatchCreateFailed",
            1,
            "submit (outcome)",
            {
                "chunk": "chunk index",
                "attempt": "attempt",
                "error": "message",
                "definite": "true when the provider rejected it or listing proved it absent",
            },
        ),
        _t(
            "BatchStatusChanged",
            1,
            "poll",
            {
                "chunk": "chunk index",
                "batch_id": "batch",
                "status": "new status",
                "request_counts": "{total, completed, failed}",
                "output_file_id": "or null",
                "error_file_id": "or null",
                "errors": "batch-level errors [{code, message, line}]",
            },
        ),
        _t(
            "JobRecovered",
            1,
            "inbox (recovery)",
            {
                "since": "epoch seconds: batches created after this may be the job's (from before the log was lost)",
                "reason": "why (a work folder with a claim but no JobAccepted in the log)",
            },
        ),
        _t(
            "RecoveredBatchesAdopted",
            1,
            "submit (reconcile)",
            {
                "adopted": "chunk index -> batch id found at the provider under the job's bg_key",
                "ignored": "batches of the job that did not match a chunk (size or state)",
            },
        ),
        _t(
            "OutputDownloadFailed",
            1,
            "download (outcome)",
            {
                "chunk": "chunk index",
                "batch_id": "batch",
                "file_id": "provider file",
                "kind": "output or error",
                "error": "why the file cannot be had (404: expired or deleted; or the last error)",
                "attempts": "downloads tried",
            },
        ),
        _t(
            "OutputFileMalformed",
            1,
            "merge",
            {
                "chunk": "chunk index",
                "batch_id": "batch",
                "kinds": "the downloaded files (output/error) with malformed lines; they are downloaded again",
                "lines": "how many lines could not be read",
                "problem": "the first problem found",
            },
        ),
        _t(
            "DuplicateBatchesChecked",
            1,
            "submit (reconcile)",
            {
                "chunk": "chunk index",
                "attempt": "attempt",
                "batch_id": "the chunk's recorded batch (kept)",
                "extras": "other batches found under the same bg_key / input file",
                "cancelled": "extras a cancel was sent for (those not yet terminal)",
            },
        ),
        _t(
            "OutputDownloadStarted",
            1,
            "download (intent)",
            {"chunk": "chunk index", "batch_id": "batch", "file_id": "provider file", "kind": "output or error"},
            intent_for="OutputDownloaded",
        ),
        _t(
            "OutputDownloaded",
            1,
            "download (outcome)",
            {
                "chunk": "chunk index",
                "batch_id": "batch",
                "file_id": "provider file",
                "kind": "output or error",
                "path": "local path",
                "bytes": "size",
            },
        ),
        _t(
            "TokensUsed",
            1,
            "merge",
            {
                "chunk": "chunk index",
                "batch_id": "batch",
                "model": "model",
                "prompt_tokens": "billed prompt tokens",
                "cached_tokens": "of which cached",
                "completion_tokens": "billed completion tokens (reasoning included)",
                "reasoning_tokens": "reasoning tokens",
                "cost_usd": "billed cost from the pricing table",
                "day": "(optional) UTC day (YYYY-MM-DD) of the fact; absent: the UTC day of the event's ts",
                "cache_write_tokens": "(optional) of prompt_tokens, prompt-cache writes (billed at the cache-write price); absent: 0",
                "cache_saved_usd": "(optional) what prompt caching saved: the cost with every prompt token at the input price, minus cost_usd (negative when writes cost more than reads saved); absent: 0",
                "route": "(optional) flex or online: a row answered on a synchronous route; absent: a batch (chunk -1: the preflight)",
            },
            # the fold has always taken the event's own day when it is absent; the cache figures and the route were added later
            optional=("day", "cache_write_tokens", "cache_saved_usd", "route"),
        ),
        _t(
            "SchemaOverheadLearned",
            1,
            "merge",
            {
                "model": "model",
                "schema_sha256": "sha256 of the response_format (canonical JSON)",
                "chunk": "the chunk it was learned from",
                "requests": "rows answered in that chunk",
                "counted_tokens": "input tokens counted locally (tiktoken) for those rows",
                "billed_prompt_tokens": "prompt tokens the provider billed for them",
                "per_request": "(billed - counted) / requests: the schema's overhead per request",
                "provider": "(optional) who billed it: the job's provider_id (sandbox or sandbox:<provider> in the sandbox); absent in older logs, where the job's sandbox flag tells sandbox from real",
            },
            optional=("provider",),
        ),
        _t(
            "RowsFailed",
            1,
            "merge",
            {
                "chunk": "chunk index",
                "batch_id": "batch or null",
                "rows": "list of {custom_id, code, message[, status: HTTP status]}",
            },
        ),
        _t(
            "ChunkCompleted",
            1,
            "merge",
            {
                "chunk": "chunk index",
                "batch_id": "batch",
                "status": "final batch status",
                "succeeded": "rows answered",
                "failed": "rows failed",
                "results_path": "local per-row results file",
            },
        ),
        _t(
            "ChunkFailed",
            1,
            "poll / submit",
            {
                "chunk": "chunk index",
                "batch_id": "batch or null",
                "code": "error code",
                "error": "message",
                "retryable": "true when it will be resubmitted later (token_limit_exceeded)",
            },
        ),
        _t(
            "RetryPlanned",
            1,
            "retry",
            {
                "chunk": "new chunk index",
                "source_chunks": "chunks whose rows are retried",
                "custom_ids": "rows to resubmit",
                "requests": "count",
                "input_tokens": "exact tokens",
                "bytes": "size",
                "path": "chunk file",
                "manual": "true for bgctl retry",
            },
        ),
        # --- job end -------------------------------------------------------------------------
        _t(
            "OutboxWriteStarted",
            1,
            "outbox (intent)",
            {"path": "final result path", "error_path": "error report path or null"},
            intent_for="ResultWritten",
        ),
        _t(
            "ResultWritten",
            1,
            "outbox (outcome)",
            {
                "path": "result file",
                "rows": "rows written",
                "succeeded": "rows with an answer",
                "failed": "rows with an error",
                "error_path": "error report or null",
            },
        ),
        _t("InputArchived", 1, "outbox", {"path": "where the original input now lives (archive/ or failed/)"}),
        _t("ProviderFilesDeleted", 1, "cleanup", {"file_ids": "provider files deleted"}),
        _t("JobCompleted", 1, "finish", {"state": "completed or completed_with_errors", "succeeded": "rows", "failed": "rows"}),
        _t(
            "JobFailed",
            1,
            "any",
            {"code": "machine code", "error": "specific message", "stage": "step that failed", "hint": "what to do"},
        ),
        _t("CancelRequested", 1, "bgctl cancel", {"reason": "why"}),
        _t("JobCancelled", 1, "cancel", {"succeeded": "rows answered before the cancel", "failed": "rows without an answer"}),
        _t(
            "RetryRequested",
            1,
            "bgctl retry",
            {
                "reason": "why",
                "max_completion_tokens": "(optional) the output bound of the rows sent again (`bgctl retry --max-completion-tokens`)",
            },
            optional=("max_completion_tokens",),
        ),
        _t("InputRestored", 1, "retry", {"path": "the input moved back from archive/ or failed/ into the work area"}),
        # --- scheduling: the provider's queue limit ---------------------------------------------
        _t(
            "QueueLimitLearned",
            1,
            "schedule",
            {
                "base_url": "provider base URL the limit applies to ('sandbox' for the sandbox emulator)",
                "model": "model",
                "limit": "prompt tokens that may be in flight for the model at once",
                "exact": "true when the provider's message stated the figure",
                "source": "message (read from the refusal), halved (no figure: half of what was in flight) or probe (raised after a batch completed)",
                "chunk": "the refused or completed chunk that taught it, or null",
                "message": "the provider's message, or null",
            },
        ),
        _t(
            "ChunkReplanned",
            1,
            "schedule",
            {
                "chunk": "the refused chunk, larger than the queue limit; it is done, its rows move to the new chunks",
                "limit": "the queue limit the new chunks fit under",
                "chunks": "new chunks: list of {index, custom_ids, requests, input_tokens, bytes, path}",
                "oversized": "rows that alone exceed the limit: list of {custom_id, tokens} (failed with request_too_large in the same append)",
            },
        ),
        _t(
            "UploadAheadPlanned",
            1,
            "schedule",
            {
                "chunk": "the chunk whose file is uploaded ahead of queue room (by the UploadStarted just before, in the same append)",
                "attempt": "the upload's attempt number",
                "limit": "the queue limit in force for the model when it was decided",
                "enqueued": "the model's prompt tokens in flight then (the chunk waits until its tokens fit beside them)",
            },
        ),
        _t(
            "JobLeftAlone",
            1,
            "engine",
            {
                "code": "sandbox_job (a sandbox job met by a normal daemon), real_job (a real job met by a sandbox daemon) or endpoint_changed (the job's provider endpoint is not this daemon's)",
                "reason": "human-readable reason and how to finish the job",
            },
        ),
        _t(
            "JobTakenUp",
            1,
            "engine",
            {"sandbox": "the mode of the daemon that took the job up again after JobLeftAlone"},
        ),
        _t(
            "JobEndHookStarted",
            1,
            "job end",
            {
                "end_seq": "job_seq of the job's last event when it ended (one run per end)",
                "timeout_seconds": "time limit of the command",
            },
        ),
        # --- reusing answers (pipeline/reuse.py, store/answers.py) ---------------------------------
        _t(
            "FreshAnswersRequested",
            1,
            "inbox (bgctl submit --fresh)",
            {"reason": "why: every row of this job is sent, no stored answer is reused and no duplicate is merged"},
        ),
        _t(
            "RequestsReused",
            1,
            "prepare",
            {
                "cached_rows": "rows answered from the answers store (not sent)",
                "duplicate_rows": "rows whose request repeats an earlier row's in the file (sent once, answer copied at merge)",
                "saved_usd": "what the cached rows' answers cost when first answered, at today's prices",
                "usage": "{prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens} of the cached answers, as first billed",
                "path": "the decision, per row: results/reused.jsonl (each cached row's answer, each duplicate's leader)",
            },
        ),
        _t(
            "DuplicatesAnswered",
            1,
            "merge",
            {
                "chunk": "chunk index whose rows led the duplicates",
                "rows": "duplicate rows given their leader's outcome",
                "succeeded": "of which answered",
                "saved_usd": "what sending them would have cost (their leaders' billed usage)",
            },
        ),
        _t(
            "AnswersToStore",
            1,
            "merge",
            {
                "chunk": "the merged chunk (appended with its ChunkCompleted) whose successful answers go into the answer store",
                "rows": "result records of the chunk's sent rows to read (the first lines of its results file)",
                "answers": "successful answers among them",
            },
        ),
        _t(
            "AnswersStored",
            1,
            "merge",
            {
                "chunk": "the chunk whose answers were stored (in the same transaction as the answers)",
                "error": "null, or why none were stored (its results file could not be read); the job goes on",
            },
        ),
        _t(
            "InputTokensCounted",
            1,
            "prepare",
            {
                "exact": "true: the provider's counting endpoint counted every request sent; false: tiktoken estimates",
                "source": "who counted: '<provider> counting endpoint' or 'estimate'",
                "input_tokens": "the planned chunks' input tokens (as in JobPrepared)",
                "reason": "why the counts are estimates (null when exact)",
            },
        ),
        _t(
            "OutboxWriteFailed",
            1,
            "outbox",
            {
                "path": "the file that could not be written (result or error report)",
                "error": "what the user sees as the job's last error, e.g. 'cannot write the outbox: permission denied: PATH'",
                "code": "the cause in one word: permission_denied, no_space, read_only, not_found or os_error",
            },
        ),
    ]
}


class EventPayloadError(ValueError):
    """An event to append is not in the catalogue, or its payload misses or misspells a field."""


def check_payload(type_: str, payload: Mapping[str, Any]) -> None:
    """Refuse, before anything is written, an unknown event type or a payload with a missing
    required field or a field the type does not declare."""
    et = EVENTS.get(type_)
    if et is None:
        near = difflib.get_close_matches(type_, EVENTS, n=1)
        raise EventPayloadError(f"unknown event type {type_!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    problems = []
    missing = sorted(et.required - payload.keys())
    if missing:
        problems.append("missing " + ", ".join(missing))
    for key in sorted(payload.keys() - et.fields.keys()):
        near = difflib.get_close_matches(key, et.fields, n=1)
        problems.append(f"unknown field {key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    if problems:
        raise EventPayloadError(f"{type_} v{et.version}: " + "; ".join(problems) + f"; fields: {', '.join(et.fields)}")


# Upcasters: (type, from_version) -> function(payload) -> payload of from_version + 1.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


def upcast(type_: str, version: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Bring a stored payload to the current version of its type."""
    current = EVENTS[type_].version if type_ in EVENTS else version
    while version < current:
        payload = UPCASTERS[(type_, version)](payload)
        version += 1
    return payload


SCHEMA_VERSION = 1

EVENTS_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS events (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,  -- global order (the notification log)
        job_id   TEXT    NOT NULL,
        job_seq  INTEGER NOT NULL,                   -- per-job order, 1, 2, 3...
        type     TEXT    NOT NULL,
        version  INTEGER NOT NULL,
        ts       TEXT    NOT NULL,                   -- UTC ISO-8601 when recorded
        payload  TEXT    NOT NULL,                   -- JSON
        UNIQUE (job_id, job_seq)
    )""",
    """CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are immutable'); END""",
    """CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END""",
)

"""The event declarations of a job's chunks (upload, create, poll, collect, merge, retry, queue
limits) and the payload parts events share; :mod:`batchgrader.core.log.payloads` imports them, so
``payloads.X`` names every event's payload type."""

# no `from __future__ import annotations` here: TypedDict must see NotRequired itself (Python 3.11)
from typing import Any, NotRequired, TypedDict

from batchgrader.core.log.eventdecl import event

# --- parts -----------------------------------------------------------------------------------------


class PlannedChunk(TypedDict):
    index: int
    start: int
    end: int
    requests: int
    input_tokens: int
    bytes: int
    path: str


class RowsChunk(TypedDict):  # a chunk of named rows (re-planned)
    index: int
    custom_ids: list[str]
    requests: int
    input_tokens: int
    bytes: int
    path: str


class RowError(TypedDict):
    row: int
    line: NotRequired[int]
    custom_id: str | None
    code: str
    message: str


class FailedRow(TypedDict):
    custom_id: str
    code: str | None
    message: str | None
    status: NotRequired[int]  # the HTTP status of the row's answer, when it had one (absent in older logs)


# --- per chunk: upload, create, poll ---------------------------------------------------------------


@event(
    1,
    "upload (intent)",
    {
        "chunk": "chunk index",
        "attempt": "attempt number of this chunk (1-based)",
        "filename": "deterministic upload name",
        "bytes": "size of the chunk file",
    },
    intent_for="FileUploaded|UploadFailed",
)
class UploadStarted(TypedDict):
    chunk: int
    attempt: int
    filename: str | None
    bytes: int


@event(
    1,
    "upload (outcome)",
    {
        "chunk": "chunk index",
        "attempt": "attempt",
        "file_id": "provider file id",
        "reconciled": "found by listing after an ambiguous outcome",
    },
)
class FileUploaded(TypedDict):
    chunk: int
    attempt: int
    file_id: str
    reconciled: bool


@event(
    1,
    "upload (outcome)",
    {"chunk": "chunk index", "attempt": "attempt", "error": "message", "definite": "true when the provider rejected it"},
)
class UploadFailed(TypedDict):
    chunk: int
    attempt: int
    error: str | None
    definite: bool


@event(
    1,
    "submit (intent)",
    {
        "chunk": "chunk index",
        "attempt": "attempt",
        "input_file_id": "uploaded file",
        "metadata": "metadata tags sent with the batch",
    },
    intent_for="BatchCreated|BatchCreateFailed",
)
class BatchCreateRequested(TypedDict):
    chunk: int
    attempt: int
    input_file_id: str
    metadata: dict[str, str]


@event(
    1,
    "submit (outcome)",
    {
        "chunk": "chunk index",
        "attempt": "attempt",
        "batch_id": "provider batch id",
        "status": "initial status",
        "reconciled": "found by listing after an ambiguous outcome",
    },
)
class BatchCreated(TypedDict):
    chunk: int
    attempt: int
    batch_id: str
    status: str | None
    reconciled: bool


@event(
    1,
    "submit (outcome)",
    {
        "chunk": "chunk index",
        "attempt": "attempt",
        "error": "message",
        "definite": "true when the provider rejected it or listing proved it absent",
    },
)
class BatchCreateFailed(TypedDict):
    chunk: int
    attempt: int
    error: str | None
    definite: bool


@event(
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
)
class BatchStatusChanged(TypedDict):
    chunk: int
    batch_id: str | None
    status: str
    request_counts: dict[str, int] | None
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict[str, Any]] | None


@event(
    1,
    "inbox (recovery)",
    {
        "since": "epoch seconds: batches created after this may be the job's (from before the log was lost)",
        "reason": "why (a work folder with a claim but no JobAccepted in the log)",
    },
)
class JobRecovered(TypedDict):
    since: float | None
    reason: str


@event(
    1,
    "submit (reconcile)",
    {
        "adopted": "chunk index -> batch id found at the provider under the job's bg_key",
        "ignored": "batches of the job that did not match a chunk (size or state)",
    },
)
class RecoveredBatchesAdopted(TypedDict):
    adopted: dict[str, str]
    ignored: list[Any]


@event(
    1,
    "submit (reconcile)",
    {
        "chunk": "chunk index",
        "attempt": "attempt",
        "batch_id": "the chunk's recorded batch (kept)",
        "extras": "other batches found under the same bg_key / input file",
        "cancelled": "extras a cancel was sent for (those not yet terminal)",
    },
)
class DuplicateBatchesChecked(TypedDict):
    chunk: int
    attempt: int | None
    batch_id: str | None
    extras: list[Any]
    cancelled: list[Any]


# --- per chunk: collect ----------------------------------------------------------------------------


@event(
    1,
    "download (intent)",
    {"chunk": "chunk index", "batch_id": "batch", "file_id": "provider file", "kind": "output or error"},
    intent_for="OutputDownloaded",
)
class OutputDownloadStarted(TypedDict):
    chunk: int
    batch_id: str | None
    file_id: str
    kind: str


@event(
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
)
class OutputDownloaded(TypedDict):
    chunk: int
    batch_id: str | None
    file_id: str
    kind: str
    path: str | None
    bytes: int


@event(
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
)
class OutputDownloadFailed(TypedDict):
    chunk: int
    batch_id: str | None
    file_id: str
    kind: str
    error: str | None
    attempts: int


@event(
    1,
    "merge",
    {
        "chunk": "chunk index",
        "batch_id": "batch",
        "kinds": "the downloaded files (output/error) with malformed lines; they are downloaded again",
        "lines": "how many lines could not be read",
        "problem": "the first problem found",
    },
)
class OutputFileMalformed(TypedDict):
    chunk: int
    batch_id: str | None
    kinds: list[str]
    lines: int
    problem: str


@event(
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
        "day": "UTC day (YYYY-MM-DD) of the fact; absent: the UTC day of the event's ts",
        "cache_write_tokens": "of prompt_tokens, prompt-cache writes (billed at the cache-write price); absent: 0",
        "cache_saved_usd": "what prompt caching saved: the cost with every prompt token at the input price, minus cost_usd (negative when writes cost more than reads saved); absent: 0",
        "route": "flex or online: a row answered on a synchronous route; absent: a batch (chunk -1: the preflight)",
    },
)
class TokensUsed(TypedDict):
    chunk: int | None
    batch_id: str | None
    model: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost_usd: float | None
    day: NotRequired[str | None]
    cache_write_tokens: NotRequired[int]
    cache_saved_usd: NotRequired[float]
    route: NotRequired[str]


@event(
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
        "provider": "who billed it: the job's provider_id (sandbox or sandbox:<provider> in the sandbox); absent in older logs, where the job's sandbox flag tells sandbox from real",
    },
)
class SchemaOverheadLearned(TypedDict):
    model: str
    schema_sha256: str
    chunk: int
    requests: int
    counted_tokens: int
    billed_prompt_tokens: int
    per_request: float
    provider: NotRequired[str | None]


@event(
    1,
    "merge",
    {
        "chunk": "chunk index",
        "batch_id": "batch or null",
        "rows": "list of {custom_id, code, message} (and `status`, the HTTP status of the row's answer, when it had one; absent in older logs)",
    },
)
class RowsFailed(TypedDict):
    chunk: int | None
    batch_id: str | None
    rows: list[FailedRow]


@event(
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
)
class ChunkCompleted(TypedDict):
    chunk: int
    batch_id: str | None
    status: str | None
    succeeded: int
    failed: int
    results_path: str | None


@event(
    1,
    "poll / submit",
    {
        "chunk": "chunk index",
        "batch_id": "batch or null",
        "code": "error code",
        "error": "message",
        "retryable": "true when it will be resubmitted later (token_limit_exceeded)",
    },
)
class ChunkFailed(TypedDict):
    chunk: int
    batch_id: str | None
    code: str | None
    error: str | None
    retryable: bool


@event(
    1,
    "retry",
    {
        "chunk": "new chunk index",
        "source_chunks": "chunks whose rows are retried",
        "custom_ids": "rows to resubmit (with the failed duplicates of a failed leader: they are not in the file and take the leader's outcome when the chunk is merged)",
        "requests": "count (requests in the chunk file)",
        "input_tokens": "exact tokens",
        "bytes": "size",
        "path": "chunk file",
        "manual": "true for bgctl retry",
        "route": "flex or online: the rows of a straggler's cancelled batch, sent through the synchronous route, not in a batch (absent: a batch)",
    },
)
class RetryPlanned(TypedDict):
    chunk: int
    source_chunks: list[int]
    custom_ids: list[str]
    requests: int
    input_tokens: int
    bytes: int
    path: str
    manual: bool
    route: NotRequired[str]


@event(
    1,
    "cancel (intent)",
    {
        "chunk": "chunk index",
        "batch_id": "the batch whose cancel is asked (the chunk's own, or an extra batch of it: a late create)",
        "reason": "cancelled (bgctl cancel), straggler (its deadline nears) or duplicate (an extra batch of the chunk)",
    },
)
class BatchCancelRequested(TypedDict):
    chunk: int
    batch_id: str
    reason: str


@event(
    1,
    "stragglers",
    {
        "chunk": "chunk index",
        "batch_id": "the running batch cancelled",
        "deadline_at": "when the job is due (epoch seconds)",
        "margin_seconds": "how long before the deadline its batches are cancelled (the synchronous route's time for the unanswered rows, 300 s to 3600 s)",
        "reason": "why, in words (shown by `bgctl status`)",
    },
)
class StragglerCancelRequested(TypedDict):
    chunk: int
    batch_id: str
    deadline_at: float
    margin_seconds: float
    reason: str


@event(
    1,
    "stragglers",
    {
        "chunk": "chunk index: a chunk never sent in a batch",
        "route": "flex or online: the synchronous route its rows take instead",
        "deadline_at": "when the job is due (epoch seconds)",
        "margin_seconds": "the synchronous route's time for the chunk's rows (300 s to 3600 s)",
        "reason": "why, in words (in the daemon's log and `bgctl events`)",
    },
)
class ChunkRouted(TypedDict):
    chunk: int
    route: str
    deadline_at: float
    margin_seconds: float
    reason: str


@event(
    1,
    "schedule",
    {
        "base_url": "whose queue the limit applies to: the OpenAI base URL, the Azure resource endpoint, the provider id of Anthropic and Gemini (`anthropic:<url>`, `gemini:<url>`), or in the sandbox `sandbox` (OpenAI) and `sandbox:<provider>`: never a real provider's",
        "model": "model",
        "limit": "prompt tokens that may be in flight for the model at once",
        "exact": "true when the provider's message stated the figure",
        "source": "message, halved or probe",
        "chunk": "the refused or completed chunk that taught it, or null",
        "message": "the provider's message, or null",
    },
)
class QueueLimitLearned(TypedDict):
    base_url: str | None
    model: str | None
    limit: int | None
    exact: bool
    source: str | None
    chunk: int | None
    message: str | None


@event(
    1,
    "schedule",
    {
        "chunk": "the refused chunk",
        "limit": "the queue limit the new chunks fit under",
        "chunks": "new chunks: list of {index, custom_ids, requests, input_tokens, bytes, path}",
        "oversized": "rows that alone exceed the limit: list of {custom_id, tokens}",
    },
)
class ChunkReplanned(TypedDict):
    chunk: int
    limit: int
    chunks: list[RowsChunk]
    oversized: list[dict[str, Any]]


@event(
    1,
    "schedule",
    {
        "chunk": "the chunk whose file is uploaded ahead of queue room",
        "attempt": "the upload's attempt number",
        "limit": "the queue limit in force for the model when it was decided",
        "enqueued": "the model's prompt tokens in flight then",
    },
)
class UploadAheadPlanned(TypedDict):
    chunk: int
    attempt: int
    limit: int | None
    enqueued: int

"""Typed payloads: one ``TypedDict`` per event type of :data:`batchgrader.core.schema.EVENTS`.

The catalogue in ``schema`` names each type's fields and which ones a payload may leave out;
these classes give the same fields their Python types, so that the fold
(:mod:`batchgrader.core.state`) reads ``p["field"]`` with a type the checker knows instead of
``dict.get`` with a default.  A field the catalogue marks optional is ``NotRequired`` here;
``tests/test_payloads.py`` keeps the two in step.  Nothing is converted at run time: a stored
payload is the JSON object it was written as (upcast by :func:`batchgrader.core.schema.upcast`
when its version is older), and appending checks it against the catalogue
(:func:`batchgrader.core.schema.check_payload`), so a required field is always there.
"""

# no `from __future__ import annotations` here: TypedDict must see NotRequired itself (Python 3.11)
from typing import Any, NotRequired, TypedDict

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


# --- intake ----------------------------------------------------------------------------------------


class FileRejected(TypedDict):
    file: str
    path: str
    reason: str
    code: str
    fingerprint: str | None


class JobAccepted(TypedDict):
    file: str
    source: str
    profile: str
    sha256: str
    bytes: int
    input_path: str
    result_name: str
    sandbox: bool
    provider: NotRequired[str | None]
    provider_id: NotRequired[str | None]


class JobPrepared(TypedDict):
    format: str | None
    model: str | None
    encoding: str
    rows: int
    requests: int
    input_tokens: int
    max_request_tokens: int
    chunks: list[PlannedChunk]
    row_errors: list[RowError]
    estimate_usd: dict[str, float] | None
    warnings: list[str]
    requests_path: str | None
    settings: NotRequired[dict[str, Any] | None]


class JobHeld(TypedDict):
    code: str
    reason: str


class JobReleased(TypedDict):
    reason: str
    override: bool


# --- per chunk: upload, create, poll ---------------------------------------------------------------


class UploadStarted(TypedDict):
    chunk: int
    attempt: int
    filename: str | None
    bytes: int


class FileUploaded(TypedDict):
    chunk: int
    attempt: int
    file_id: str
    reconciled: bool


class UploadFailed(TypedDict):
    chunk: int
    attempt: int
    error: str | None
    definite: bool


class BatchCreateRequested(TypedDict):
    chunk: int
    attempt: int
    input_file_id: str
    metadata: dict[str, str]


class BatchCreated(TypedDict):
    chunk: int
    attempt: int
    batch_id: str
    status: str | None
    reconciled: bool


class BatchCreateFailed(TypedDict):
    chunk: int
    attempt: int
    error: str | None
    definite: bool


class BatchStatusChanged(TypedDict):
    chunk: int
    batch_id: str | None
    status: str
    request_counts: dict[str, int] | None
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict[str, Any]] | None


class JobRecovered(TypedDict):
    since: float | None
    reason: str


class RecoveredBatchesAdopted(TypedDict):
    adopted: dict[str, str]
    ignored: list[Any]


class DuplicateBatchesChecked(TypedDict):
    chunk: int
    attempt: int | None
    batch_id: str | None
    extras: list[Any]
    cancelled: list[Any]


# --- per chunk: collect ----------------------------------------------------------------------------


class OutputDownloadStarted(TypedDict):
    chunk: int
    batch_id: str | None
    file_id: str
    kind: str


class OutputDownloaded(TypedDict):
    chunk: int
    batch_id: str | None
    file_id: str
    kind: str
    path: str | None
    bytes: int


class OutputDownloadFailed(TypedDict):
    chunk: int
    batch_id: str | None
    file_id: str
    kind: str
    error: str | None
    attempts: int


class OutputFileMalformed(TypedDict):
    chunk: int
    batch_id: str | None
    kinds: list[str]
    lines: int
    problem: str


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


class SchemaOverheadLearned(TypedDict):
    model: str
    schema_sha256: str
    chunk: int
    requests: int
    counted_tokens: int
    billed_prompt_tokens: int
    per_request: float
    provider: NotRequired[str | None]


class RowsFailed(TypedDict):
    chunk: int | None
    batch_id: str | None
    rows: list[FailedRow]


class ChunkCompleted(TypedDict):
    chunk: int
    batch_id: str | None
    status: str | None
    succeeded: int
    failed: int
    results_path: str | None


class ChunkFailed(TypedDict):
    chunk: int
    batch_id: str | None
    code: str | None
    error: str | None
    retryable: bool


class RetryPlanned(TypedDict):
    chunk: int
    source_chunks: list[int]
    custom_ids: list[str]
    requests: int
    input_tokens: int
    bytes: int
    path: str
    manual: bool


class QueueLimitLearned(TypedDict):
    base_url: str | None
    model: str | None
    limit: int | None
    exact: bool
    source: str | None
    chunk: int | None
    message: str | None


class ChunkReplanned(TypedDict):
    chunk: int
    limit: int
    chunks: list[RowsChunk]
    oversized: list[dict[str, Any]]


class UploadAheadPlanned(TypedDict):
    chunk: int
    attempt: int
    limit: int | None
    enqueued: int


# --- the end of a job -------------------------------------------------------------------------------


class OutboxWriteStarted(TypedDict):
    path: str | None
    error_path: str | None


class ResultWritten(TypedDict):
    path: str | None
    rows: int
    succeeded: int
    failed: int
    error_path: str | None


class InputArchived(TypedDict):
    path: str | None


class ProviderFilesDeleted(TypedDict):
    file_ids: list[str]


class JobCompleted(TypedDict):
    state: str
    succeeded: int
    failed: int


class JobFailed(TypedDict):
    code: str | None
    error: str | None
    stage: str | None
    hint: str | None


class JobEndHookStarted(TypedDict):
    end_seq: int | None
    timeout_seconds: float


class JobLeftAlone(TypedDict):
    code: str
    reason: str


class JobTakenUp(TypedDict):
    sandbox: bool


# --- control ----------------------------------------------------------------------------------------


class CancelRequested(TypedDict):
    reason: str


class JobCancelled(TypedDict):
    succeeded: int
    failed: int


class PreflightRequested(TypedDict):
    rows: list[str]
    attempt: int


class PreflightPassed(TypedDict):
    answers: list[dict[str, Any]]
    cost_usd: float


class PreflightFailed(TypedDict):
    custom_id: str
    row_code: str
    error: str
    hint: str


class PreflightUnreachable(TypedDict):
    error: str
    retry_at: float


# --- the synchronous routes (route: flex | online | auto) ---------------------------------------
class RouteChosen(TypedDict):
    route: str
    reason: str
    rows: int


class OnlineRequestSent(TypedDict):
    custom_id: str
    attempt: int
    tier: str
    resent_after_crash: bool


class OnlineRequestAnswered(TypedDict):
    custom_id: str
    key: str
    content: str
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    tier: str
    cost_usd: float


class OnlineRequestFailed(TypedDict):
    custom_id: str
    code: str
    error: str
    status_code: int | None
    retry_at: float | None
    final: bool


class OnlineRowsDone(TypedDict):
    answered: int
    to_batch: int
    resent_after_crash: int
    cost_usd: float


class RetryRequested(TypedDict):
    reason: str
    max_completion_tokens: NotRequired[int]


class InputRestored(TypedDict):
    path: str


# --- reusing answers ---------------------------------------------------------------------------------


class FreshAnswersRequested(TypedDict):
    reason: str


class RequestsReused(TypedDict):
    cached_rows: int
    duplicate_rows: int
    saved_usd: float | None
    usage: dict[str, int]
    path: str | None


class DuplicatesAnswered(TypedDict):
    chunk: int
    rows: int
    succeeded: int
    saved_usd: float | None


class AnswersToStore(TypedDict):
    chunk: int
    rows: int
    answers: int


class AnswersStored(TypedDict):
    chunk: int
    error: str | None


class InputTokensCounted(TypedDict):
    exact: bool
    source: str
    input_tokens: int
    reason: str | None


class OutboxWriteFailed(TypedDict):
    path: str
    error: str
    code: str


#: event type -> its payload's TypedDict (every type of the catalogue)
PAYLOADS: dict[str, type] = {
    t.__name__: t
    for t in (
        FileRejected,
        JobAccepted,
        JobPrepared,
        JobHeld,
        JobReleased,
        PreflightRequested,
        PreflightPassed,
        PreflightFailed,
        PreflightUnreachable,
        UploadStarted,
        FileUploaded,
        UploadFailed,
        BatchCreateRequested,
        BatchCreated,
        BatchCreateFailed,
        BatchStatusChanged,
        JobRecovered,
        RecoveredBatchesAdopted,
        OutputDownloadFailed,
        OutputFileMalformed,
        DuplicateBatchesChecked,
        OutputDownloadStarted,
        OutputDownloaded,
        TokensUsed,
        SchemaOverheadLearned,
        RowsFailed,
        ChunkCompleted,
        ChunkFailed,
        RetryPlanned,
        OutboxWriteStarted,
        ResultWritten,
        InputArchived,
        ProviderFilesDeleted,
        JobCompleted,
        JobFailed,
        CancelRequested,
        JobCancelled,
        RetryRequested,
        InputRestored,
        QueueLimitLearned,
        ChunkReplanned,
        UploadAheadPlanned,
        JobEndHookStarted,
        JobLeftAlone,
        JobTakenUp,
        FreshAnswersRequested,
        RequestsReused,
        DuplicatesAnswered,
        AnswersToStore,
        AnswersStored,
        InputTokensCounted,
        OutboxWriteFailed,
        RouteChosen,
        OnlineRequestSent,
        OnlineRequestAnswered,
        OnlineRequestFailed,
        OnlineRowsDone,
    )
}

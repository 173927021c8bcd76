"""The event catalogue, declared once: each event type is a ``TypedDict`` of its payload,
decorated with :func:`event` (its version, the step that emits it, what each field means and,
for an intent, the outcomes that close it).  The name is the class's name; a field the payload
may leave out is ``NotRequired``.

Everything else is derived from these declarations: :data:`batchgrader.core.schema.EVENTS`
(name -> version and fields, what appending checks), :data:`PAYLOADS` (name -> payload type),
the fold's handlers (:func:`batchgrader.core.state.folds` ties each to its payload type) and the
field tables of ``docs/events.md`` (:mod:`batchgrader.core.eventdocs`).  Nothing is converted at
run time: a stored payload is the JSON object it was written as (upcast by
:func:`batchgrader.core.schema.upcast` when its version is older), and appending checks it
against the catalogue (:func:`batchgrader.core.schema.check_payload`), so a required field is
always there and the fold reads ``p["field"]`` with a type the checker knows.
"""

# no `from __future__ import annotations` here: TypedDict must see NotRequired itself (Python 3.11)
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, TypeVar


@dataclass(frozen=True)
class EventDeclaration:
    """One event type: its name, version, emitting step, payload type and field meanings."""

    name: str
    version: int
    step: str
    payload: type
    meanings: Mapping[str, str]  # field -> what it means, in the payload's field order
    intent_for: str | None = None  # for an intent: the outcome event(s) that close it, "A|B"

    @property
    def optional(self) -> frozenset[str]:
        return frozenset(getattr(self.payload, "__optional_keys__", ()))


#: event name -> its declaration, in the order of this module
DECLARATIONS: dict[str, EventDeclaration] = {}

_T = TypeVar("_T", bound=type)


def event(version: int, step: str, meanings: Mapping[str, str], intent_for: str | None = None) -> Callable[[_T], _T]:
    """Declare the decorated payload ``TypedDict`` as the event type of the same name."""

    def declare(payload: _T) -> _T:
        fields = list(payload.__annotations__)
        if list(meanings) != fields:
            raise TypeError(f"{payload.__name__}: the meanings name {list(meanings)}, the payload declares {fields}")
        if payload.__name__ in DECLARATIONS:
            raise TypeError(f"event {payload.__name__!r} is declared twice")
        DECLARATIONS[payload.__name__] = EventDeclaration(payload.__name__, version, step, payload, dict(meanings), intent_for)
        return payload

    return declare


def declaration_of(payload: type) -> EventDeclaration:
    """The declaration of the event whose payload type is ``payload``."""
    declared = DECLARATIONS.get(payload.__name__)
    if declared is None or declared.payload is not payload:
        raise KeyError(f"{payload.__name__} is not a declared event payload")
    return declared


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


@event(
    1,
    "inbox",
    {
        "file": "original file name",
        "path": "where the file was found (left in place when it is not a regular file)",
        "reason": "human-readable reason",
        "code": "machine code (not_regular_file, unsupported_format, ...)",
        "fingerprint": "inode/size/mtime key so the same file is not reported twice",
    },
)
class FileRejected(TypedDict):
    file: str
    path: str
    reason: str
    code: str
    fingerprint: str | None


@event(
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
        "provider": "the profile's provider when the job was accepted (openai, azure, anthropic, gemini): the job's batches go there, whatever the profile says later",
        "provider_id": "who answers the job: the endpoint identity of `pipeline/answerkey.provider_id_of` (`sandbox` or `sandbox:<provider>` in the sandbox); its answers are stored under it",
    },
)
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


@event(
    1,
    "prepare",
    {
        "format": "csv/json/jsonl/xlsx/parquet",
        "model": "model",
        "encoding": "tiktoken encoding",
        "rows": "data rows",
        "requests": "requests in chunks",
        "input_tokens": "exact prompt tokens of those requests",
        "max_request_tokens": "largest single request (of the rows counted: a row answered from the stored answers is not token-counted)",
        "chunks": "list of {index, start, end, requests, input_tokens, bytes, path}",
        "row_errors": "rows that cannot be sent: list of {row, custom_id, code, message}",
        "estimate_usd": "{input, max_output, max_total} or null",
        "warnings": "list of strings",
        "requests_path": "JSONL of every row's request, kept for retries",
        "settings": "the profile settings the result file is written with (output_column, response_format, id_column, csv_formula_guard, sheet, encoding), and those `bgctl report` reads it by (reference_column, reference_field, group_column; present only when set), fixed at preparation",
    },
)
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


@event(1, "budget", {"code": "budget key that holds it", "reason": "human-readable reason and what to do"})
class JobHeld(TypedDict):
    code: str
    reason: str


@event(
    1, "budget / bgctl retry", {"reason": "why it may go on", "override": "true when the user chose to submit despite the budget"}
)
class JobReleased(TypedDict):
    reason: str
    override: bool


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


# --- the end of a job -------------------------------------------------------------------------------


@event(1, "outbox (intent)", {"path": "final result path", "error_path": "error report path or null"}, intent_for="ResultWritten")
class OutboxWriteStarted(TypedDict):
    path: str | None
    error_path: str | None


@event(
    1,
    "outbox (outcome)",
    {
        "path": "result file",
        "rows": "rows written",
        "succeeded": "rows with an answer",
        "failed": "rows with an error",
        "error_path": "error report or null",
    },
)
class ResultWritten(TypedDict):
    path: str | None
    rows: int
    succeeded: int
    failed: int
    error_path: str | None


@event(1, "outbox", {"path": "where the original input now lives (archive/ or failed/)"})
class InputArchived(TypedDict):
    path: str | None


@event(1, "cleanup", {"file_ids": "provider files deleted"})
class ProviderFilesDeleted(TypedDict):
    file_ids: list[str]


@event(1, "finish", {"state": "completed or completed_with_errors", "succeeded": "rows", "failed": "rows"})
class JobCompleted(TypedDict):
    state: str
    succeeded: int
    failed: int


@event(1, "any", {"code": "machine code", "error": "specific message", "stage": "step that failed", "hint": "what to do"})
class JobFailed(TypedDict):
    code: str | None
    error: str | None
    stage: str | None
    hint: str | None


@event(
    1,
    "job end",
    {
        "end_seq": "job_seq of the job's last event when it ended (one run per end)",
        "timeout_seconds": "time limit of the command",
    },
)
class JobEndHookStarted(TypedDict):
    end_seq: int | None
    timeout_seconds: float


@event(
    1,
    "engine",
    {
        "code": "sandbox_job (a sandbox job met by a normal daemon), real_job (a real job met by a sandbox daemon) or endpoint_changed (the job's provider endpoint is not this daemon's)",
        "reason": "human-readable reason and how to finish the job",
    },
)
class JobLeftAlone(TypedDict):
    code: str
    reason: str


@event(1, "engine", {"sandbox": "the mode of the daemon that took the job up again after JobLeftAlone"})
class JobTakenUp(TypedDict):
    sandbox: bool


# --- control ----------------------------------------------------------------------------------------


@event(1, "bgctl cancel", {"reason": "why"})
class CancelRequested(TypedDict):
    reason: str


@event(1, "cancel", {"succeeded": "rows answered before the cancel", "failed": "rows without an answer"})
class JobCancelled(TypedDict):
    succeeded: int
    failed: int


@event(
    1,
    "preflight (intent)",
    {
        "rows": "custom_ids of the rows sent (the first `preflight_rows` rows)",
        "attempt": "1 for the first try; one more for each try after the provider could not be reached or a crash",
    },
    intent_for="PreflightPassed|PreflightFailed|PreflightUnreachable",
)
class PreflightRequested(TypedDict):
    rows: list[str]
    attempt: int


@event(
    1,
    "preflight",
    {
        "answers": "per row: {custom_id, key, content, finish_reason, prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens}; these rows are answered and not sent in a batch",
        "cost_usd": "what the rows cost at the standard (not batch) price (also in the TokensUsed with chunk -1 beside it)",
    },
)
class PreflightPassed(TypedDict):
    answers: list[dict[str, Any]]
    cost_usd: float


@event(
    1,
    "preflight",
    {
        "custom_id": "the row that failed",
        "row_code": "its code: the provider's HTTP error code, or truncated, refused, invalid_output, unexpected_finish",
        "error": "the provider's own message",
        "hint": "the fix",
    },
)
class PreflightFailed(TypedDict):
    custom_id: str
    row_code: str
    error: str
    hint: str


@event(
    1,
    "preflight",
    {
        "error": "why the provider could not be reached (or asked to wait)",
        "retry_at": "when the preflight is sent again (epoch seconds; backoff doubling from 5 s to 5 min)",
    },
)
class PreflightUnreachable(TypedDict):
    error: str
    retry_at: float


@event(
    1,
    "bgctl retry",
    {"reason": "why", "max_completion_tokens": "the output bound of the rows sent again (`bgctl retry --max-completion-tokens`)"},
)
class RetryRequested(TypedDict):
    reason: str
    max_completion_tokens: NotRequired[int]


@event(1, "retry", {"path": "the input moved back from archive/ or failed/ into the work area"})
class InputRestored(TypedDict):
    path: str


# --- reusing answers ---------------------------------------------------------------------------------


@event(
    1,
    "inbox (bgctl submit --fresh)",
    {"reason": "why: every row of this job is sent, no stored answer is reused and no duplicate is merged"},
)
class FreshAnswersRequested(TypedDict):
    reason: str


@event(
    1,
    "prepare",
    {
        "cached_rows": "rows answered from the answers store (not sent)",
        "duplicate_rows": "rows whose request repeats an earlier row's in the file (sent once, answer copied at merge)",
        "saved_usd": "what the cached rows' answers cost when first answered, at today's prices",
        "usage": "`{prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens}` of the cached answers, as first billed",
        "path": "the decision, per row: `results/reused.jsonl` (each cached row's answer, each duplicate's leader)",
    },
)
class RequestsReused(TypedDict):
    cached_rows: int
    duplicate_rows: int
    saved_usd: float | None
    usage: dict[str, int]
    path: str | None


@event(
    1,
    "merge",
    {
        "chunk": "chunk index whose rows led the duplicates",
        "rows": "duplicate rows given their leader's outcome",
        "succeeded": "of which answered",
        "saved_usd": "what sending them would have cost (their leaders' billed usage)",
    },
)
class DuplicatesAnswered(TypedDict):
    chunk: int
    rows: int
    succeeded: int
    saved_usd: float | None


@event(
    1,
    "merge",
    {
        "chunk": "the merged chunk (appended with its ChunkCompleted) whose successful answers go into the answer store",
        "rows": "result records of the chunk's sent rows to read (the first lines of its results file)",
        "answers": "successful answers among them",
    },
)
class AnswersToStore(TypedDict):
    chunk: int
    rows: int
    answers: int


@event(
    1,
    "merge",
    {
        "chunk": "the chunk whose answers were stored (in the same transaction as the answers)",
        "error": "null, or why none were stored (its results file could not be read); the job goes on",
    },
)
class AnswersStored(TypedDict):
    chunk: int
    error: str | None


@event(
    1,
    "prepare",
    {
        "exact": "true: the provider's counting endpoint counted every request sent; false: tiktoken estimates",
        "source": "who counted: `<provider> counting endpoint` or `estimate`",
        "input_tokens": "the planned chunks' input tokens (as in `JobPrepared`)",
        "reason": "why the counts are estimates (null when exact): no key, the endpoint's refusal, or more uncached requests than the daemon counts itself (2,000; the text then says to run `bgctl count` first)",
    },
)
class InputTokensCounted(TypedDict):
    exact: bool
    source: str
    input_tokens: int
    reason: str | None


@event(
    1,
    "outbox",
    {
        "path": "the file that could not be written (result or error report), or its folder",
        "error": "what the user sees as the job's last error, e.g. `cannot write the outbox: permission denied: PATH`",
        "code": "the cause in one word: `permission_denied`, `no_space`, `read_only`, `not_found` or `os_error`",
    },
)
class OutboxWriteFailed(TypedDict):
    path: str
    error: str
    code: str


#: event type -> its payload's TypedDict (every type of the catalogue)
PAYLOADS: dict[str, type] = {name: d.payload for name, d in DECLARATIONS.items()}

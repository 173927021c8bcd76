"""The event catalogue, declared once: each event type is a ``TypedDict`` of its payload,
decorated with :func:`event` (its version, the step that emits it, what each field means and,
for an intent, the outcomes that close it).  The name is the class's name; a field the payload
may leave out is ``NotRequired``.

The chunks' events are declared in :mod:`batchgrader.core.log.payloads_chunks` and imported here, so
``payloads.X`` names every payload type; :mod:`batchgrader.core.log.eventdecl` records each declaration.
Everything else is derived from these declarations: :data:`batchgrader.core.log.schema.EVENTS`
(name -> version and fields, what appending checks), :data:`PAYLOADS` (name -> payload type),
the fold's handlers (:func:`batchgrader.core.log.state.folds` ties each to its payload type) and the
field tables of ``docs/events.md`` (:mod:`batchgrader.core.log.eventdocs`).  Nothing is converted at
run time: a stored payload is the JSON object it was written as (upcast by
:func:`batchgrader.core.log.schema.upcast` when its version is older), and appending checks it
against the catalogue (:func:`batchgrader.core.log.schema.check_payload`), so a required field is
always there and the fold reads ``p["field"]`` with a type the checker knows.
"""

# no `from __future__ import annotations` here: TypedDict must see NotRequired itself (Python 3.11)
from typing import Any, NotRequired, TypedDict

from batchgrader.core.log.eventdecl import DECLARATIONS as DECLARATIONS
from batchgrader.core.log.eventdecl import EventDeclaration as EventDeclaration
from batchgrader.core.log.eventdecl import declaration_of as declaration_of
from batchgrader.core.log.eventdecl import event as event
from batchgrader.core.log.payloads_chunks import BatchCancelRequested as BatchCancelRequested
from batchgrader.core.log.payloads_chunks import BatchCreated as BatchCreated
from batchgrader.core.log.payloads_chunks import BatchCreateFailed as BatchCreateFailed
from batchgrader.core.log.payloads_chunks import BatchCreateRequested as BatchCreateRequested
from batchgrader.core.log.payloads_chunks import BatchStatusChanged as BatchStatusChanged
from batchgrader.core.log.payloads_chunks import ChunkCompleted as ChunkCompleted
from batchgrader.core.log.payloads_chunks import ChunkFailed as ChunkFailed
from batchgrader.core.log.payloads_chunks import ChunkReplanned as ChunkReplanned
from batchgrader.core.log.payloads_chunks import ChunkRouted as ChunkRouted
from batchgrader.core.log.payloads_chunks import DuplicateBatchesChecked as DuplicateBatchesChecked
from batchgrader.core.log.payloads_chunks import FailedRow as FailedRow
from batchgrader.core.log.payloads_chunks import FileUploaded as FileUploaded
from batchgrader.core.log.payloads_chunks import JobRecovered as JobRecovered
from batchgrader.core.log.payloads_chunks import OutputDownloaded as OutputDownloaded
from batchgrader.core.log.payloads_chunks import OutputDownloadFailed as OutputDownloadFailed
from batchgrader.core.log.payloads_chunks import OutputDownloadStarted as OutputDownloadStarted
from batchgrader.core.log.payloads_chunks import OutputFileMalformed as OutputFileMalformed
from batchgrader.core.log.payloads_chunks import PlannedChunk as PlannedChunk
from batchgrader.core.log.payloads_chunks import QueueLimitLearned as QueueLimitLearned
from batchgrader.core.log.payloads_chunks import RecoveredBatchesAdopted as RecoveredBatchesAdopted
from batchgrader.core.log.payloads_chunks import RetryPlanned as RetryPlanned
from batchgrader.core.log.payloads_chunks import RowError as RowError
from batchgrader.core.log.payloads_chunks import RowsChunk as RowsChunk
from batchgrader.core.log.payloads_chunks import RowsFailed as RowsFailed
from batchgrader.core.log.payloads_chunks import SchemaOverheadLearned as SchemaOverheadLearned
from batchgrader.core.log.payloads_chunks import StragglerCancelRequested as StragglerCancelRequested
from batchgrader.core.log.payloads_chunks import TokensUsed as TokensUsed
from batchgrader.core.log.payloads_chunks import UploadAheadPlanned as UploadAheadPlanned
from batchgrader.core.log.payloads_chunks import UploadFailed as UploadFailed
from batchgrader.core.log.payloads_chunks import UploadStarted as UploadStarted

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
        "panel_of": "a judge of a panel (the `judges` key): the panel job it answers for; its result goes to that job's work folder and its input (the panel's) is not archived",
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
    panel_of: NotRequired[str]


@event(
    1,
    "panel",
    {
        "judges": "list of {profile, job_id}: each judge's profile and the job that answers for it (ids derived from the panel's own id and the judge's place, so a restart accepts none twice)",
        "settings": "the panel profile's result settings (as `JobPrepared.settings`: output_column, csv_formula_guard, sheet, encoding, and reference_column, reference_field, group_column when set), fixed when the panel starts: its result is written and reported by them",
    },
)
class PanelStarted(TypedDict):
    judges: list[dict[str, str]]
    settings: dict[str, Any]


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
        "deadline_at": "when the job is due (epoch seconds), from the profile's `deadline` fixed at preparation; absent: no deadline",
        "empty_rows": "rows whose `response_field` is empty or only spaces (sent and billed, or under `skip_empty` failed with empty_input among `row_errors`); absent: none, or a job prepared before it was recorded",
        "text_encoding": "the text encoding the input was read in (utf-8 whenever the file is valid UTF-8; the `encoding` key only for a file that is not); absent: Excel or Parquet, or a job prepared before it was recorded",
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
    deadline_at: NotRequired[float]
    empty_rows: NotRequired[int]
    text_encoding: NotRequired[str]


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


@event(
    1,
    "delete (intent)",
    {
        "file_id": "the provider file whose delete is asked",
        "reason": "finished (the job's files at its end) or refused (a chunk's file no batch uses, before its rows are sent again or given up)",
    },
)
class ProviderFileDeleteRequested(TypedDict):
    file_id: str
    reason: str


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
    "prepare",
    {
        "code": "why the job cannot be prepared (nothing was sent; the rules end it, core/rules/ending.py): unknown_profile, missing_pricing, bad_input, bad_config, empty_input",
        "error": "specific message",
        "hint": "what to do",
    },
)
class PrepareFailed(TypedDict):
    code: str
    error: str
    hint: str


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
        "rows": "the custom_id of the row sent (one intent per request; in older logs every row of the try, the first `preflight_rows` rows)",
        "attempt": "1 for the first try; one more for each try after the provider could not be reached or a crash",
    },
    intent_for="PreflightRowAnswered|PreflightPassed|PreflightFailed|PreflightUnreachable",
)
class PreflightRequested(TypedDict):
    rows: list[str]
    attempt: int


@event(
    1,
    "preflight",
    {
        "answers": "per row: {custom_id, key, content, finish_reason, prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens}; these rows are answered and not sent in a batch",
        "cost_usd": "what the rows cost at the standard (not batch) price (each row's also in the TokensUsed beside its PreflightRowAnswered; in older logs in one TokensUsed with chunk -1 beside this event)",
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
        "row_code": "its code: the provider's HTTP error code, or truncated, refused, invalid_output, unexpected_finish, malformed_result, request_not_sent (the client would not send it), unreachable or rate_limited (every try met a transient error)",
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
        "retry_at": "when the preflight is sent again (epoch seconds; the provider's Retry-After when it gave one, else a backoff doubling from 5 s to 5 min)",
    },
)
class PreflightUnreachable(TypedDict):
    error: str
    retry_at: float


@event(
    1,
    "preflight",
    {
        "custom_id": "the row answered",
        "key": "its request key (the answers store's key)",
        "content": "the answer",
        "finish_reason": "the provider's finish reason",
        "prompt_tokens": "billed input tokens",
        "cached_tokens": "of which read from the prompt cache",
        "completion_tokens": "billed output tokens",
        "reasoning_tokens": "of which reasoning",
        "cost_usd": "its cost at the standard (not batch) price (also in the TokensUsed with chunk -1 beside it)",
    },
)
class PreflightRowAnswered(TypedDict):
    custom_id: str
    key: str
    content: str
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost_usd: float


# --- the synchronous routes (route: flex | online | auto) ---------------------------------------


@event(
    1,
    "route",
    {
        "route": "batch, flex or online: how the job's rows travel",
        "reason": "why (the profile's route, or what route: auto weighed)",
        "rows": "rows of the file (the requests the synchronous route sends)",
        "estimate_usd": "flex or online: the rows' estimated cost at that route's price ({input, max_output, max_total}, as JobPrepared's), weighed against the budget before a request leaves; absent: batch, or no price",
    },
)
class RouteChosen(TypedDict):
    route: str
    reason: str
    rows: int
    estimate_usd: NotRequired[dict[str, float]]


@event(
    1,
    "route (intent)",
    {
        "custom_id": "the row sent",
        "attempt": "1 for the first try, one more for each try after a 429, a 5xx or a crash",
        "tier": "flex or online",
        "resent_after_crash": "true when an earlier request of the row had no outcome (a crash): sent again once",
    },
    intent_for="OnlineRequestAnswered|OnlineRequestFailed",
)
class OnlineRequestSent(TypedDict):
    custom_id: str
    attempt: int
    tier: str
    resent_after_crash: bool


@event(
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
        "error_code": "truncated or refused: an answer that is billed but not usable (the row fails with it, a RowsFailed of chunk null beside it, and it is not sent again unless `bgctl retry`); absent: a usable answer",
        "error_message": "why the answer is not usable; absent with error_code",
    },
)
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
    error_code: NotRequired[str]
    error_message: NotRequired[str]


@event(
    1,
    "route",
    {
        "custom_id": "the row",
        "code": "rate_limited, server_error, outcome_unknown, or the provider's error code (http_<status> when it has none)",
        "error": "the provider's message",
        "status_code": "the HTTP status (null: no answer)",
        "retry_at": "when it may be sent again (epoch seconds; the provider's Retry-After when it gave one); null when final",
        "final": "true: not sent on this route again: attempts used up (the row goes in the job's batch), or refused for good (a 4xx other than 408/429: the row fails, RowsFailed beside it)",
    },
)
class OnlineRequestFailed(TypedDict):
    custom_id: str
    code: str
    error: str
    status_code: int | None
    retry_at: float | None
    final: bool


@event(
    1,
    "route",
    {
        "answered": "rows answered on the route",
        "to_batch": "rows whose requests failed for good: they go in the job's batch (not those refused for good: they fail)",
        "resent_after_crash": "requests sent again because a crash left them without an outcome",
        "cost_usd": "what the answered rows cost",
    },
)
class OnlineRowsDone(TypedDict):
    answered: int
    to_batch: int
    resent_after_crash: int
    cost_usd: float


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
        "copied_rows": "of the cached rows, those given an answer this job paid for itself (its preflight's, its synchronous route's) to an identical row: duplicates, not stored answers",
    },
)
class RequestsReused(TypedDict):
    cached_rows: int
    duplicate_rows: int
    saved_usd: float | None
    usage: dict[str, int]
    path: str | None
    copied_rows: NotRequired[int]


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


# --- scheduled runs (schedule / schedule_source) -------------------------------------------------------


@event(
    1,
    "schedule",
    {
        "schedule": "the profile whose `schedule` started the run, or `eval:<name>`: an imported eval's (`bgctl evals import --schedule`)",
        "cron": "its cron expression then (UTC)",
        "scheduled_for": "the fire time run (epoch seconds, UTC): each time is run once, by one daemon (the job id is derived from it)",
        "source": "this job's input: a file of `schedule_source` (copied; the source stays for the next time); for an eval, a request file of its run's folder",
        "files": "every file of the run at this time (a folder's files are one job each): after a restart, those with no job yet are started",
        "missed": "earlier fire times that passed while no daemon ran, coalesced into this run (epoch seconds)",
    },
)
class ScheduledRunStarted(TypedDict):
    schedule: str
    cron: str
    scheduled_for: float
    source: str
    files: list[str]
    missed: list[float]


#: event type -> its payload's TypedDict (every type of the catalogue)
PAYLOADS: dict[str, type] = {name: d.payload for name, d in DECLARATIONS.items()}

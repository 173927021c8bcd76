"""The records of the folded state: a job (:class:`JobState`) and its chunks (:class:`ChunkState`),
and the states they can be in.  :mod:`batchgrader.core.log.state` builds them from the events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchgrader.core.log.route_state import RouteState, refused_rows

IN_FLIGHT = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL_BATCH = ("completed", "failed", "expired", "cancelled")
TERMINAL_JOB = ("completed", "completed_with_errors", "failed", "cancelled")
JOB_STATES = ("queued", "preparing", "submitting", "running", "downloading", "held", *TERMINAL_JOB)


@dataclass
class ChunkState:
    index: int
    requests: int
    input_tokens: int
    bytes: int
    path: str
    custom_ids: list[str] | None = None  # rows of a retry chunk (None: a planned range of the file)
    start: int = 0
    end: int = 0
    attempt: int = 0
    # upload step
    upload: str = "none"  # none | started | done | failed
    filename: str | None = None
    file_id: str | None = None
    # create step
    create: str = "none"  # none | requested | done | failed
    metadata: dict[str, str] = field(default_factory=dict)
    requested_ts: str | None = None
    batch_id: str | None = None
    status: str | None = None
    request_counts: dict[str, int] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    # the batch's state was read from the provider (BatchStatusChanged) since its BatchCreated: a
    # create reply that already names a terminal status is read back before the batch is collected
    read_back: bool = False
    batch_errors: list[dict[str, Any]] = field(default_factory=list)
    downloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> {state, file_id, path}
    # end
    done: bool = False
    failure: dict[str, Any] | None = None  # {code, error, retryable, ts}
    succeeded: int = 0
    failed: int = 0
    results_path: str | None = None
    last_error: str | None = None
    # issue 10: a create of this attempt was declared failed before (a late create may still land),
    # and the ts of the BatchCreated after it, until DuplicateBatchesChecked
    create_retried: bool = False
    dup_check_due: str | None = None
    malformed_downloads: int = 0  # OutputFileMalformed seen for the current batch
    refusals: int = 0  # batches of this chunk refused for the queue limit (ChunkFailed retryable), every attempt
    ahead: bool = False  # this attempt's file is uploaded ahead of queue room (UploadAheadPlanned), no create asked yet
    answers_due: int | None = None  # merged, its answers not stored yet (AnswersToStore): result records to read
    straggler: bool = False  # cancelled as its job's deadline neared (StragglerCancelRequested)
    cancels_asked: int = 0  # cancels asked of the provider for this chunk's batches (BatchCancelRequested)
    route: str | None = None  # flex | online: a straggler's rows, sent through the synchronous route

    @property
    def staged(self) -> bool:
        """Uploaded (or being uploaded) ahead of queue room, no create asked yet: not in the queue."""
        return self.ahead and self.create == "none" and not self.done

    @property
    def in_flight(self) -> bool:
        """At the provider and not seen ended: running, or named ended only by its create reply
        (read back by a poll before it is collected)."""
        if self.create != "done" or self.done:
            return False
        return self.status in IN_FLIGHT or (self.status in TERMINAL_BATCH and not self.read_back)

    @property
    def open_intent(self) -> str | None:
        if self.upload == "started":
            return "upload"
        if self.create == "requested":
            return "create"
        return None


@dataclass
class JobState:
    job_id: str
    version: int = 0  # job_seq of the last event folded (for optimistic concurrency)
    file: str = ""
    source: str = ""
    profile: str = "default"
    sha256: str = ""
    bytes: int = 0
    input_path: str = ""
    result_name: str = ""
    sandbox: bool = False
    # fixed when accepted (JobAccepted; None in older logs): the provider the job's batches go to,
    # and who answers it (pipeline/answerkey.provider_id_of), whatever the profile says later
    provider: str | None = None
    provider_id: str | None = None
    # a judge panel (the judges key): PanelStarted's [{profile, job_id}] on the panel job; JobAccepted.panel_of on a judge's
    panel: list[dict[str, str]] | None = None
    panel_of: str | None = None
    result_counts: tuple[int, int] | None = None  # ResultWritten's (succeeded, failed)
    left_alone: str | None = None  # JobLeftAlone: why the running daemon does not touch this job
    created_ts: str = ""
    updated_ts: str = ""
    # preparation
    prepared: bool = False
    format: str | None = None
    text_encoding: str | None = None  # the encoding a text input was read in (JobPrepared.text_encoding)
    empty_rows: int = 0  # rows whose response_field is empty (JobPrepared.empty_rows)
    model: str | None = None
    rows: int = 0
    requests: int = 0
    estimate: dict[str, float] | None = None
    requests_path: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    chunks: dict[int, ChunkState] = field(default_factory=dict)
    # rows
    row_errors: dict[str, dict[str, Any]] = field(default_factory=dict)  # permanent (never sendable)
    failed_rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # failed, not being retried
    row_attempts: dict[str, int] = field(default_factory=dict)  # retries used per custom_id
    # usage
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    cache_write_tokens: int = 0  # of prompt_tokens: prompt-cache writes
    cache_saved_usd: float = 0.0  # what prompt caching saved (TokensUsed.cache_saved_usd)
    # control
    held: dict[str, str] | None = None
    override_budget: bool = False
    cancel_requested: bool = False
    retry_requested: bool = False
    retry_bound: int | None = None  # `bgctl retry --max-completion-tokens`: the bound of rows sent again
    # the preflight: None (not run), requested (intent open), unreachable (retry at preflight_retry_at),
    # passed (its answers in preflight_answers) or failed
    preflight: str | None = None
    preflight_attempts: int = 0
    preflight_retry_at: float | None = None
    preflight_error: str | None = None
    preflight_answers: list[dict[str, Any]] = field(default_factory=list)
    preflight_open: set[str] = field(default_factory=set)  # rows whose request left with no outcome yet (a crash: uncertain)
    preflight_resent: set[str] = field(default_factory=set)  # rows sent again after a crash left them open (once each)
    online: RouteState = field(default_factory=RouteState)  # the synchronous routes (core/log/route_state.py)
    deadline_at: float | None = None  # when the job is due (JobPrepared.deadline_at; core/rules/stragglers.py)
    reopened_from: str | None = None  # how the job had ended before `bgctl retry` reopened it
    retry_seq: int | None = None  # the log position of its last RetryRequested (a panel passes a retry on once)
    outbox: str = "none"  # none | started | done
    result_path: str | None = None
    error_path: str | None = None
    archived_path: str | None = None
    provider_files_deleted: bool = False
    deletes_asked: int = 0  # provider file deletes asked (ProviderFileDeleteRequested), every reason
    ended: str | None = None  # completed | completed_with_errors | failed | cancelled
    corrupt: str | None = None  # why this job's log cannot be read (the job is set aside; others run)
    recovered_since: float | None = None  # re-accepted from its work folder: search the provider first
    error: dict[str, Any] | None = None  # {code, error, stage, hint}
    # a failure before the job was prepared (PrepareFailed, PreflightFailed): {code, error, stage,
    # hint} of the JobFailed the rules end it with (core/rules/ending.py); cleared by `bgctl retry`
    start_failure: dict[str, Any] | None = None
    last_error: str | None = None
    outbox_error: str | None = None  # OutboxWriteFailed.error until the result is written
    rejected: bool = False
    end_hook_seq: int | None = None  # JobEndHookStarted.end_seq: the on_job_end command ran for that end
    # reuse
    fresh: bool = False  # bgctl submit --fresh: nothing reused
    # InputTokensCounted: whether input_tokens are the provider's exact counts (tiktoken is exact for
    # OpenAI and Azure OpenAI, whose jobs have no such event) or estimates
    input_tokens_exact: bool = True
    cached_rows: int = 0  # answered from the answers store
    duplicate_rows: int = 0  # planned: copied from an identical row's answer at merge
    duplicates_answered: int = 0
    copied_rows: int = 0  # of cached_rows: an answer the job paid for itself, copied to an identical row
    saved_usd: float = 0.0
    reuse_path: str | None = None

    # --- derived views ----------------------------------------------------------------------
    @property
    def chunks_total(self) -> int:
        return len(self.chunks)

    @property
    def chunks_done(self) -> int:
        return sum(1 for c in self.chunks.values() if c.done)

    @property
    def succeeded_rows(self) -> int:
        # a retry chunk holds only rows that had failed, so successes are never counted twice
        if self.panel is not None:  # a judge panel: its rows with a consensus (its judges count their own)
            return (self.result_counts or (0, 0))[0]
        # the rows taken at prepare (cached_rows) include those the synchronous route sent and
        # the provider refused for good: those failed, and are counted as failed rows
        return sum(c.succeeded for c in self.chunks.values()) + self.cached_rows - len(refused_rows(self))

    @property
    def state(self) -> str:
        if self.corrupt:
            return "corrupt"
        if self.ended:
            return self.ended
        if self.held:
            return "held"
        if not self.prepared:
            return "running" if self.panel is not None else "preparing"  # a panel runs through its judges' jobs
        return _chunks_phase(list(self.chunks.values()))

    @property
    def terminal(self) -> bool:
        return self.ended is not None


def _chunks_phase(chunks: list[ChunkState]) -> str:
    """The state of a prepared job that has not ended, from its chunks."""
    if any(c.in_flight for c in chunks):
        return "running"
    if any(c.open_intent for c in chunks):
        return "submitting"
    if any(c.failure and c.failure.get("retryable") and not c.done for c in chunks):
        return "submitting"  # refused for the enqueued-token limit: waiting to be sent again
    if any(c.create == "done" and c.status in TERMINAL_BATCH and not c.done for c in chunks):
        return "downloading"
    if chunks and all(c.done or c.failure for c in chunks):
        return "downloading"  # merging and writing the result
    if not any(c.upload != "none" for c in chunks):
        return "queued"
    return "submitting"

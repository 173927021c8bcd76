"""The actions :mod:`batchgrader.core.rules.decide` returns (upload, create, poll, download, merge, retry,
hold, write result, archive, ...), and its inputs besides the state: the engine's ``Timers`` and the
``Step`` already taken in this tick.  Plain frozen values; the engine carries them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar

from batchgrader.core.rules import queue
from batchgrader.core.rules.queue import (  # noqa: F401 - part of the rules' interface
    enqueued_tokens,
    known_limit,
    probe_after_completion,
    queue_limit,
    refusal_lesson,
    token_cap,
)

# --- inputs ---------------------------------------------------------------------------------------


OUTBOX_TIMER = -1  # the "chunk" of Timers.not_before that holds a job's next outbox write
ONLINE_TIMER = -2  # the "chunk" of Timers.not_before before which a synchronous route sends no request


@dataclass(frozen=True)
class Timers:
    """The daemon's timing state (not in the event log: it restarts fresh with the process).

    ``next_poll[(job, chunk)] = (due, delay)``; ``not_before[(job, chunk)]`` is the time before
    which a refused chunk is not sent again (``not_before[(job, OUTBOX_TIMER)]``: before which a
    result that could not be written is not tried again); ``cancel_sent`` holds batch ids already
    cancelled; ``dup_next[(job, chunk)]`` when a chunk created again is next listed for a late
    duplicate; ``next_listing[(job, chunk)]`` when a create whose outcome is unknown is listed
    again; ``download_after[(job, chunk, kind)]`` before when a result file whose download failed
    is not tried again; ``merging[(job, chunk)]`` until when a chunk merged in a worker process is
    waited for (the worker's end wakes the daemon; after that time it is stopped).  A rule acts
    only once its time has come, so "an action is due" and "the daemon must tick" are one thing
    (:func:`batchgrader.core.rules.due.next_due`).

    Every time here is on the monotonic clock, ``mono`` now (a wall-clock step moves no wait);
    ``mono=None``: the timers are on the clock of the ``now`` given to the rules (one clock)."""

    next_poll: Mapping[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    not_before: Mapping[tuple[str, int], float] = field(default_factory=dict)
    cancel_sent: AbstractSet[str] = frozenset()
    mono: float | None = None
    dup_next: Mapping[tuple[str, int], float] = field(default_factory=dict)
    next_listing: Mapping[tuple[str, int], float] = field(default_factory=dict)
    download_after: Mapping[tuple[str, int, str], float] = field(default_factory=dict)
    merging: Mapping[tuple[str, int], float] = field(default_factory=dict)

    def clock(self, now: float) -> float:
        """The time the timers are compared with: ``mono``, else the rules' ``now``."""
        return now if self.mono is None else self.mono


@dataclass(frozen=True)
class Step:
    """How far one job got in the current tick: the highest stage reached and the actions done."""

    stage: int = 0
    done: frozenset[tuple[Any, ...]] = frozenset()

    def after(self, action: Action) -> Step:
        return Step(max(self.stage, action.stage), self.done | {action.key})


# --- actions --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    job_id: str
    stage: ClassVar[int] = 0
    ends_step: ClassVar[bool] = False  # the job goes no further in this tick after this action

    @property
    def key(self) -> tuple[Any, ...]:
        return (type(self).__name__, getattr(self, "chunk", None), getattr(self, "kind", None))


@dataclass(frozen=True)
class RecoverEnded(Action):
    """An ended job whose error report a crash may have interrupted: write it, record it."""

    stage: ClassVar[int] = 0


@dataclass(frozen=True)
class RestoreInput(Action):
    """A reopened job (``bgctl retry``): bring the archived input back, if it is there."""

    stage: ClassVar[int] = 1


@dataclass(frozen=True)
class Preflight(Action):
    """Send the first requests the job will send (its preflight's rows not answered yet) through
    the provider's synchronous API before it is prepared into batches, one row at a time (intent
    ``PreflightRequested``, outcome ``PreflightRowAnswered`` / ``PreflightFailed`` /
    ``PreflightUnreachable``; ``PreflightPassed`` once every row is answered).  A preflight that
    passed is followed by the job's ``Prepare`` in the same tick (issue 38: no tick's wait between)."""

    stage: ClassVar[int] = 2


@dataclass(frozen=True)
class SendOnline(Action):
    """Send the job's rows through the provider's synchronous API (``route: flex`` or
    ``online``; ``auto`` first chooses, ``RouteChosen``): per request the intent
    ``OnlineRequestSent``, then ``OnlineRequestAnswered`` or ``OnlineRequestFailed``; once every
    row is answered or failed for good, ``OnlineRowsDone`` (daemon/steps/online.py)."""

    stage: ClassVar[int] = 2
    ends_step: ClassVar[bool] = True


@dataclass(frozen=True)
class Prepare(Action):
    stage: ClassVar[int] = 2
    ends_step: ClassVar[bool] = True


@dataclass(frozen=True)
class CancelBatch(Action):
    """Cancel a running batch: the job was cancelled, or (``reason`` set) its deadline nears
    (core/rules/stragglers.py; ``StragglerCancelRequested`` is recorded before the cancel leaves)."""

    chunk: int
    batch_id: str
    reason: str = ""
    deadline_at: float | None = None
    margin: float = 0.0
    stage: ClassVar[int] = 3


@dataclass(frozen=True)
class Release(Action):
    reason: str = "budget allows it now"
    stage: ClassVar[int] = 3


@dataclass(frozen=True)
class Reconcile(Action):
    """An intent without an outcome (after a crash or a lost reply): ask the provider."""

    chunk: int
    intent: str  # upload | create
    stage: ClassVar[int] = 4


@dataclass(frozen=True)
class Poll(Action):
    chunk: int
    batch_id: str
    stage: ClassVar[int] = 5


@dataclass(frozen=True)
class FailBatch(Action):
    """A batch ended ``failed``. Retryable (token limit): sent again after ``retry_delay``."""

    chunk: int
    batch_id: str | None
    code: str
    error: str
    retryable: bool
    retry_delay: float = 0.0
    learned: queue.Learned | None = None  # what a token_limit_exceeded refusal taught (QueueLimitLearned)
    message: str | None = None  # the provider's refusal message
    stage: ClassVar[int] = 6


@dataclass(frozen=True)
class Download(Action):
    chunk: int
    batch_id: str | None
    kind: str  # output | error
    file_id: str
    stage: ClassVar[int] = 6


@dataclass(frozen=True)
class CheckDuplicates(Action):
    """After a create that followed a failed or absent one of the same attempt: look again by
    bg_key and cancel any extra batch (a late create), recorded in DuplicateBatchesChecked."""

    chunk: int
    stage: ClassVar[int] = 5


@dataclass(frozen=True)
class SearchRecovered(Action):
    """A job re-accepted from its work folder: find and adopt its batches before any create."""

    stage: ClassVar[int] = 7
    ends_step: ClassVar[bool] = True


@dataclass(frozen=True)
class Merge(Action):
    chunk: int
    stage: ClassVar[int] = 6


@dataclass(frozen=True)
class FailUnstarted(Action):
    """A chunk never sent fails with all its rows (the job was halted or cancelled)."""

    chunk: int
    code: str
    error: str
    row_message: str
    stage: ClassVar[int] = 7


@dataclass(frozen=True)
class Hold(Action):
    code: str
    reason: str
    stage: ClassVar[int] = 7


@dataclass(frozen=True)
class Upload(Action):
    """Upload a chunk's file (intent UploadStarted).  ``ahead``: while the chunk waits for room
    in the provider's queue (UploadAheadPlanned in the same append); created when room appears."""

    chunk: int
    attempt: int
    filename: str
    ahead: bool = False
    limit: int | None = None
    enqueued: int = 0
    stage: ClassVar[int] = 7


@dataclass(frozen=True)
class Create(Action):
    chunk: int
    stage: ClassVar[int] = 7


@dataclass(frozen=True)
class CreateStaged(Create):
    """The create of a chunk uploaded ahead of queue room, once there is room: decided right
    after the polls, so it does not wait for the batch that made room to be downloaded and
    merged.  The same action as a Create for "at most once per tick"."""

    stage: ClassVar[int] = 5

    @property
    def key(self) -> tuple[Any, ...]:
        return ("Create", self.chunk, None)


@dataclass(frozen=True)
class Replan(Action):
    """A chunk larger than the queue limit: split its rows into chunks that fit (ChunkReplanned).
    Under an estimated limit a row over it goes alone; under a stated one it fails."""

    chunk: int
    limit: int
    exact: bool
    stage: ClassVar[int] = 7


@dataclass(frozen=True)
class PlanStragglers(Action):
    """The rows a straggler's cancelled batch did not answer: planned as a chunk sent through
    the synchronous route (``RetryPlanned`` with its ``route``), not as a new batch."""

    chunk: int
    stage: ClassVar[int] = 7
    ends_step: ClassVar[bool] = True


@dataclass(frozen=True)
class RouteChunk(Action):
    """A chunk never sent whose batch could no longer end before the deadline: its rows go
    through the synchronous route (``ChunkRouted``), as a straggler's do, never in a batch."""

    chunk: int
    deadline_at: float
    margin: float
    reason: str
    stage: ClassVar[int] = 7
    ends_step: ClassVar[bool] = True


@dataclass(frozen=True)
class SendStragglers(Action):
    """Send a straggler chunk's rows through the synchronous route (``OnlineRequestSent`` ...);
    once every row has its outcome, the chunk completes (``ChunkCompleted``)."""

    chunk: int
    stage: ClassVar[int] = 7
    ends_step: ClassVar[bool] = True


@dataclass(frozen=True)
class PlanRetries(Action):
    custom_ids: tuple[str, ...]
    stage: ClassVar[int] = 8
    ends_step: ClassVar[bool] = True


@dataclass(frozen=True)
class WriteResult(Action):
    """Write the result file (and, for a failed job, the error report), then record it."""

    failed: bool
    error: str
    hint: str
    stage: ClassVar[int] = 8


@dataclass(frozen=True)
class StoreAnswers(Action):
    """Store a merged chunk's successful answers for reuse (AnswersStored, in the answers'
    transaction).  After the job's other work: collecting, sending, and its result file."""

    chunk: int
    stage: ClassVar[int] = 8


@dataclass(frozen=True)
class WriteErrorReport(Action):
    """A job that failed before it was prepared (its input, its profile, its preflight): its error
    report in the outbox (it has no result file)."""

    error: str
    hint: str
    stage: ClassVar[int] = 8


@dataclass(frozen=True)
class Archive(Action):
    to_failed: bool
    stage: ClassVar[int] = 8


@dataclass(frozen=True)
class DeleteProviderFiles(Action):
    file_ids: tuple[str, ...]
    stage: ClassVar[int] = 8


@dataclass(frozen=True)
class Finish(Action):
    """The job's final event: JobCompleted, JobFailed or JobCancelled."""

    event: str
    payload: Mapping[str, Any] = field(hash=False)
    stage: ClassVar[int] = 8

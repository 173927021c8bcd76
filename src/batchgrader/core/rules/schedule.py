"""The daemon's timing state in one value: when each batch is polled next, before when a refused
chunk or an unwritten result is not tried again, the create requests whose outcome is unknown,
the duplicate watch, download failures, progress seen, and the run times of recent batches.

None of it is in the event log: a daemon starts with an empty schedule and learns it again
(every rule that reads it treats "unknown" as "at once" or "from the log's time").  Every time
here is on the monotonic clock of the process that set it.  The engine's steps keep it up to
date; the pure rules (:mod:`batchgrader.core.rules.decide` through :meth:`Schedule.timers`, and
:mod:`batchgrader.core.rules.outcomes`) read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from batchgrader.core.rules.actions import OUTBOX_TIMER, Timers
from batchgrader.core.rules.polling import Durations
from batchgrader.core.rules.settle import CreateSent

#: a chunk of a job: (job_id, chunk index)
ChunkKey = tuple[str, int]
#: one result file of a chunk: (job_id, chunk index, kind), kind "output" or "error"
FileKey = tuple[str, int, str]


@dataclass
class Schedule:
    """The daemon's timing state (see the module docstring).

    * ``next_poll[chunk] = (due, delay)``: when the chunk's batch is polled next, and the delay that set it;
    * ``not_before[chunk]``: before when a refused chunk is not sent again (``(job, OUTBOX_TIMER)``:
      a result that could not be written);
    * ``cancel_sent``: batch ids whose cancel was sent;
    * ``next_listing[chunk]``: when a create whose outcome is unknown is listed again;
    * ``create_sent[chunk]``: such a create as this process sent it;
    * ``requested_at[chunk]`` / ``created_at[chunk]``: when a create left / its batch was recorded;
    * ``dup_next[chunk]`` / ``dup_cancelled[chunk]``: the duplicate watch's next listing and the
      duplicates cancelled so far;
    * ``create_refusals[chunk]``: creates refused at once for the queue limit, in a row;
    * ``download_failures[file] = (tries, not_before)``; ``outbox_failures[job]``: results not
      written in a row; ``step_failures[job]``: steps of the job that raised an unexpected error,
      in a row (at :data:`~batchgrader.core.rules.decide.STEP_FAILURES_MAX` the job is held);
    * ``progress[chunk] = (when, done)``: the first poll that saw requests done;
      ``finalizing[chunk]``: when the batch was first seen finishing;
    * ``durations``: how long the last batches of each model took.
    """

    next_poll: dict[ChunkKey, tuple[float, float]] = field(default_factory=dict)
    not_before: dict[ChunkKey, float] = field(default_factory=dict)
    cancel_sent: set[str] = field(default_factory=set)
    next_listing: dict[ChunkKey, float] = field(default_factory=dict)
    create_sent: dict[ChunkKey, CreateSent] = field(default_factory=dict)
    requested_at: dict[ChunkKey, float] = field(default_factory=dict)
    created_at: dict[ChunkKey, float] = field(default_factory=dict)
    dup_next: dict[ChunkKey, float] = field(default_factory=dict)
    dup_cancelled: dict[ChunkKey, set[str]] = field(default_factory=dict)
    create_refusals: dict[ChunkKey, int] = field(default_factory=dict)
    download_failures: dict[FileKey, tuple[int, float]] = field(default_factory=dict)
    outbox_failures: dict[str, int] = field(default_factory=dict)
    step_failures: dict[str, int] = field(default_factory=dict)  # job -> steps that raised unexpectedly, in a row
    progress: dict[ChunkKey, tuple[float, int]] = field(default_factory=dict)
    finalizing: dict[ChunkKey, float] = field(default_factory=dict)
    durations: Durations = field(default_factory=Durations)

    def timers(self, mono: float | None, merging: Mapping[ChunkKey, float] | None = None) -> Timers:
        """What :mod:`batchgrader.core.rules.decide` reads of the schedule (live views, but for the
        downloads' back-offs); ``merging``: the chunks merged in a worker process and until when
        each is waited for."""
        return Timers(
            self.next_poll,
            self.not_before,
            self.cancel_sent,
            mono=mono,
            dup_next=self.dup_next,
            next_listing=self.next_listing,
            download_after={k: at for k, (_, at) in self.download_failures.items()},
            merging=merging or {},
        )

    def listing_due(self, key: ChunkKey, mono: float) -> bool:
        """Whether a create whose outcome is unknown may be listed now."""
        return self.next_listing.get(key, float("-inf")) <= mono

    def create_settled(self, key: ChunkKey) -> None:
        """A create's outcome is known (created, adopted, or believed absent): forget its request."""
        self.create_sent.pop(key, None)
        self.next_listing.pop(key, None)

    def batch_created(self, key: ChunkKey, mono: float, first_poll: tuple[float, float]) -> None:
        """A batch was recorded created (or adopted) for ``key`` at ``mono``; polled at ``first_poll``."""
        self.create_settled(key)
        self.created_at[key] = mono
        self.dup_next.pop(key, None)
        self.next_poll[key] = first_poll

    def duplicates_checked(self, key: ChunkKey) -> None:
        """The duplicate watch of ``key`` ended (its last listing is recorded)."""
        self.dup_next.pop(key, None)
        self.dup_cancelled.pop(key, None)

    def outbox_written(self, job_id: str) -> None:
        """A job's result was written: its back-off is over."""
        self.outbox_failures.pop(job_id, None)
        self.not_before.pop((job_id, OUTBOX_TIMER), None)

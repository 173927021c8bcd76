"""What an outcome means, as pure rules: a failed download, a refused create, a result that could
not be written, a merge worker that failed, and a listing that did or did not find a create.

Each rule is a function of the outcome, the :class:`~batchgrader.core.rules.schedule.Schedule` (or the
counts it holds), the settings and the time, returning a decision value; the engine's steps
carry the decision out (events, schedule updates, calls).  :mod:`batchgrader.core.rules.decide` says
what to do next; this module says what the answer to it means.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from batchgrader.core.log.events import NewEvent, new_event
from batchgrader.core.log.state import ChunkState
from batchgrader.core.rules import queue
from batchgrader.core.rules.decide import capacity_refusal, resubmit_delay
from batchgrader.core.rules.settle import CreateSent, absent_after, duplicate_check_in, next_listing_in

#: failed downloads of one file (each with the client's own retries) before its rows fail
MAX_DOWNLOAD_ATTEMPTS = 4
#: s, the longest pause between two tries of a download
MAX_DOWNLOAD_WAIT = 60.0
#: downloads again of a malformed result file before its bad lines' rows fail
MAX_MALFORMED_DOWNLOADS = 2
#: s before a result that could not be written is tried again (doubled per failure in a row)
OUTBOX_RETRY_FIRST = 5.0
OUTBOX_RETRY_MAX = 300.0


# --- downloads ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DownloadRetry:
    """Try the download again, not before ``at``; ``tries`` failures so far."""

    tries: int
    at: float


@dataclass(frozen=True)
class DownloadGiveUp:
    """The file is given up (``OutputDownloadFailed`` after ``attempts``): its rows fail."""

    attempts: int


def download_failed(tries: int, definite: bool, now: float) -> DownloadRetry | DownloadGiveUp:
    """A download failed after ``tries`` earlier failures: a definite refusal (404: expired or
    deleted; 403) gives the file up at once; any other failure is tried again after a pause of
    2 s doubling per failure (at most :data:`MAX_DOWNLOAD_WAIT`), until
    :data:`MAX_DOWNLOAD_ATTEMPTS` failures."""
    tries += 1
    if definite or tries >= MAX_DOWNLOAD_ATTEMPTS:
        return DownloadGiveUp(tries)
    return DownloadRetry(tries, now + min(MAX_DOWNLOAD_WAIT, 2.0**tries))


def download_may_start(failures: tuple[int, float] | None, now: float) -> bool:
    """Whether a download whose failures so far are ``(tries, not_before)`` may be tried at ``now``."""
    return failures is None or failures[1] <= now


def malformed_download_again(malformed_downloads: int) -> bool:
    """Whether a malformed result file is downloaded again (else its good lines are kept)."""
    return malformed_downloads < MAX_MALFORMED_DOWNLOADS


# --- refused creates ------------------------------------------------------------------------------

RefusalKind = Literal["rejected", "learn", "wait", "queue_full"]


@dataclass(frozen=True)
class CreateRefused:
    """What a create refused at once means.

    * ``rejected``: never (a bad request): the chunk fails as ``create_rejected``;
    * ``learn``: the refusal teaches the queue limit (``learned``): record it (the chunk is
      re-planned or waits for room by the rules of :mod:`batchgrader.core.rules.decide`);
    * ``wait``: not now (a rate limit, or a queue refusal teaching nothing): sent again not
      before ``not_before``; ``rounds``: queue refusals in a row so far (0: not counted);
    * ``queue_full``: refused for the queue limit :data:`~batchgrader.core.rules.queue.QUEUE_FULL_ROUNDS`
      times: its rows fail as ``queue_full``, its uploaded file is deleted.
    """

    kind: RefusalKind
    not_before: float | None = None
    rounds: int = 0
    learned: queue.Learned | None = None


def create_refused(
    status_code: int | None,
    code: str | None,
    message: str,
    learned: queue.Learned | None,
    rounds: int,
    poll_interval: float,
    now: float,
) -> CreateRefused:
    """The meaning of a create refused with ``status_code``/``code``/``message``, given what the
    refusal teaches of the queue limit (``learned``, :func:`~batchgrader.core.rules.queue.refusal_lesson`,
    asked only of a queue refusal) and the chunk's queue refusals in a row before it (``rounds``)."""
    if not capacity_refusal(status_code, message):
        return CreateRefused("rejected")
    is_queue = queue.is_token_limit_refusal(code, message)
    if is_queue and learned is not None:  # some providers refuse at once: learn the limit from that too
        return CreateRefused("learn", learned=learned)
    base = resubmit_delay(poll_interval)
    if not is_queue:  # a rate limit: sent again a while later
        return CreateRefused("wait", not_before=now + base)
    rounds += 1
    if queue.queue_full(rounds):
        return CreateRefused("queue_full", rounds=rounds)
    return CreateRefused("wait", not_before=now + queue.refusal_wait(base, rounds), rounds=rounds)


def queue_full_error(rounds: int, error: str) -> str:
    """The error of a chunk that ended ``queue_full``."""
    return f"the provider refused to create the batch {rounds} times for its queue limit; last refusal: {error}"


# --- the outbox -----------------------------------------------------------------------------------


def outbox_retry_at(failures: int, now: float) -> float:
    """When a result that could not be written ``failures`` times in a row (this one included) is
    tried again: 5 s, doubling, at most 5 minutes."""
    return now + min(OUTBOX_RETRY_MAX, OUTBOX_RETRY_FIRST * 2 ** (failures - 1))


# --- merging --------------------------------------------------------------------------------------


def merge_in_worker(requests: int, merge_worker_rows: int | None, have_workers: bool, worker_failed: bool) -> bool:
    """Whether a chunk of ``requests`` rows is merged in a worker process: with workers, at least
    ``merge_worker_rows`` rows, and no worker of this chunk failed before (then, and for every
    later try, it is merged in the daemon: the fallback)."""
    return have_workers and merge_worker_rows is not None and requests >= merge_worker_rows and not worker_failed


# --- listings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListAgain:
    """The create is not listed yet and may still land: list again in ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class Absent:
    """The create is believed not carried out: ``BatchCreateFailed(definite=true)``."""


def create_not_listed(request: CreateSent, request_timeout: float, now: float) -> ListAgain | Absent:
    """A listing did not show a create whose outcome is unknown (``request`` and ``now`` on the
    same clock): absent from :func:`~batchgrader.core.rules.settle.absent_after` on, else listed again
    (:func:`~batchgrader.core.rules.settle.next_listing_in`)."""
    if now >= absent_after(request, request_timeout):
        return Absent()
    return ListAgain(next_listing_in(request, request_timeout, now))


def duplicate_watch_next(now: float, ends: float, batch_ended: bool, pending: int) -> float | None:
    """After a duplicate listing: seconds until the next one, or None when this listing is the
    last (recorded): the watch ended (``now`` past ``ends``) or the batch ended, and no duplicate
    still waits for its cancel."""
    if (batch_ended or now >= ends) and not pending:
        return None
    return duplicate_check_in(now, ends)


def batch_status_event(c: ChunkState, b: Any) -> NewEvent | None:
    """The ``BatchStatusChanged`` of what the provider says of ``c``'s batch (``b``, a
    :class:`~batchgrader.provider.protocol.BatchInfo`), or None if nothing changed (always one for
    a batch not read back since its create reply: that it was read is recorded)."""
    counts = dataclasses.asdict(b.request_counts)
    same = (b.status, counts, b.output_file_id, b.error_file_id) == (
        c.status,
        c.request_counts,
        c.output_file_id,
        c.error_file_id,
    )
    if same and c.read_back:
        return None
    return new_event(
        "BatchStatusChanged",
        chunk=c.index,
        batch_id=b.id,
        status=b.status,
        request_counts=counts,
        output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        errors=[dataclasses.asdict(x) for x in b.errors],
    )

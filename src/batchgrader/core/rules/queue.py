"""The provider's queue limit: how many prompt tokens of one model may be in flight at once.

Pure rules, no I/O and no clock: what a ``token_limit_exceeded`` refusal teaches, the limit in
force for a model, and whether a chunk fits in the room left.  The engine records what it learns
as ``QueueLimitLearned`` events (per provider base URL and model), so the knowledge survives
restarts; the fold keeps the latest one in ``State.queue_limits``.

* The real message carries the figure (``... Limit: 2,000,000 enqueued tokens. ...``): that is
  the limit, exactly.
* A message without a figure: the limit is taken as half of the tokens that were in flight when
  the batch was refused (the refused batch included), and probed upward again (x1.5) each time a
  batch of that model completes, until the next refusal halves it again.
* A configured ``enqueued_token_limit`` applies from the start; with both, the smaller rules.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Any

from batchgrader.core.configuration.config import Config, Profile
from batchgrader.core.log.state import ChunkState, JobState, State

#: ``Limit: 2,000,000 enqueued tokens`` (digits with optional thousands separators).
_FIGURE = re.compile(r"Limit:\s*([0-9][0-9,_ .]*[0-9]|[0-9])\s*enqueued tokens", re.IGNORECASE)
PROBE_NUMERATOR, PROBE_DENOMINATOR = 3, 2  # raise an estimated limit by half after a completed batch
TOKEN_LIMIT_CODE = "token_limit_exceeded"


#: Azure OpenAI's wording (per deployment): ``... surpassed the configured limit of 30K for the deployment 'x'``
_AZURE_FIGURE = re.compile(r"configured limit of\s*([0-9][0-9,_.]*)\s*([KMB])?\b", re.IGNORECASE)
_SUFFIX = {"K": 1_000, "M": 1_000_000, "B": 1_000_000_000}


def parse_queue_limit(message: str | None) -> int | None:
    """The figure in a ``token_limit_exceeded`` message, or None when it has none."""
    if not message:
        return None
    m = _FIGURE.search(message)
    if m is None:
        a = _AZURE_FIGURE.search(message)
        if a is None:
            return None
        from decimal import Decimal, InvalidOperation

        try:
            value = Decimal(a.group(1).replace(",", "").replace("_", "")) * _SUFFIX.get((a.group(2) or "").upper(), 1)
        except InvalidOperation:
            return None
        return int(value) if value > 0 else None
    digits = re.sub(r"[^0-9]", "", m.group(1))
    n = int(digits) if digits else 0
    return n if n > 0 else None


def is_token_limit_refusal(code: str | None, message: str | None) -> bool:
    if code == TOKEN_LIMIT_CODE or message is None:
        return code == TOKEN_LIMIT_CODE
    text = message.lower()
    return "enqueued token limit" in text or "number of enqueued tokens has surpassed" in text  # OpenAI's, Azure's


@dataclass(frozen=True)
class Learned:
    """A limit worth recording: ``source`` is message, halved or probe."""

    limit: int
    exact: bool
    source: str


def after_refusal(message: str | None, in_flight_tokens: int, known: dict[str, Any] | None) -> Learned | None:
    """What a refusal teaches, or None when it teaches nothing new.

    ``in_flight_tokens`` is the model's tokens in flight when the batch was refused, the refused
    batch's own tokens included."""
    figure = parse_queue_limit(message)
    if figure is not None:
        if known is not None and known.get("exact") and known.get("limit") == figure:
            return None
        return Learned(figure, True, "message")
    if known is not None and known.get("exact"):
        # the provider stated a figure before: a refusal within it means others share the queue;
        # keep the figure and wait (the caller delays the resubmission)
        return None
    halved = max(1, in_flight_tokens // 2)
    if known is not None and int(known.get("limit", 0)) <= halved:
        return None  # the estimate is already at or below half of what was refused
    return Learned(halved, False, "halved")


def after_completion(known: dict[str, Any] | None) -> Learned | None:
    """Probe an estimated limit upward after a batch of the model completed (exact ones stay)."""
    if known is None or known.get("exact"):
        return None
    limit = int(known["limit"])
    return Learned(max(limit + 1, limit * PROBE_NUMERATOR // PROBE_DENOMINATOR), False, "probe")


def limit_in_force(configured: int | None, known: dict[str, Any] | None) -> int | None:
    """The queue limit the scheduler keeps to: the configured one, the learned one, or the smaller."""
    learned = int(known["limit"]) if known else None
    if configured is None:
        return learned
    return configured if learned is None else min(configured, learned)


def has_room(limit: int | None, in_flight_tokens: int, tokens: int, exact: bool = True) -> bool:
    """Whether ``tokens`` more may be sent while ``in_flight_tokens`` are queued.  Under an
    estimated limit, a chunk larger than the estimate (a single row) may still go alone."""
    if limit is None or in_flight_tokens + tokens <= limit:
        return True
    return not exact and in_flight_tokens == 0


def needs_replan(limit: int | None, tokens: int, requests: int = 2, exact: bool = True) -> bool:
    """A chunk larger than the limit must have its rows planned again.  Under an estimated
    limit a single row is not split further: it is tried alone (see :func:`has_room`)."""
    return limit is not None and tokens > limit and (exact or requests > 1)


def fill_order(chunks: list[ChunkState]) -> list[ChunkState]:
    """The order in which a job's waiting chunks are offered the queue's room: largest first
    (first-fit decreasing), in chunk order among equals.  A re-planned chunk leaves a small
    remainder beside each limit-sized chunk; offered first, a remainder would take the room a
    full chunk needs, and cost a round of its own."""
    return sorted(chunks, key=lambda c: -c.input_tokens)


def fails_alone(requests: int, others_in_flight: int) -> bool:
    """A single row refused while nothing else was in flight can never be accepted."""
    return requests == 1 and others_in_flight == 0


# --- applied to the folded state -------------------------------------------------------------------


def model_chunks(state: State, model: str | None, sandbox: bool | None = None) -> Iterator[tuple[str, ChunkState]]:
    """``(job id, chunk)`` of every active job of ``model``; with ``sandbox`` given, of that
    queue's jobs only (a sandbox job's batches are in the emulator's queue, not the provider's)."""
    for j in state.active_jobs():
        if j.model == model and (sandbox is None or j.sandbox == sandbox):
            for c in j.chunks.values():
                yield j.job_id, c


def enqueued_tokens(state: State, model: str, exclude: tuple[str, int] | None = None, sandbox: bool | None = None) -> int:
    """Input tokens of ``model`` at the provider or on their way there, across all jobs
    (conservative: a batch counts from its upload until we see it terminal; a file uploaded
    ahead of queue room counts from its create)."""
    total = 0
    for job_id, c in model_chunks(state, model, sandbox):
        if exclude == (job_id, c.index) or c.done or c.staged:
            continue
        if c.in_flight or c.open_intent or (c.upload == "done" and c.create in ("none", "failed") and c.failure is None):
            total += c.input_tokens
    return total


def doomed_tokens(state: State, model: str, known: dict[str, Any] | None, sandbox: bool | None = None) -> int:
    """Input tokens of ``model``'s batches still validating that are larger on their own than a
    limit the provider stated (a learned, exact one): the provider refuses them whatever else is
    in flight, so they hold no queue room.  The chunk waiting for room need not wait for their
    refusals (a provider may validate batches one after the other).  Were one accepted after
    all, the chunk sent beside it would be refused for the limit: sent again later, never paid
    twice."""
    if not known or not known.get("exact"):
        return 0
    limit = int(known["limit"])
    return sum(
        c.input_tokens
        for _, c in model_chunks(state, model, sandbox)
        if c.in_flight and c.status == "validating" and c.input_tokens > limit
    )


def staged_tokens(state: State, model: str, but: tuple[str, Container[int]] = ("", ()), sandbox: bool | None = None) -> int:
    """Input tokens of ``model`` whose files are uploaded (or being uploaded) ahead of queue room,
    across all jobs: they wait for room and are not in the queue (see UploadAheadPlanned).
    ``but``: a job id and chunks of it left out."""
    left_out, chunks = but
    return sum(
        c.input_tokens
        for job_id, c in model_chunks(state, model, sandbox)
        if c.staged and not (job_id == left_out and c.index in chunks)
    )


def known_limit(state: State, queue_url: str, model: str) -> dict[str, Any] | None:
    """The latest QueueLimitLearned for the provider and model, or None."""
    return state.queue_limits.get((queue_url, model))


def queue_limit(state: State, config: Config, model: str, queue_url: str) -> tuple[int | None, bool]:
    """The queue limit in force for ``model`` (configured or learned) and whether it is exact."""
    configured = config.default.enqueued_token_limit.get(model)
    known = known_limit(state, queue_url, model)
    limit = limit_in_force(configured, known)
    exact = known is None or bool(known.get("exact")) or (configured is not None and configured <= int(known["limit"]))
    return limit, exact


def token_cap(state: State, config: Config, profile: Profile, model: str, queue_url: str) -> int | None:
    """Largest input tokens of one chunk: split_token_limit and the queue limit, where set."""
    caps = [x for x in (profile.split_token_limit, queue_limit(state, config, model, queue_url)[0]) if x is not None]
    return min(caps) if caps else None


def refusal_lesson(state: State, job: JobState, c: ChunkState, message: str | None, queue_url: str) -> Learned | None:
    """What a token_limit_exceeded refusal of ``c`` teaches (None: nothing new)."""
    model = job.model or ""
    in_flight = enqueued_tokens(state, model, exclude=(job.job_id, c.index), sandbox=job.sandbox) + c.input_tokens
    return after_refusal(message, in_flight, known_limit(state, queue_url, model))


def probe_after_completion(state: State, job: JobState, queue_url: str) -> Learned | None:
    """After a batch completed, an estimated (figure-less) limit is probed upward."""
    return after_completion(known_limit(state, queue_url, job.model or ""))


# --- refusals that teach nothing ------------------------------------------------------------------

#: refusals of one chunk for the queue limit (each after a wait twice as long as the one before)
#: before its rows fail as ``queue_full``: a refusal of a chunk that fits the limit the provider
#: states teaches nothing (the queue is shared with other tools, or the limit is not what it says)
QUEUE_FULL_ROUNDS = 6
MAX_REFUSAL_WAIT = 600.0  # s, the longest wait before a refused chunk is sent again


def refusal_wait(base: float, rounds: int) -> float:
    """Seconds before a chunk refused ``rounds`` times (this one included) without a lesson is
    sent again: ``base``, doubled at each round, at most :data:`MAX_REFUSAL_WAIT`."""
    return min(base * 2.0 ** max(0, rounds - 1), MAX_REFUSAL_WAIT)


def queue_full(rounds: int) -> bool:
    """Whether a chunk refused ``rounds`` times for the queue limit stops being sent (its rows
    fail as ``queue_full``; ``bgctl retry`` sends them again)."""
    return rounds >= QUEUE_FULL_ROUNDS

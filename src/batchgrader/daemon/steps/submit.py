"""The submit step: upload a chunk, create its batch, reconcile an intent without an outcome,
watch for duplicate batches, cancel a batch (a straggler's cancel recorded before it leaves).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import TERMINAL_BATCH, ChunkState, JobState
from batchgrader.core.rules import queue
from batchgrader.core.rules.actions import CancelBatch, CheckDuplicates, Create, Reconcile, Upload
from batchgrader.core.rules.decide import FIRST_POLL_DELAY, epoch, refusal_lesson
from batchgrader.core.rules.outcomes import (
    ListAgain,
    batch_status_event,
    create_not_listed,
    create_refused,
    duplicate_watch_next,
    queue_full_error,
)
from batchgrader.core.rules.settle import (
    CreateSent,
    create_settle_seconds,
    duplicate_watch_ends,
)
from batchgrader.daemon.context import CLOCK_SKEW_SLACK, Context
from batchgrader.pipeline.requests import ENDPOINT
from batchgrader.provider.protocol import OutcomeUnknown, Provider, ProviderError, ProviderRejected
from batchgrader.provider.reconcile import reconcile_batch, reconcile_upload

log = logging.getLogger("batchgrader.engine")


class SubmitStep:
    """Send work, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def upload(self, a: Upload, job: JobState, now: float) -> None:
        c = job.chunks[a.chunk]
        self.ctx.delete_refused_file(job, c)
        started = _e("UploadStarted", chunk=c.index, attempt=a.attempt, filename=a.filename, bytes=c.bytes)
        if a.ahead:  # one append: the upload is ahead of queue room from its intent on
            ahead = _e("UploadAheadPlanned", chunk=c.index, attempt=a.attempt, limit=a.limit, enqueued=a.enqueued)
            self.ctx.emit(job.job_id, started, ahead)
            log.info("job %s chunk %s: uploading ahead of queue room", job.job_id, c.index)
        else:
            self.ctx.emit(job.job_id, started)
        self._do_upload(job, job.chunks[c.index])

    def reconcile(self, a: Reconcile, job: JobState, now: float) -> None:
        """An intent without its outcome (a crash, an ambiguous answer): what the provider's own
        records say is recorded before anything is sent again."""
        c = job.chunks[a.chunk]
        if a.intent == "upload":
            self._reconcile_upload(job, c)
        else:
            self._reconcile_create(job, c)

    def _do_upload(self, job: JobState, c: ChunkState) -> None:
        assert c.filename
        try:
            info = self.ctx.provider_for(job).upload(Path(c.path), c.filename)
        except ProviderRejected as exc:
            self.ctx.emit(job.job_id, _e("UploadFailed", chunk=c.index, attempt=c.attempt, error=str(exc), definite=True))
            self.ctx.emit(
                job.job_id,
                _e("ChunkFailed", chunk=c.index, batch_id=None, code="upload_rejected", error=str(exc), retryable=False),
            )
            self.ctx.rows_failed(job, job.chunks[c.index], "upload_rejected", str(exc))
            return
        except OutcomeUnknown as exc:
            log.warning("job %s chunk %s: upload outcome unknown (%s); reconciling", job.job_id, c.index, exc)
            self._reconcile_upload(job, c)
            return
        self.ctx.emit(job.job_id, _e("FileUploaded", chunk=c.index, attempt=c.attempt, file_id=info.id, reconciled=False))

    def _reconcile_upload(self, job: JobState, c: ChunkState) -> None:
        assert c.filename
        found = reconcile_upload(self.ctx.provider_for(job), c.filename, c.bytes)
        if found.file is not None:
            if found.duplicates:
                log.warning(
                    "job %s chunk %s: %d extra uploads of %s left at the provider",
                    job.job_id,
                    c.index,
                    len(found.duplicates),
                    c.filename,
                )
            self.ctx.emit(
                job.job_id, _e("FileUploaded", chunk=c.index, attempt=c.attempt, file_id=found.file.id, reconciled=True)
            )
        else:
            self._do_upload(job, c)  # provably absent: uploading again is safe (files cost no tokens)

    def _metadata(self, job: JobState, c: ChunkState) -> dict[str, str]:
        return {
            "bg_job": job.job_id,
            "bg_chunk": str(c.index),
            "bg_attempt": str(c.attempt),
            "bg_key": f"{job.job_id}:{c.index}:{c.attempt}",
        }

    def create(self, a: Create, job: JobState, now: float) -> None:
        """Create the chunk's batch (a batch the reply names ended is read back by the collect
        step, which the dispatch table runs next)."""
        c = job.chunks[a.chunk]
        assert c.file_id
        self.ctx.emit(
            job.job_id,
            _e(
                "BatchCreateRequested", chunk=c.index, attempt=c.attempt, input_file_id=c.file_id, metadata=self._metadata(job, c)
            ),
        )
        self._do_create(job, job.chunks[c.index])

    def _do_create(self, job: JobState, c: ChunkState) -> None:
        assert c.file_id
        provider = self.ctx.provider_for(job)
        key = (job.job_id, c.index)
        sent = self.ctx.mono_now()  # when this request leaves (not when the tick began)
        self.ctx.schedule.requested_at[key] = sent
        try:
            b = provider.create_batch(c.file_id, ENDPOINT, self.ctx.settings.completion_window, dict(c.metadata))
        except ProviderRejected as exc:
            self.ctx.emit(job.job_id, _e("BatchCreateFailed", chunk=c.index, attempt=c.attempt, error=str(exc), definite=True))
            self._create_refused(job, c, exc)
            return
        except OutcomeUnknown as exc:
            # an error answer (5xx) was given by the provider: what it did is listed at once; no
            # reply (timeout, connection lost): it may still carry the request out a while later
            self.ctx.schedule.create_sent[key] = CreateSent(sent, self.ctx.mono_now(), answered=exc.status_code is not None)
            log.warning("job %s chunk %s: batch create outcome unknown (%s); reconciling", job.job_id, c.index, exc)
            self._reconcile_create(job, c)
            return
        self._batch_created(job, c, b, reconciled=False)

    def _create_refused(self, job: JobState, c: ChunkState, exc: ProviderRejected) -> None:
        """Carry out what a create refused at once means (:func:`~batchgrader.core.rules.outcomes.create_refused`):
        a bad request fails the chunk; a queue refusal that teaches the limit records it; a rate
        limit, or a queue refusal that teaches nothing, waits (doubling per round, counted by this
        process); after ``QUEUE_FULL_ROUNDS`` rounds its rows fail as ``queue_full`` (``bgctl
        retry`` sends them again), so ``daemon --once`` ends."""
        key = (job.job_id, c.index)
        error, code = str(exc), getattr(exc, "code", None)
        learned = None
        if queue.is_token_limit_refusal(code, error):
            learned = refusal_lesson(self.ctx.state, job, c, error, self.ctx.queue_url_for(job))
        rounds = self.ctx.schedule.create_refusals.get(key, 0)
        outcome = create_refused(
            exc.status_code, code, error, learned, rounds, self.ctx.settings.poll_interval_seconds, self.ctx.mono
        )
        if outcome.kind == "wait":
            assert outcome.not_before is not None
            self.ctx.schedule.not_before[key] = outcome.not_before
            if outcome.rounds:
                self.ctx.schedule.create_refusals[key] = outcome.rounds
        elif outcome.kind == "learn":
            self.ctx.emit(job.job_id, *self.ctx.learned_event(job.model or "", outcome.learned, c.index, error, job))
        elif outcome.kind == "queue_full":
            self.ctx.schedule.create_refusals.pop(key, None)
            why = queue_full_error(outcome.rounds, error)
            self.ctx.delete_refused_file(job, c, refused=True)
            self.ctx.emit(
                job.job_id, _e("ChunkFailed", chunk=c.index, batch_id=None, code="queue_full", error=why, retryable=False)
            )
            self.ctx.rows_failed(job, job.chunks[c.index], "queue_full", why)
        else:
            self.ctx.emit(
                job.job_id,
                _e("ChunkFailed", chunk=c.index, batch_id=None, code="create_rejected", error=error, retryable=False),
            )
            self.ctx.rows_failed(job, job.chunks[c.index], "create_rejected", error)

    def _batch_created(self, job: JobState, c: ChunkState, b: Any, reconciled: bool) -> None:
        """Record a batch created (or adopted) for ``c``.  A batch the reply names ended (a
        provider that validates and runs it before replying, or a fast small batch) is due for a
        poll at once: it is never collected from a create reply alone."""
        first_poll = self.ctx.mono if reconciled or b.is_terminal else self.ctx.mono + FIRST_POLL_DELAY
        self.ctx.schedule.batch_created((job.job_id, c.index), self.ctx.mono_now(), (first_poll, FIRST_POLL_DELAY))
        status = b.status if not reconciled else "validating"
        self.ctx.emit(
            job.job_id, _e("BatchCreated", chunk=c.index, attempt=c.attempt, batch_id=b.id, status=status, reconciled=reconciled)
        )
        c = self.ctx.state.jobs[job.job_id].chunks[c.index]
        if reconciled:  # the adopted batch may have moved on (even finished): record where it is
            ev = batch_status_event(c, b)
            if ev is not None:
                self.ctx.emit(job.job_id, ev)

    def _create_request(self, job: JobState, c: ChunkState) -> tuple[CreateSent, bool]:
        """The open create of ``c`` as sent (monotonic, this process) or, after a restart, as the
        log has it (its wall-clock time; compared with the wall clock); and whether it is on the
        monotonic clock."""
        sent = self.ctx.schedule.create_sent.get((job.job_id, c.index))
        if sent is not None:
            return sent, True
        return CreateSent(min(epoch(c.requested_ts, self.ctx.wall), self.ctx.wall)), False

    def _listing_floor(self, c: ChunkState) -> int:
        """``created_after`` for a reconciliation listing: the intent's wall-clock time less the
        request timeout and the skew between our clock and the provider's."""
        requested = min(epoch(c.requested_ts, self.ctx.wall), self.ctx.wall)
        return int(requested - create_settle_seconds(self.ctx.config) - CLOCK_SKEW_SLACK)

    def _reconcile_create(self, job: JobState, c: ChunkState) -> None:
        assert c.file_id
        key = (job.job_id, c.index)
        if not self.ctx.schedule.listing_due(key, self.ctx.mono):
            return
        request, monotonic = self._create_request(job, c)
        now = self.ctx.mono_now() if monotonic else self.ctx.wall
        timeout = self.ctx.settings.request_timeout_seconds
        found = reconcile_batch(
            self.ctx.provider_for(job),
            c.file_id,
            {"bg_key": c.metadata.get("bg_key", "")},
            created_after=self._listing_floor(c),
        )
        keep = found.batch
        outcome = create_not_listed(request, timeout, now) if keep is None else None
        if isinstance(outcome, ListAgain):
            self.ctx.schedule.next_listing[key] = self.ctx.mono + outcome.seconds
            return  # a late create may still land: the outcome stays unknown, look again later
        if keep is not None:
            self._cancel_duplicates(job, c, list(found.duplicates))  # should never happen; never pay twice
            self._batch_created(job, c, keep, reconciled=True)
        else:
            self.ctx.schedule.create_settled(key)
            self.ctx.emit(
                job.job_id,
                _e(
                    "BatchCreateFailed",
                    chunk=c.index,
                    attempt=c.attempt,
                    error="not created (absent from the provider's batch list)",
                    definite=True,
                ),
            )
            # the file is uploaded: decide's Create sends it again, under the same attempt's metadata

    def _cancel_duplicates(self, job: JobState, c: ChunkState, extras: list[Any]) -> list[str]:
        """Ask once each (no retries inside the tick: the next duplicate listing asks again) for
        the cancel of every extra batch of the chunk not ended; the ids cancelled."""
        provider = self.ctx.provider_for(job)
        key = (job.job_id, c.index)
        done = self.ctx.schedule.dup_cancelled.setdefault(key, set())
        for b in extras:
            if b.is_terminal or b.status in ("cancelling", "cancelled") or b.id in done:
                continue
            log.error("job %s chunk %s: duplicate batch %s (late create); cancelling it", job.job_id, c.index, b.id)
            self.ctx.emit(job.job_id, _e("BatchCancelRequested", chunk=c.index, batch_id=b.id, reason="duplicate"))
            try:
                provider.cancel(b.id)
                done.add(b.id)
            except ProviderRejected as exc:  # ended meanwhile: nothing to cancel
                log.error("could not cancel duplicate batch %s: %s", b.id, exc)
            except ProviderError as exc:
                log.error("could not cancel duplicate batch %s (asked again at the next listing): %s", b.id, exc)
        return sorted(done)

    def check_duplicates(self, a: CheckDuplicates, job: JobState, now: float) -> None:
        """After a create that followed a failed or absent one of the same attempt, list by
        ``bg_key`` at once and every few seconds while the earlier request could still be carried
        out, cancelling any extra batch at once (never pay twice); the last listing (the watch's
        end, or forced before a terminal batch is collected) is recorded."""
        c = job.chunks[a.chunk]
        assert c.file_id and c.batch_id and c.dup_check_due
        key = (job.job_id, c.index)
        timeout = self.ctx.settings.request_timeout_seconds
        created = self.ctx.schedule.created_at.get(key)
        if created is not None:
            now, ends = self.ctx.mono_now(), duplicate_watch_ends(created, timeout)
        else:  # created before a restart: the log's time, on the wall clock
            now, ends = self.ctx.wall, duplicate_watch_ends(epoch(c.dup_check_due, self.ctx.wall), timeout)
        found = self.ctx.provider_for(job).find_batches(
            input_file_id=c.file_id,
            metadata={"bg_key": c.metadata.get("bg_key", "")},
            created_after=self._listing_floor(c),
        )
        extras = [b for b in found if b.id != c.batch_id]
        cancelled = self._cancel_duplicates(job, c, extras)
        pending = [
            b for b in extras if not b.is_terminal and b.status not in ("cancelling", "cancelled") and b.id not in cancelled
        ]
        again = duplicate_watch_next(now, ends, c.status in TERMINAL_BATCH, len(pending))
        if again is not None:
            self.ctx.schedule.dup_next[key] = self.ctx.mono + again
            return
        self.ctx.schedule.duplicates_checked(key)
        self.ctx.emit(
            job.job_id,
            _e(
                "DuplicateBatchesChecked",
                chunk=c.index,
                attempt=c.attempt,
                batch_id=c.batch_id,
                extras=[b.id for b in extras],
                cancelled=cancelled,
            ),
        )

    def cancel_batch(self, a: CancelBatch, job: JobState, now: float) -> None:
        """Cancel a running batch (asked once per tick: the next tick asks again), its intent
        (``BatchCancelRequested``) recorded before the cancel leaves; a straggler's first cancel
        (``a.reason``: its deadline nears) with ``StragglerCancelRequested`` in the same append."""
        c = job.chunks[a.chunk]
        intent = _e("BatchCancelRequested", chunk=a.chunk, batch_id=a.batch_id, reason="straggler" if a.reason else "cancelled")
        if a.reason and not c.straggler:
            straggler = _e(
                "StragglerCancelRequested",
                chunk=a.chunk,
                batch_id=a.batch_id,
                deadline_at=float(a.deadline_at or 0.0),
                margin_seconds=float(a.margin),
                reason=a.reason,
            )
            self.ctx.emit(job.job_id, straggler, intent)
            log.warning("job %s chunk %d: batch %s cancelled: %s", job.job_id, a.chunk, a.batch_id, a.reason)
        else:
            self.ctx.emit(job.job_id, intent)
        provider: Provider = self.ctx.provider_for(job)
        try:
            provider.cancel(a.batch_id)
        except ProviderRejected as exc:
            log.info("cancel %s: %s", a.batch_id, exc)  # already terminal: collected as usual
        except ProviderError as exc:  # asked once per tick: the next tick asks again
            log.warning("cancel %s: %s (asked again at the next tick)", a.batch_id, exc)
            return
        self.ctx.schedule.cancel_sent.add(a.batch_id)
        self.ctx.schedule.next_poll[(a.job_id, a.chunk)] = (self.ctx.mono, FIRST_POLL_DELAY)

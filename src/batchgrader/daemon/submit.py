"""Engine steps that send work: prepare (split into chunks), replan after a refusal, upload,
create the batch, reconcile an intent without an outcome, detect duplicates, cancel.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path
from typing import IO, Any, cast

from batchgrader.core import queue
from batchgrader.core.config import ConfigError
from batchgrader.core.decide import (
    FIRST_POLL_DELAY,
    CancelBatch,
    Upload,
    epoch,
    refusal_lesson,
)
from batchgrader.core.outcomes import ListAgain, create_not_listed, create_refused, duplicate_watch_next, queue_full_error
from batchgrader.core.settle import (
    CreateSent,
    create_settle_seconds,
    duplicate_watch_ends,
)
from batchgrader.core.state import TERMINAL_BATCH, ChunkState, JobState
from batchgrader.daemon.base import (
    CLOCK_SKEW_SLACK,
    _e,
    _lines,
    _status_event,
    chunk_custom_ids,
    result_settings,
)
from batchgrader.daemon.collect import CollectSteps
from batchgrader.daemon.finish import FinishSteps
from batchgrader.fsio import atomic_write
from batchgrader.pipeline.calibration import learned_overhead
from batchgrader.pipeline.prepare import ENDPOINT, oversized_positions, prepare
from batchgrader.pipeline.pricing import PricingError
from batchgrader.pipeline.splitting import Chunk, Limits, plan_chunks, request_custom_id, write_chunk_files
from batchgrader.pipeline.tables import InputError
from batchgrader.provider.protocol import OutcomeUnknown, ProviderError, ProviderRejected
from batchgrader.provider.reconcile import reconcile_batch, reconcile_upload

log = logging.getLogger("batchgrader.engine")


def input_error_for_user(exc: InputError, user_file: str) -> str:
    """An input error as the user should read it: named after their file (``reviews.csv``), not
    the daemon's work copy (``input.csv``)."""
    return str(InputError(user_file, exc.reason, exc.line, exc.column))


class _Heartbeat:
    """A file wrapper for prepare's output: each block written is a sign of life (the systemd
    watchdog heartbeat comes from the working thread, so a long prepare is not killed)."""

    def __init__(self, f: IO[bytes], beat: Callable[[], None]):
        self._f, self._beat = f, beat

    def write(self, data: bytes) -> int:
        self._beat()
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _write_arrays(f: Any, *arrays: array) -> None:
    for a in arrays:
        a.tofile(f)


def _token_sizes(path: Path, first: int, last: int | None) -> tuple[array, array]:
    """The token counts and sizes (tokens.bin: every row's tokens, then every row's sizes) of
    the rows ``first`` to ``last`` (None: to the end); only that range is read."""
    n = path.stat().st_size // 16
    last = n if last is None else min(last, n)
    tokens, sizes = array("Q"), array("Q")
    with open(path, "rb") as f:
        f.seek(first * 8)
        tokens.frombytes(f.read((last - first) * 8))
        f.seek((n + first) * 8)
        sizes.frombytes(f.read((last - first) * 8))
    return tokens, sizes


def _kept_lines(path: Path, keep: Iterable[int]) -> Iterable[bytes]:
    """The lines of ``path`` at the positions in ``keep`` (ascending)."""
    wanted = iter(keep)
    nxt = next(wanted, None)
    if nxt is None:
        return
    for pos, line in enumerate(_lines(path)):
        if pos == nxt:
            yield line
            nxt = next(wanted, None)
            if nxt is None:
                return


class SubmitSteps(CollectSteps, FinishSteps):
    # --- prepare ------------------------------------------------------------------------------
    def _prepare(self, job: JobState, now: float) -> None:
        job_dir = self.home.job_dir(job.job_id)
        try:
            profile = self.profile_of(job)
        except ConfigError as exc:
            return self._fail(
                job,
                "unknown_profile",
                str(exc),
                "Define the profile in config.yaml, then `bgctl retry " + job.job_id + "`.",
                "prepare",
                now,
            )
        try:
            self.prices.get(profile.model)  # fail fast: nothing is spent on an unpriced model
        except PricingError as exc:
            return self._fail(
                job,
                "missing_pricing",
                str(exc),
                "Add the model to pricing.csv in the home (or fix `model`), then `bgctl retry " + job.job_id + "`.",
                "prepare",
                now,
            )
        requests_path = job_dir / "requests.jsonl"
        probe = self._reuse_probe(job, profile, self.trusted_wall())  # retention: not by a clock stepped forward
        if probe is None:  # every row is sent (else the probe says so at the first row to send)
            self.on_rows_to_send(profile.provider)
        try:
            with open(requests_path, "wb") as f:
                prep = prepare(
                    Path(job.input_path),
                    profile,
                    self.home,
                    requests_out=cast(IO[bytes], _Heartbeat(f, self.on_progress)),
                    prices=self.prices,
                    file_hash=job.sha256,
                    limits=self._limits(profile),
                    reuse=probe,
                )
                f.flush()
                os.fsync(f.fileno())
        except InputError as exc:
            return self._fail(
                job,
                "bad_input",
                input_error_for_user(exc, job.file),
                "Fix the file and drop it in the inbox again.",
                "prepare",
                now,
            )
        except ConfigError as exc:
            return self._fail(
                job,
                "bad_config",
                str(exc),
                "Fix the configuration (bgctl config show), then `bgctl retry " + job.job_id + "`.",
                "prepare",
                now,
            )
        except UnicodeError as exc:
            return self._fail(
                job, "bad_input", f"{job.file}: {exc}", "Save the file as UTF-8 and drop it in the inbox again.", "prepare", now
            )
        counted = self._count_exact(profile, requests_path, prep)  # the provider's exact counts, if it has them
        sizes_path = job_dir / "tokens.bin"
        atomic_write(sizes_path, lambda f: _write_arrays(f, prep.tokens, prep.sizes))
        reuse = self._decide_reuse(job, profile, probe, prep)
        chunk_dir = job_dir / "chunks"
        if reuse is None:
            paths = write_chunk_files(_lines(requests_path), prep.chunks, oversized_positions(prep), chunk_dir, job.job_id)
        else:
            paths = write_chunk_files(_kept_lines(requests_path, reuse.keep), prep.chunks, set(), chunk_dir, job.job_id)
        summary = prep.summary(
            self.prices, learned_overhead(self.state, prep.model, profile.response_format, self.provider_key_for(job))
        )
        chunks = [
            {
                "index": c.index,
                "start": c.start,
                "end": c.end,
                "requests": c.requests,
                "input_tokens": c.input_tokens,
                "bytes": c.bytes,
                "path": str(p),
            }
            for c, p in zip(prep.chunks, paths)
        ]
        if not chunks and not prep.problems and not (reuse and reuse.cached):
            return self._fail(
                job, "empty_input", f"{job.file}: no rows to grade", "Add data rows and drop the file in again.", "prepare", now
            )
        self.emit(
            job.job_id,
            _e(
                "JobPrepared",
                format=prep.fmt,
                model=prep.model,
                encoding=prep.tokenizer.encoding,
                rows=prep.rows,
                requests=prep.requests,
                input_tokens=prep.input_tokens,
                max_request_tokens=prep.max_request_tokens,
                chunks=chunks,
                row_errors=[p.as_dict() for p in prep.problems],
                estimate_usd=summary["estimated_cost_usd"],
                warnings=prep.warnings,
                requests_path=str(requests_path),
                settings=result_settings(profile),
            ),
            *([_e("InputTokensCounted", **{**counted, "input_tokens": prep.input_tokens})] if counted else []),
            *self._reuse_events(job, reuse),
        )

    def _delete_refused_file(self, c: ChunkState) -> None:
        """The input file of a batch refused for the queue limit, or of a chunk uploaded ahead of
        queue room and never created, is deleted before its rows are sent again (a new upload, or
        new chunks) or given up, so it is never left at the provider.  Deleting is idempotent:
        after a crash it is simply done again."""
        refused_batch = c.failure is not None and c.failure.get("retryable")
        refused_create = c.upload == "done" and c.create == "failed"  # refused at once: no batch uses the file
        staged = c.staged and c.upload == "done"  # uploaded ahead of queue room, never created
        if refused_batch or refused_create or staged:
            self._delete_refused_file_of(c)

    def _delete_refused_file_of(self, c: ChunkState) -> None:
        if self.provider is None or not c.file_id:
            return
        try:
            self.provider.delete_file(c.file_id)
        except ProviderError as exc:
            log.info("could not delete refused batch file %s: %s", c.file_id, exc)

    def _replan(self, job: JobState, c: ChunkState, limit: int, exact: bool) -> None:
        """Split the rows of a chunk larger than the queue limit into chunks that fit.  A row
        that alone exceeds a stated limit fails (request_too_large); under an estimated one it
        is tried alone.  Retry counters do not move.  Chunk files first, then one append; a
        crash in between plans the same chunks again."""
        self._delete_refused_file(c)
        in_chunk = chunk_custom_ids(c)
        riders = self._riders(job, in_chunk)  # duplicates riding with their leader stay with it
        ids = set(self._sent_ids(job, in_chunk))
        del in_chunk
        # the chunk's lines are read twice (to plan, then to write), never held: a refused chunk
        # may be the whole file
        cids: list[str] = []
        positions, tokens, sizes = array("q"), array("Q"), array("Q")
        first, last = (c.start, c.end) if c.custom_ids is None else (0, None)
        tok_all, size_all = _token_sizes(self.home.job_dir(job.job_id) / "tokens.bin", first, last)
        requests_path = Path(job.requests_path or "")
        for pos, line in enumerate(islice(_lines(requests_path), first, last), start=first):
            cid = request_custom_id(line)
            if cid in ids:
                positions.append(pos)
                cids.append(cid)
                tokens.append(tok_all[pos - first])
                sizes.append(size_all[pos - first])
        del tok_all, size_all
        profile = self.profile_of(job)
        caps = Limits(
            token_limit=min(limit, profile.split_token_limit or limit),
            row_limit=profile.split_row_limit,
            max_requests=profile.max_requests_per_batch,
            max_bytes=profile.max_batch_bytes,
            token_limit_name="provider's enqueued-token limit",
        )
        chunks, over = plan_chunks(tokens, sizes, caps)
        base = max(job.chunks) + 1
        out_dir = self.home.job_dir(job.job_id) / "chunks"
        skip = {o.position for o in over}
        paths = write_chunk_files(_kept_lines(requests_path, positions), chunks, skip, out_dir, f"{job.job_id}-replan{base:04d}")
        new = [
            {
                "index": base + i,
                "custom_ids": [x for k in range(ch.start, ch.end) if k not in skip for x in (cids[k], *riders.get(cids[k], ()))],
                "requests": ch.requests,
                "input_tokens": ch.input_tokens,
                "bytes": ch.bytes,
                "path": str(p),
            }
            for i, (ch, p) in enumerate(zip(chunks, paths))
        ]
        if not exact and over:  # an estimated limit may be too low: each row over it goes alone
            singles = [
                Chunk(index=i, start=i, end=i + 1, requests=1, input_tokens=o.tokens, bytes=o.bytes) for i, o in enumerate(over)
            ]
            spaths = write_chunk_files(
                _kept_lines(requests_path, [positions[o.position] for o in over]),
                singles,
                set(),
                out_dir,
                f"{job.job_id}-replan{base:04d}-alone",
            )
            for o, ch, p in zip(over, singles, spaths):
                new.append(
                    {
                        "index": base + len(new),
                        "custom_ids": [cids[o.position], *riders.get(cids[o.position], ())],
                        "requests": 1,
                        "input_tokens": ch.input_tokens,
                        "bytes": ch.bytes,
                        "path": str(p),
                    }
                )
            over = []
        events = [
            _e(
                "ChunkReplanned",
                chunk=c.index,
                limit=limit,
                chunks=new,
                oversized=[{"custom_id": cids[o.position], "tokens": o.tokens} for o in over],
            )
        ]
        if over:
            rows = [
                {"custom_id": x, "code": "request_too_large", "message": o.reason + " (it can never be accepted)"}
                for o in over
                for x in (cids[o.position], *riders.get(cids[o.position], ()))
            ]
            events.append(_e("RowsFailed", chunk=c.index, batch_id=None, rows=rows))
        log.info(
            "job %s chunk %s: %s tokens over the queue limit %s; re-planned as %d chunks",
            job.job_id,
            c.index,
            f"{c.input_tokens:,}",
            f"{limit:,}",
            len(new),
        )
        self.emit(job.job_id, *events)

    # --- submit -------------------------------------------------------------------------------
    def _upload(self, job: JobState, c: ChunkState, a: Upload) -> None:
        assert self.provider is not None
        self._delete_refused_file(c)
        started = _e("UploadStarted", chunk=c.index, attempt=a.attempt, filename=a.filename, bytes=c.bytes)
        if a.ahead:  # one append: the upload is ahead of queue room from its intent on
            ahead = _e("UploadAheadPlanned", chunk=c.index, attempt=a.attempt, limit=a.limit, enqueued=a.enqueued)
            self.emit(job.job_id, started, ahead)
            log.info("job %s chunk %s: uploading ahead of queue room", job.job_id, c.index)
        else:
            self.emit(job.job_id, started)
        self._do_upload(job, job.chunks[c.index])

    def _do_upload(self, job: JobState, c: ChunkState) -> None:
        assert self.provider is not None and c.filename
        try:
            info = self.provider.upload(Path(c.path), c.filename)
        except ProviderRejected as exc:
            self.emit(job.job_id, _e("UploadFailed", chunk=c.index, attempt=c.attempt, error=str(exc), definite=True))
            self.emit(
                job.job_id,
                _e("ChunkFailed", chunk=c.index, batch_id=None, code="upload_rejected", error=str(exc), retryable=False),
            )
            self._rows_failed_for_chunk(job, job.chunks[c.index], "upload_rejected", str(exc))
            return
        except OutcomeUnknown as exc:
            log.warning("job %s chunk %s: upload outcome unknown (%s); reconciling", job.job_id, c.index, exc)
            self._reconcile_upload(job, c)
            return
        self.emit(job.job_id, _e("FileUploaded", chunk=c.index, attempt=c.attempt, file_id=info.id, reconciled=False))

    def _reconcile_upload(self, job: JobState, c: ChunkState) -> None:
        assert self.provider is not None and c.filename
        found = reconcile_upload(self.provider, c.filename, c.bytes)
        if found.file is not None:
            if found.duplicates:
                log.warning(
                    "job %s chunk %s: %d extra uploads of %s left at the provider",
                    job.job_id,
                    c.index,
                    len(found.duplicates),
                    c.filename,
                )
            self.emit(job.job_id, _e("FileUploaded", chunk=c.index, attempt=c.attempt, file_id=found.file.id, reconciled=True))
        else:
            self._do_upload(job, c)  # provably absent: uploading again is safe (files cost no tokens)

    def _metadata(self, job: JobState, c: ChunkState) -> dict[str, str]:
        return {
            "bg_job": job.job_id,
            "bg_chunk": str(c.index),
            "bg_attempt": str(c.attempt),
            "bg_key": f"{job.job_id}:{c.index}:{c.attempt}",
        }

    def _create(self, job: JobState, c: ChunkState) -> None:
        assert self.provider is not None and c.file_id
        self.emit(
            job.job_id,
            _e(
                "BatchCreateRequested", chunk=c.index, attempt=c.attempt, input_file_id=c.file_id, metadata=self._metadata(job, c)
            ),
        )
        self._do_create(job, job.chunks[c.index])

    def _do_create(self, job: JobState, c: ChunkState) -> None:
        assert self.provider is not None and c.file_id
        key = (job.job_id, c.index)
        sent = self.mono_now()  # when this request leaves (not when the tick began)
        self.schedule.requested_at[key] = sent
        try:
            b = self.provider.create_batch(c.file_id, ENDPOINT, self.settings.completion_window, dict(c.metadata))
        except ProviderRejected as exc:
            self.emit(job.job_id, _e("BatchCreateFailed", chunk=c.index, attempt=c.attempt, error=str(exc), definite=True))
            self._create_refused(job, c, exc)
            return
        except OutcomeUnknown as exc:
            # an error answer (5xx) was given by the provider: what it did is listed at once; no
            # reply (timeout, connection lost): it may still carry the request out a while later
            self.schedule.create_sent[key] = CreateSent(sent, self.mono_now(), answered=exc.status_code is not None)
            log.warning("job %s chunk %s: batch create outcome unknown (%s); reconciling", job.job_id, c.index, exc)
            self._reconcile_create(job, c)
            return
        self._batch_created(job, c, b, reconciled=False)

    def _create_refused(self, job: JobState, c: ChunkState, exc: ProviderRejected) -> None:
        """Carry out what a create refused at once means (:func:`~batchgrader.core.outcomes.create_refused`):
        a bad request fails the chunk; a queue refusal that teaches the limit records it; a rate
        limit, or a queue refusal that teaches nothing, waits (doubling per round, counted by this
        process); after ``QUEUE_FULL_ROUNDS`` rounds its rows fail as ``queue_full`` (``bgctl
        retry`` sends them again), so ``daemon --once`` ends."""
        key = (job.job_id, c.index)
        error, code = str(exc), getattr(exc, "code", None)
        learned = None
        if queue.is_token_limit_refusal(code, error):
            learned = refusal_lesson(self.state, job, c, error, self.queue_url_for(job))
        rounds = self.schedule.create_refusals.get(key, 0)
        outcome = create_refused(exc.status_code, code, error, learned, rounds, self.settings.poll_interval_seconds, self._mono)
        if outcome.kind == "wait":
            assert outcome.not_before is not None
            self.schedule.not_before[key] = outcome.not_before
            if outcome.rounds:
                self.schedule.create_refusals[key] = outcome.rounds
        elif outcome.kind == "learn":
            self.emit(job.job_id, *self._learned_event(job.model or "", outcome.learned, c.index, error, job))
        elif outcome.kind == "queue_full":
            self.schedule.create_refusals.pop(key, None)
            why = queue_full_error(outcome.rounds, error)
            self._delete_refused_file_of(c)
            self.emit(job.job_id, _e("ChunkFailed", chunk=c.index, batch_id=None, code="queue_full", error=why, retryable=False))
            self._rows_failed_for_chunk(job, job.chunks[c.index], "queue_full", why)
        else:
            self.emit(
                job.job_id,
                _e("ChunkFailed", chunk=c.index, batch_id=None, code="create_rejected", error=error, retryable=False),
            )
            self._rows_failed_for_chunk(job, job.chunks[c.index], "create_rejected", error)

    def _batch_created(self, job: JobState, c: ChunkState, b: Any, reconciled: bool) -> None:
        """Record a batch created (or adopted) for ``c``.  A batch the reply names ended (a
        provider that validates and runs it before replying, or a fast small batch) is read back
        at once for its result files: it is never collected from a create reply alone."""
        first_poll = self._mono if reconciled or b.is_terminal else self._mono + FIRST_POLL_DELAY
        self.schedule.batch_created((job.job_id, c.index), self.mono_now(), (first_poll, FIRST_POLL_DELAY))
        status = b.status if not reconciled else "validating"
        self.emit(
            job.job_id, _e("BatchCreated", chunk=c.index, attempt=c.attempt, batch_id=b.id, status=status, reconciled=reconciled)
        )
        c = self.state.jobs[job.job_id].chunks[c.index]
        if reconciled:  # the adopted batch may have moved on (even finished): record where it is
            ev = _status_event(c, b)
            if ev is not None:
                self.emit(job.job_id, ev)
        elif b.is_terminal:
            try:
                self._poll(job, c, self._mono)
            except ProviderError as exc:  # read back at the next tick (it is due now)
                log.warning("job %s chunk %s: reading back batch %s: %s", job.job_id, c.index, b.id, exc)

    def _create_request(self, job: JobState, c: ChunkState) -> tuple[CreateSent, bool]:
        """The open create of ``c`` as sent (monotonic, this process) or, after a restart, as the
        log has it (its wall-clock time; compared with the wall clock); and whether it is on the
        monotonic clock."""
        sent = self.schedule.create_sent.get((job.job_id, c.index))
        if sent is not None:
            return sent, True
        return CreateSent(min(epoch(c.requested_ts, self._wall), self._wall)), False

    def _listing_floor(self, c: ChunkState) -> int:
        """``created_after`` for a reconciliation listing: the intent's wall-clock time less the
        request timeout and the skew between our clock and the provider's."""
        requested = min(epoch(c.requested_ts, self._wall), self._wall)
        return int(requested - create_settle_seconds(self.config) - CLOCK_SKEW_SLACK)

    def _reconcile_create(self, job: JobState, c: ChunkState) -> None:
        assert self.provider is not None and c.file_id
        key = (job.job_id, c.index)
        if not self.schedule.listing_due(key, self._mono):
            return
        request, monotonic = self._create_request(job, c)
        now = self.mono_now() if monotonic else self._wall
        timeout = self.settings.request_timeout_seconds
        found = reconcile_batch(
            self.provider,
            c.file_id,
            {"bg_key": c.metadata.get("bg_key", "")},
            created_after=self._listing_floor(c),
        )
        keep = found.batch
        outcome = create_not_listed(request, timeout, now) if keep is None else None
        if isinstance(outcome, ListAgain):
            self.schedule.next_listing[key] = self._mono + outcome.seconds
            return  # a late create may still land: the outcome stays unknown, look again later
        if keep is not None:
            self._cancel_duplicates(job, c, list(found.duplicates))  # should never happen; never pay twice
            self._batch_created(job, c, keep, reconciled=True)
        else:
            self.schedule.create_settled(key)
            self.emit(
                job.job_id,
                _e(
                    "BatchCreateFailed",
                    chunk=c.index,
                    attempt=c.attempt,
                    error="not created (absent from the provider's batch list)",
                    definite=True,
                ),
            )
            # the file is uploaded: _submit creates again with it, under the same attempt's metadata

    def _cancel_duplicates(self, job: JobState, c: ChunkState, extras: list[Any]) -> list[str]:
        """Ask once each (no retries inside the tick: the next duplicate listing asks again) for
        the cancel of every extra batch of the chunk not ended; the ids cancelled."""
        assert self.provider is not None
        key = (job.job_id, c.index)
        done = self.schedule.dup_cancelled.setdefault(key, set())
        for b in extras:
            if b.is_terminal or b.status in ("cancelling", "cancelled") or b.id in done:
                continue
            log.error("job %s chunk %s: duplicate batch %s (late create); cancelling it", job.job_id, c.index, b.id)
            try:
                self.provider.cancel(b.id)
                done.add(b.id)
            except ProviderRejected as exc:  # ended meanwhile: nothing to cancel
                log.error("could not cancel duplicate batch %s: %s", b.id, exc)
            except ProviderError as exc:
                log.error("could not cancel duplicate batch %s (asked again at the next listing): %s", b.id, exc)
        return sorted(done)

    def _check_duplicates(self, job: JobState, c: ChunkState) -> None:
        """After a create that followed a failed or absent one of the same attempt, list by
        ``bg_key`` at once and every few seconds while the earlier request could still be carried
        out, cancelling any extra batch at once (never pay twice); the last listing (the watch's
        end, or forced before a terminal batch is collected) is recorded."""
        assert self.provider is not None and c.file_id and c.batch_id and c.dup_check_due
        key = (job.job_id, c.index)
        timeout = self.settings.request_timeout_seconds
        created = self.schedule.created_at.get(key)
        if created is not None:
            now, ends = self.mono_now(), duplicate_watch_ends(created, timeout)
        else:  # created before a restart: the log's time, on the wall clock
            now, ends = self._wall, duplicate_watch_ends(epoch(c.dup_check_due, self._wall), timeout)
        found = self.provider.find_batches(
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
            self.schedule.dup_next[key] = self._mono + again
            return
        self.schedule.duplicates_checked(key)
        self.emit(
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

    def _cancel_batch(self, a: CancelBatch, now: float) -> None:
        assert self.provider is not None
        try:
            self.provider.cancel(a.batch_id)
        except ProviderRejected as exc:
            log.info("cancel %s: %s", a.batch_id, exc)  # already terminal: collected as usual
        except ProviderError as exc:  # asked once per tick: the next tick asks again
            log.warning("cancel %s: %s (asked again at the next tick)", a.batch_id, exc)
            return
        self.schedule.cancel_sent.add(a.batch_id)
        self.schedule.next_poll[(a.job_id, a.chunk)] = (now, FIRST_POLL_DELAY)

"""The steps that collect what a batch gives back.

:class:`CollectStep`: the list round and polls (a batch its create reply names ended is read
back at once), downloads, merging a chunk's results into its rows, a failed batch's or an
unstartable chunk's rows failed, and row retries planned.

:class:`StragglersStep` (the rules: :mod:`batchgrader.core.rules.stragglers`): the rows of a batch
cancelled as its job's deadline nears, and a chunk its deadline leaves no time to batch, finished
through the synchronous route.

* the cancel itself is the submit step's (``CancelBatch``: one with a reason records
  ``StragglerCancelRequested`` before it leaves); the cancelled batch is polled, downloaded and
  merged as any other;
* :meth:`StragglersStep.plan` writes the rows its partial output did not answer as a chunk for
  the synchronous route (``RetryPlanned`` with ``route``: ``flex`` where the model has a flex
  tier, else ``online``);
* :meth:`StragglersStep.route` sends a chunk never sent the synchronous way (``ChunkRouted``);
* the online step sends such a chunk's rows (``SendStragglers``: intent ``OnlineRequestSent``
  before each request, ``OnlineRequestAnswered`` with its ``TokensUsed`` at the tier's price);
  once every row has its outcome, the chunk's results file is written (in the chunk's order, as a
  merged batch's) and ``RowsFailed`` / ``ChunkCompleted`` recorded, so the result file takes the
  answers like a retry chunk's.
"""

from __future__ import annotations

import logging
from typing import Any

from batchgrader.core.configuration.config import ConfigError
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import TERMINAL_BATCH, ChunkState, JobState
from batchgrader.core.rules.actions import (
    Create,
    Download,
    FailBatch,
    FailUnstarted,
    Merge,
    PlanRetries,
    PlanStragglers,
    Poll,
    RouteChunk,
)
from batchgrader.core.rules.decide import epoch, list_round_due, probe_after_completion, token_cap, utc_day
from batchgrader.core.rules.outcomes import (
    DownloadRetry,
    batch_status_event,
    download_failed,
    download_may_start,
    malformed_download_again,
    merge_in_worker,
)
from batchgrader.core.rules.polling import next_poll_delay, progress_left
from batchgrader.core.rules.stragglers import straggler_rows
from batchgrader.daemon.context import Context
from batchgrader.pipeline.calibration import overhead_payload
from batchgrader.pipeline.chunkplan import retry_chunks
from batchgrader.pipeline.merge import MergeInputs, MergeOutcome, MergeWorkerFailed, cache_figures, merge_chunk
from batchgrader.pipeline.outputschema import schema_of
from batchgrader.pipeline.pricing import PricingError, has_flex
from batchgrader.provider.protocol import Provider, ProviderError, ProviderRejected
from batchgrader.provider.reconcile import list_statuses

log = logging.getLogger("batchgrader.engine")


class CollectStep:
    """Bring results back, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._merge_here: set[tuple[str, int]] = set()  # chunks whose merge worker failed

    def list_round(self, now: float) -> None:
        """With several batches in flight, one paged ``batches.list`` per provider and poll round
        replaces a ``retrieve`` per batch (when :func:`list_round_due`); every batch in flight is
        refreshed (``now``: the monotonic clock)."""
        if not list_round_due(self.ctx.state, self.ctx.timers(), now):
            return
        by_provider: dict[int, tuple[Provider, list[tuple[JobState, ChunkState]]]] = {}
        for j in self.ctx.state.active_jobs():
            if self.ctx.left_alone_because(j) is not None:  # another mode's or endpoint's batches are not asked for here
                continue
            flying = [c for c in j.chunks.values() if c.in_flight and c.batch_id]
            if flying:
                try:
                    provider = self.ctx.provider_for(j)
                except (ConfigError, ProviderError):  # polled one by one, where the job's error is reported
                    continue
                by_provider.setdefault(id(provider), (provider, []))[1].extend((j, c) for c in flying)
        for provider, chunks in by_provider.values():
            try:
                listed = list_statuses(provider, {c.batch_id for _, c in chunks if c.batch_id})
            except ProviderError as exc:
                log.warning("listing batches: %s (polling them one by one)", exc)
                continue
            for j, c in chunks:
                b = listed.get(c.batch_id or "")
                if b is not None:
                    self._poll(j, c, now, b)

    def poll(self, a: Poll, job: JobState, now: float) -> None:
        self._poll(job, job.chunks[a.chunk], self.ctx.mono)

    def read_back(self, a: Create, job: JobState, now: float) -> None:
        """A batch its create reply names ended (a provider that validates and runs it before
        replying, or a fast small batch) is read back at once for its result files: it is never
        collected from a create reply alone."""
        c = self.ctx.state.jobs[job.job_id].chunks[a.chunk]
        if not c.batch_id or c.read_back or c.status not in TERMINAL_BATCH:
            return
        try:
            self._poll(job, c, self.ctx.mono)
        except ProviderError as exc:  # read back at the next tick (it is due now)
            log.warning("job %s chunk %s: reading back batch %s: %s", job.job_id, c.index, c.batch_id, exc)

    def _poll(self, job: JobState, c: ChunkState, now: float, b: Any = None) -> None:
        """Refresh one batch (``b``: as a list round saw it; else one ``retrieve``) and set when it
        is polled next (:mod:`batchgrader.core.rules.polling`: a fraction of its age, and just after the
        time batches of its model have been taking)."""
        assert c.batch_id
        key = (job.job_id, c.index)
        due, delay = self.ctx.schedule.next_poll.get(key, (now, 0.0))
        if b is None:
            b = self.ctx.provider_for(job).retrieve(c.batch_id)
        ev = batch_status_event(c, b)
        was = c.status  # read before emit folds the new status into c
        if ev is not None:
            self.ctx.emit(job.job_id, ev)
        # when it was asked for (``now`` is monotonic): this process's stamp, or the log's
        # (BatchCreateRequested, wall clock) after a restart
        created = now - self._create_age(key, c)
        # run times are learned per provider (and sandbox) and model
        model = f"{self.ctx.provider_key_for(job)} {job.model or ''}"
        if b.status == "completed" and was != "completed":
            if b.created_at and b.completed_at and b.completed_at >= b.created_at:
                took = float(b.completed_at - b.created_at)  # the provider's own clock, to the second
            else:  # it ended between the last poll (still running then) and this one: the middle of that
                took = (min(due - delay, now) + now) / 2 - created
            self.ctx.schedule.durations.record(model, took)
        expected = self.ctx.schedule.durations.expected(model)
        left = None if expected is None else created + expected - now
        ahead = self._progress_left(key, b, now)
        if ahead is not None:  # this batch's own progress says more than batches before it
            left = ahead
        delay = next_poll_delay(now - created, self.ctx.settings.poll_interval_seconds, left)
        self.ctx.schedule.next_poll[key] = (now + delay, delay)

    def _create_age(self, key: tuple[str, int], c: ChunkState) -> float:
        """Seconds since the chunk's batch was asked for: on the monotonic clock when this
        process sent it, else from the log's wall-clock time of the request."""
        sent = self.ctx.schedule.requested_at.get(key)
        if sent is not None:
            return max(0.0, self.ctx.mono - sent)
        return max(0.0, self.ctx.wall - epoch(c.requested_ts, self.ctx.wall))

    def _progress_left(self, key: tuple[str, int], b: Any, now: float) -> float | None:
        """Seconds until the batch's requests are all done, at the rate they were done since we
        first saw some done (:func:`progress_left`); None while that is not known.  Once every
        request is done (``finalizing``, or all counted), the end is due: minus the time since
        that was first seen, so the batch is polled soon, then less and less often."""
        counts = b.request_counts
        done = counts.completed + counts.failed
        if b.status == "finalizing" or (b.status == "in_progress" and counts.total and done >= counts.total):
            return -(now - self.ctx.schedule.finalizing.setdefault(key, now))
        if b.status != "in_progress" or not done:
            if b.is_terminal:
                self.ctx.schedule.progress.pop(key, None)
                self.ctx.schedule.finalizing.pop(key, None)
            return None
        first = self.ctx.schedule.progress.get(key)
        if first is None or done < first[1]:
            self.ctx.schedule.progress[key] = (now, done)
            return None
        return progress_left(first, (now, done), counts.total)

    def download(self, a: Download, job: JobState, now: float) -> bool:
        """Download one result file: one intent per download (not per tick), a pause between
        failures, and after ``MAX_DOWNLOAD_ATTEMPTS`` failures or a definite refusal (404: the file
        expired or was deleted) an ``OutputDownloadFailed``: its rows then fail with the reason and
        the job can finish.  True when the file is settled (downloaded or given up)."""
        c, kind, file_id, now = job.chunks[a.chunk], a.kind, a.file_id, self.ctx.mono
        key = (job.job_id, c.index, kind)
        failures = self.ctx.schedule.download_failures.get(key)
        if not download_may_start(failures, now):
            return False
        tries = failures[0] if failures else 0
        d = c.downloads.get(kind, {})
        if d.get("state") != "started" or d.get("file_id") != file_id:
            self.ctx.emit(job.job_id, _e("OutputDownloadStarted", chunk=c.index, batch_id=c.batch_id, file_id=file_id, kind=kind))
        dest = self.ctx.home.job_dir(job.job_id) / "downloads" / f"{c.batch_id}-{kind}.jsonl"
        try:
            n = self.ctx.provider_for(job).download(file_id, dest)
        except (ProviderError, OSError) as exc:
            definite = isinstance(exc, ProviderRejected)  # definite (404: expired or deleted; 403 ...): never comes back
            outcome = download_failed(tries, definite, now)
            if isinstance(outcome, DownloadRetry):
                log.warning("job %s chunk %s: download of %s failed (%s); trying again later", job.job_id, c.index, file_id, exc)
                self.ctx.schedule.download_failures[key] = (outcome.tries, outcome.at)
                return False
            if definite:
                msg = f"the {kind} file cannot be downloaded: {exc}"
            else:
                msg = f"the {kind} file could not be downloaded after {outcome.attempts} attempts: {exc}"
            self._download_failed(job, c, kind, file_id, msg, outcome.attempts)
            return True
        self.ctx.schedule.download_failures.pop(key, None)
        self.ctx.emit(
            job.job_id,
            _e("OutputDownloaded", chunk=c.index, batch_id=c.batch_id, file_id=file_id, kind=kind, path=str(dest), bytes=n),
        )
        return True

    def _download_failed(self, job: JobState, c: ChunkState, kind: str, file_id: str, error: str, attempts: int) -> None:
        self.ctx.schedule.download_failures.pop((job.job_id, c.index, kind), None)
        log.error("job %s chunk %s: %s", job.job_id, c.index, error)
        self.ctx.emit(
            job.job_id,
            _e(
                "OutputDownloadFailed",
                chunk=c.index,
                batch_id=c.batch_id,
                file_id=file_id,
                kind=kind,
                error=error,
                attempts=attempts,
            ),
        )

    def _merge_inputs(self, job: JobState, c: ChunkState) -> MergeInputs:
        done = [(k, d) for k in ("output", "error") if (d := c.downloads.get(k)) and d.get("path") and d.get("state") == "done"]
        return MergeInputs(
            files=tuple((k, str(d["path"])) for k, d in done),
            custom_ids=None if c.custom_ids is None else tuple(c.custom_ids),
            requests_path=c.path,
            status=c.status,
            results_path=self.ctx.outbox.results_path(job, c),
            unavailable=tuple(str(d.get("error")) for d in c.downloads.values() if d.get("state") == "failed"),
            malformed_downloads=c.malformed_downloads,
            download_malformed_again=malformed_download_again(c.malformed_downloads),
            followers=self.ctx.reuse.followers_of(job),
            schema=schema_of(job.settings.get("response_format")),  # as prepared
            line_schemas=bool(job.settings.get("schema_column")),  # each row's own schema, as its request carried it
        )

    def merge(self, a: Merge, job: JobState, now: float) -> None:
        """Merge a finished batch's rows (:func:`~batchgrader.pipeline.merge.merge_chunk`); its
        events (and the answers they record) go in one transaction.  A chunk of at least
        ``merge_worker_rows`` rows is merged in a worker process (:mod:`batchgrader.daemon.workers`)
        while the daemon goes on: this step starts it, and records its outcome on the first tick
        after it ended (if the worker fails, the chunk is merged here, and so are its later tries).  A malformed file is
        downloaded again (at most MAX_MALFORMED_DOWNLOADS times); then its good lines are kept."""
        c = job.chunks[a.chunk]
        key = (job.job_id, c.index)
        workers, at_least = self.ctx.merge_workers, self.ctx.settings.merge_worker_rows
        if workers is not None and workers.running(key):
            try:
                outcome = workers.poll(key)
            except MergeWorkerFailed as exc:
                log.warning("job %s chunk %s: %s; merging in the daemon", job.job_id, c.index, exc)
                self._merge_here.add(key)  # from now on (if this merge fails too, it is retried here)
                outcome = merge_chunk(self._merge_inputs(job, c))
            if outcome is not None:  # else still merging: the worker wakes the daemon when it ends
                self._merged(job, c, outcome, now)
            return
        inputs = self._merge_inputs(job, c)
        if workers is not None and merge_in_worker(c.requests, at_least, True, key in self._merge_here):
            try:
                workers.start(key, inputs, self.ctx.home.job_dir(job.job_id) / "merging")
                return
            except MergeWorkerFailed as exc:
                log.warning("job %s chunk %s: %s; merging in the daemon", job.job_id, c.index, exc)
                self._merge_here.add(key)
        self._merged(job, c, merge_chunk(inputs), now)

    def _merged(self, job: JobState, c: ChunkState, outcome: MergeOutcome, now: float) -> None:
        """Record a chunk's merge (``outcome``): ask for a malformed file again, or the chunk's
        usage, failed rows and completion."""
        if outcome.merged is None:
            log.warning("job %s chunk %s: malformed result file (%s); downloading it again", job.job_id, c.index, outcome.problem)
            self.ctx.emit(
                job.job_id,
                _e(
                    "OutputFileMalformed",
                    chunk=c.index,
                    batch_id=c.batch_id,
                    kinds=list(outcome.bad_kinds),
                    lines=outcome.malformed_lines,
                    problem=outcome.problem,
                ),
            )
            return
        merged = outcome.merged
        try:
            cost = merged.cost(self.ctx.prices.get(job.model or ""))
        except PricingError:
            cost = 0.0
        events = [
            _e(
                "TokensUsed",
                chunk=c.index,
                batch_id=c.batch_id,
                model=job.model,
                cost_usd=float(cost),
                day=utc_day(now),
                **merged.usage,
                **cache_figures(merged, self.ctx.prices.find(job.model or "")),
            )
        ]
        learned = overhead_payload(
            job, c, merged.rows, merged.all_ok, merged.usage["prompt_tokens"], self.ctx.profile_of(job).response_format
        )
        if learned is not None:
            events.append(_e("SchemaOverheadLearned", **learned))
        dup_failed = merged.duplicates_failed
        if merged.failed_rows or dup_failed:
            events.append(_e("RowsFailed", chunk=c.index, batch_id=c.batch_id, rows=[*merged.failed_rows, *dup_failed]))
        if merged.duplicates:
            events.append(
                _e(
                    "DuplicatesAnswered",
                    chunk=c.index,
                    rows=merged.duplicates,
                    succeeded=merged.duplicates - len(dup_failed),
                    saved_usd=self.ctx.cost(job.model or "", merged.duplicates_usage),
                )
            )
        events.append(
            _e(
                "ChunkCompleted",
                chunk=c.index,
                batch_id=c.batch_id,
                status=c.status,
                succeeded=merged.succeeded + merged.duplicates - len(dup_failed),
                failed=len(merged.failed_rows) + len(dup_failed),
                results_path=self.ctx.outbox.results_path(job, c),
            )
        )
        if c.status == "completed":
            probe = probe_after_completion(self.ctx.state, job, self.ctx.queue_url_for(job))
            events += self.ctx.learned_event(job.model or "", probe, c.index, None, job)
        if merged.succeeded and self.ctx.settings.cache_days > 0:  # stored later (StoreAnswers), off the results' path
            events.append(_e("AnswersToStore", chunk=c.index, rows=merged.rows, answers=merged.succeeded))
        self.ctx.emit(job.job_id, *events)

    def fail_batch(self, a: FailBatch, job: JobState, now: float) -> None:
        """A batch that failed: record why (and what it taught of the queue limit); a retryable one
        waits ``retry_delay``, the rows of one that is not fail."""
        ctx = self.ctx
        if a.code in ("request_too_large", "queue_full"):  # refused for the queue limit: its file is not sent again
            ctx.delete_refused_file(job, job.chunks[a.chunk], refused=True)
        ctx.emit(
            job.job_id,
            *ctx.learned_event(job.model or "", a.learned, a.chunk, a.message, job),
            _e("ChunkFailed", chunk=a.chunk, batch_id=a.batch_id, code=a.code, error=a.error, retryable=a.retryable),
        )
        if a.retryable:
            if a.retry_delay:
                ctx.schedule.not_before[(job.job_id, a.chunk)] = ctx.mono + a.retry_delay
        else:
            ctx.rows_failed(job, job.chunks[a.chunk], a.code, a.error)

    def fail_unstarted(self, a: FailUnstarted, job: JobState, now: float) -> None:
        """A chunk that can never be started: its file (uploaded ahead of queue room) is not left
        behind, its rows fail."""
        self.ctx.delete_refused_file(job, job.chunks[a.chunk])
        self.ctx.emit(job.job_id, _e("ChunkFailed", chunk=a.chunk, batch_id=None, code=a.code, error=a.error, retryable=False))
        self.ctx.rows_failed(job, job.chunks[a.chunk], a.code, a.row_message)

    # --- retrying -------------------------------------------------------------------------------
    def plan_retries(self, a: PlanRetries, job: JobState, now: float) -> None:
        """Write the retry chunks of the failed rows and record them (``RetryPlanned``)."""
        profile = self.ctx.profile_of(job)
        cap = token_cap(self.ctx.state, self.ctx.config, profile, job.model or profile.model, self.ctx.queue_url_for(job))
        planned = retry_chunks(
            job, list(a.custom_ids), profile, cap, self.ctx.reuse.followers_of(job), self.ctx.home.job_dir(job.job_id)
        )
        self.ctx.emit(job.job_id, *[_e("RetryPlanned", **p) for p in planned])


class StragglersStep:
    """A straggler's rows planned for the synchronous route, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def _tier(self, job: JobState) -> str:
        """The synchronous route a straggler's rows take: flex where the model has it, else online."""
        return "flex" if has_flex(self.ctx.profile_of(job), self.ctx.prices) else "online"

    def plan(self, a: PlanStragglers, job: JobState, now: float) -> None:
        """The rows a cancelled straggler's output did not answer, as a chunk for the synchronous route."""
        ids = straggler_rows(job, job.chunks[a.chunk])
        if not ids:
            return
        ctx = self.ctx
        profile = ctx.profile_of(job)
        cap = token_cap(ctx.state, ctx.config, profile, job.model or profile.model, ctx.queue_url_for(job))
        planned = retry_chunks(
            job, ids, profile, cap, ctx.reuse.followers_of(job), ctx.home.job_dir(job.job_id), route=self._tier(job)
        )
        ctx.emit(job.job_id, *[_e("RetryPlanned", **p) for p in planned])

    def route(self, a: RouteChunk, job: JobState, now: float) -> None:
        """A chunk never sent, its deadline too near for a batch: its rows take the synchronous
        route (sent by ``SendStragglers`` as a straggler's)."""
        tier = self._tier(job)
        self.ctx.emit(
            job.job_id,
            _e(
                "ChunkRouted",
                chunk=a.chunk,
                route=tier,
                deadline_at=float(a.deadline_at),
                margin_seconds=float(a.margin),
                reason=a.reason,
            ),
        )
        log.warning("job %s chunk %d: sent %s, not in a batch: %s", job.job_id, a.chunk, tier, a.reason)

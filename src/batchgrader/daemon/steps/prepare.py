"""The prepare step: prepare a job (read the input, count, apply reuse, split into chunk files,
``JobPrepared``), and re-plan a chunk refused for the queue limit (``ChunkReplanned``).  What a
job cannot be prepared for is recorded (``PrepareFailed``); the rules end it (core/rules/ending.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

from batchgrader.core.configuration.config import ConfigError, Profile
from batchgrader.core.host.heap import trim_heap
from batchgrader.core.log.answer_sources import ANSWERED_IN_JOB, DUPLICATE
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import Action, Replan
from batchgrader.core.rules.decide import epoch
from batchgrader.core.rules.stragglers import deadline_of
from batchgrader.daemon.context import Context
from batchgrader.fsio import atomic_write, atomic_write_bytes
from batchgrader.pipeline.calibration import learned_overhead
from batchgrader.pipeline.chunkplan import prepared_chunks, replan_chunk, write_token_sizes
from batchgrader.pipeline.job_reuse import answered_first, decide_reuse, reuse_probe
from batchgrader.pipeline.outbox import result_settings
from batchgrader.pipeline.prepare import prepare, unsent_positions
from batchgrader.pipeline.pricing import PricingError
from batchgrader.pipeline.reuse import ReusePlan
from batchgrader.pipeline.tables import InputError
from batchgrader.store.eventstore import NewEvent

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

    def flush(self) -> None:
        self._f.flush()


class PrepareStep:
    """Prepare a job, re-plan a refused chunk; over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def _cannot_prepare(self, job: JobState, code: str, error: str, hint: str) -> None:
        """Record why the job cannot be prepared; the rules end it (core/rules/ending.py)."""
        self.ctx.emit(job.job_id, _e("PrepareFailed", code=code, error=error, hint=hint))

    def prepare(self, a: Action, job: JobState, now: float) -> None:
        """Prepare ``job`` (its chunks written and planned, or it fails for its input), then give
        the memory the counting threads freed back to the system (:mod:`batchgrader.core.host.heap`)."""
        try:
            self._prepare(job, now)
        finally:
            trim_heap()

    def _prepare(self, job: JobState, now: float) -> None:
        ctx = self.ctx
        job_dir = ctx.home.job_dir(job.job_id)
        try:
            profile = ctx.profile_of(job)
        except ConfigError as exc:
            return self._cannot_prepare(
                job, "unknown_profile", str(exc), "Define the profile in config.yaml, then `bgctl retry " + job.job_id + "`."
            )
        try:
            ctx.prices.get(profile.model)  # fail fast: nothing is spent on an unpriced model
        except PricingError as exc:
            return self._cannot_prepare(
                job,
                "missing_pricing",
                str(exc),
                "Add the model to pricing.csv in the home (or fix `model`), then `bgctl retry " + job.job_id + "`.",
            )
        requests_path = job_dir / "requests.jsonl"
        key = ctx.provider_key_for(job)

        def on_send() -> None:  # the provider is built (its SDK imported) in the background from the first row to send on
            ctx.providers.prefetch(profile.provider)

        probe = reuse_probe(job, profile, key, ctx.stored_answers(profile, ctx.trusted_wall()), on_send)
        # its route's answers (and refusals) by row, whatever the settings now
        probe = answered_first(probe, job, key, on_send)
        if probe is None:  # every row is sent (else the probe says so at the first row to send)
            on_send()
        try:
            with open(requests_path, "wb") as f:
                prep = prepare(
                    Path(job.input_path),
                    profile,
                    ctx.home,
                    requests_out=cast(IO[bytes], _Heartbeat(f, ctx.on_progress)),
                    prices=ctx.prices,
                    file_hash=job.sha256,
                    limits=ctx.limits(profile),
                    reuse=probe,
                )
                f.flush()
                os.fsync(f.fileno())
        except InputError as exc:
            return self._cannot_prepare(
                job, "bad_input", input_error_for_user(exc, job.file), "Fix the file and drop it in the inbox again."
            )
        except ConfigError as exc:
            return self._cannot_prepare(
                job, "bad_config", str(exc), "Fix the configuration (bgctl config show), then `bgctl retry " + job.job_id + "`."
            )
        except UnicodeError as exc:
            return self._cannot_prepare(
                job, "bad_input", f"{job.file}: {exc}", "Save the file as UTF-8 and drop it in the inbox again."
            )
        counted = self._count_exact(profile, requests_path, prep)  # the provider's exact counts, if it has them
        atomic_write(job_dir / "tokens.bin", lambda f: write_token_sizes(f, prep.tokens, prep.sizes))
        reuse = decide_reuse(probe, prep, ctx.split_limits(profile))
        keep = None if reuse is None else reuse.keep
        chunks = prepared_chunks(prep, requests_path, keep, unsent_positions(prep), job_dir / "chunks", job.job_id)
        summary = prep.summary(ctx.prices, learned_overhead(ctx.state, prep.model, profile.response_format, key))
        if not chunks and not prep.problems and not (reuse and reuse.cached):
            return self._cannot_prepare(
                job, "empty_input", f"{job.file}: no rows to grade", "Add data rows and drop the file in again."
            )
        ctx.emit(
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
                **_deadline(job, profile.get("deadline"), now),
                **({"text_encoding": prep.text_encoding} if prep.text_encoding else {}),
                **({"empty_rows": prep.empty_rows} if prep.empty_rows else {}),
            ),
            *([_e("InputTokensCounted", **{**counted, "input_tokens": prep.input_tokens})] if counted else []),
            *self._reuse_events(job, profile, reuse),
        )

    def _count_exact(self, profile: Profile, requests_path: Path, prep: Any) -> dict[str, Any] | None:
        """The counting hook at planning: exact counts for a provider without a public tokenizer
        (``InputTokensCounted``), or None for one whose local count is exact."""
        from batchgrader.provider.counting import (
            DAEMON_MAX_UNCACHED,
            OFFLINE_EXACT,
            CountCache,
            counter_for,
            plan_with_exact_counts,
        )
        from batchgrader.provider.protocol import ProviderError

        if profile.provider in OFFLINE_EXACT:
            return None
        ctx = self.ctx
        try:
            counter = ctx.token_counter(profile) if ctx.token_counter is not None else counter_for(profile.provider, profile)
        except ProviderError as exc:
            log.warning("no token counting for %s: %s", profile.provider, exc)
            counter = None
        cache = CountCache.of_home(ctx.home) if counter is not None else None
        try:
            return plan_with_exact_counts(
                prep,
                requests_path,
                profile.provider,
                counter,
                cache,
                ctx.split_limits(profile),
                max_uncached=DAEMON_MAX_UNCACHED,
                progress=ctx.on_progress,
            )
        finally:
            if cache is not None:
                cache.close()

    def _reuse_events(self, job: JobState, profile: Profile, plan: ReusePlan | None) -> list[NewEvent]:
        """Write the per-row decision file, and the event that records it (appended with JobPrepared)."""
        if plan is None:
            return []
        path = self.ctx.home.job_dir(job.job_id) / "results" / "reused.jsonl"
        atomic_write_bytes(path, b"".join(plan.lines()))
        self.ctx.reuse.remember(job.job_id, plan)
        u = dict(plan.cached_usage)
        for _cid, a in plan.cached:  # the preflight's rows were paid for (PreflightPassed): nothing saved
            if a.ts in ANSWERED_IN_JOB:
                for k in u:
                    u[k] -= int(getattr(a, k))
        return [
            _e(
                "RequestsReused",
                cached_rows=len(plan.cached),
                duplicate_rows=len(plan.followers),
                copied_rows=sum(1 for _cid, a in plan.cached if a.ts == DUPLICATE),
                saved_usd=self.ctx.cost(profile.model, u),
                usage=dict(u),
                path=str(path),
            )
        ]

    def replan(self, a: Replan, job: JobState, now: float) -> None:
        """Split the rows of a chunk larger than the queue limit into chunks that fit
        (:func:`~batchgrader.pipeline.chunkplan.replan_chunk`).  A row that alone exceeds a
        stated limit fails (request_too_large); under an estimated one it is tried alone.  Retry
        counters do not move.  Chunk files first, then one append; a crash in between plans the
        same chunks again."""
        c = job.chunks[a.chunk]
        self.ctx.delete_refused_file(job, c)
        planned = replan_chunk(
            job,
            c,
            a.limit,
            a.exact,
            self.ctx.profile_of(job),
            self.ctx.reuse.followers_of(job),
            self.ctx.home.job_dir(job.job_id),
        )
        events = [_e("ChunkReplanned", chunk=c.index, limit=a.limit, chunks=planned.chunks, oversized=planned.oversized)]
        if planned.failed:
            events.append(_e("RowsFailed", chunk=c.index, batch_id=None, rows=planned.failed))
        log.info(
            "job %s chunk %s: %s tokens over the queue limit %s; re-planned as %d chunks",
            job.job_id,
            c.index,
            f"{c.input_tokens:,}",
            f"{a.limit:,}",
            len(planned.chunks),
        )
        self.ctx.emit(job.job_id, *events)


def _deadline(job: JobState, value: str | None, now: float) -> dict[str, float]:
    """``JobPrepared.deadline_at``: when the job is due, fixed at its preparation (none: absent)."""
    due = deadline_of(value, epoch(job.created_ts, now), now)
    return {} if due is None else {"deadline_at": due}

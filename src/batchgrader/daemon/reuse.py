"""Engine steps for answer reuse: the reuse decision at prepare time, its events, the
duplicate rows (followers) of a job, and the answers a merged chunk adds to the store.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from batchgrader.core.answer_sources import ANSWERED_IN_JOB, DUPLICATE, PREFLIGHT
from batchgrader.core.config import Profile
from batchgrader.core.decide import reuse_enabled
from batchgrader.core.state import ChunkState, JobState
from batchgrader.daemon.base import _e, _lines
from batchgrader.daemon.context import Context
from batchgrader.fsio import atomic_write_bytes
from batchgrader.pipeline.answerkey import line_keys
from batchgrader.pipeline.merge import riders, sent_ids
from batchgrader.pipeline.prepare import unsent_positions
from batchgrader.pipeline.reuse import ReusePlan, ReuseProbe, read_reuse_file, replan
from batchgrader.pipeline.splitting import Limits
from batchgrader.store import answers
from batchgrader.store.eventstore import NewEvent

log = logging.getLogger("batchgrader.engine")


class ReuseSteps:
    """The answer-reuse steps, on the shared :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._followers: dict[str, dict[str, list[str]]] = {}  # job -> leader -> duplicates
        self.answered: dict[str, Any] = {}  # job -> its ReusePlan, when no row is left to send

    def reuse_probe(self, job: JobState, profile: Profile, now: float) -> ReuseProbe | None:
        """What decides, while the job's rows are prepared, which need no request: rows whose
        request key has a stored answer, and rows identical to an earlier row of the file
        (one batched lookup per block of rows; those rows are not token-counted).  None when
        every row is sent."""
        preflighted = preflight_answers(job)
        provider = profile.provider
        on_send = lambda: self.ctx.on_rows_to_send(provider)  # noqa: E731
        if not reuse_enabled(job, profile):
            if not preflighted:
                return None

            def preflight_only(keys: Any) -> dict[str, Any]:
                return {k: preflighted[k] for k in keys if k in preflighted}

            return ReuseProbe(self.ctx.provider_key_for(job), preflight_only, dedupe=False, on_send=on_send)
        conn = self.ctx.store.conn

        def lookup(keys: Any) -> dict[str, Any]:
            found = answers.lookup(
                conn, keys, now=now, keep_days=profile.cache_days, allow_truncated=profile.reuse_truncated_answers
            )
            found.update({k: preflighted[k] for k in keys if k in preflighted})  # this job's own answers first
            return found

        return ReuseProbe(self.ctx.provider_key_for(job), lookup, on_send=on_send)

    def send_probe(self, job: JobState, profile: Profile, now: float) -> ReuseProbe | None:
        """What tells the preflight, as it reads the rows, which of them prepare would send: the
        rows :meth:`reuse_probe` leaves to send (no usable stored answer, not identical to an
        earlier row), except that a row the job's own preflight answered stays one of them (its
        answer, stored too, must not make the preflight take a further row).  None when every
        row is sent (reuse off: no stored answer, no duplicate taken out)."""
        if not reuse_enabled(job, profile):
            return None
        own = {a["key"] for a in job.preflight_answers}
        conn = self.ctx.store.conn

        def lookup(keys: Any) -> dict[str, Any]:
            found = answers.lookup(
                conn, keys, now=now, keep_days=profile.cache_days, allow_truncated=profile.reuse_truncated_answers
            )
            return {k: a for k, a in found.items() if k not in own}

        return ReuseProbe(self.ctx.provider_key_for(job), lookup)

    def decide_reuse(self, job: JobState, profile: Profile, probe: ReuseProbe | None, prep: Any) -> ReusePlan | None:
        """The reuse plan of a prepared job; None when every row is sent.  When some rows are
        answered already, ``prep.chunks`` is planned again over the rows still to send."""
        if probe is None:
            return None
        plan = probe.finish(unsent_positions(prep))
        if not plan.reused:
            return None
        plan.cached = [(cid, _as_copy(cid, a)) for cid, a in plan.cached]
        limits = self.ctx.limits(profile) or Limits.from_settings(profile, self._context_window(profile))
        prep.chunks = replan(prep.tokens, prep.sizes, plan.keep, limits)
        return plan

    def count_exact(self, profile: Profile, requests_path: Path, prep: Any) -> dict[str, Any] | None:
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
        try:
            counter = (
                self.ctx.token_counter(profile) if self.ctx.token_counter is not None else counter_for(profile.provider, profile)
            )
        except ProviderError as exc:
            log.warning("no token counting for %s: %s", profile.provider, exc)
            counter = None
        limits = self.ctx.limits(profile) or Limits.from_settings(profile, self._context_window(profile))
        cache = CountCache.of_home(self.ctx.home) if counter is not None else None
        try:
            return plan_with_exact_counts(
                prep,
                requests_path,
                profile.provider,
                counter,
                cache,
                limits,
                max_uncached=DAEMON_MAX_UNCACHED,
                progress=self.ctx.on_progress,
            )
        finally:
            if cache is not None:
                cache.close()

    def _context_window(self, profile: Profile) -> int | None:
        if profile.context_window is not None:
            return profile.context_window
        price = self.ctx.prices.find(profile.model)
        return price.context_window if price else None

    def reuse_events(self, job: JobState, plan: ReusePlan | None) -> list[NewEvent]:
        """Write the per-row decision file, and the event that records it (appended with JobPrepared)."""
        if plan is None:
            return []
        path = self.ctx.home.job_dir(job.job_id) / "results" / "reused.jsonl"
        atomic_write_bytes(path, b"".join(plan.lines()))
        # what this process reads back from that file, kept: the duplicates (small), and a job
        # answered entirely (its result is written at once, without reading the file again)
        followers: dict[str, list[str]] = {}
        for cid, leader in plan.followers.items():
            followers.setdefault(leader, []).append(cid)
        self._followers[job.job_id] = followers
        if plan.keep:
            self.answered.pop(job.job_id, None)
        else:
            self.answered[job.job_id] = plan
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
                saved_usd=self.ctx.cost(self.ctx.profile_of(job).model, u),
                usage=dict(u),
                path=str(path),
            )
        ]

    def followers_of(self, job: JobState) -> dict[str, list[str]]:
        """leader custom_id -> the duplicate rows that take its answer (from the reuse file)."""
        if not job.duplicate_rows or not job.reuse_path:
            return {}
        got = self._followers.get(job.job_id)
        if got is None:
            got = self._followers[job.job_id] = read_reuse_file(Path(job.reuse_path))[1]
        return got

    def riders(self, job: JobState, ids: Sequence[str]) -> dict[str, list[str]]:
        """Of ``ids``, the duplicates that ride with their leader (:func:`~batchgrader.pipeline.merge.riders`)."""
        return riders(ids, self.followers_of(job))

    def sent_ids(self, job: JobState, ids: list[str]) -> list[str]:
        """``ids`` without the duplicates that ride with their leader."""
        return sent_ids(ids, self.followers_of(job))

    def store_answers(self, job: JobState, c: ChunkState, now: float) -> None:
        """Store a merged chunk's successful answers (``AnswersToStore``), recorded by
        ``AnswersStored`` in the same transaction.  Done after the job's result file is written,
        so storing never delays the results; after a crash in between it is simply done again
        (a stored answer is never duplicated).  A results file that cannot be read stores
        nothing, says why, and lets the job end."""
        rows, path = c.answers_due or 0, Path(c.results_path or "")
        keep_days = self.ctx.settings.cache_days

        def put(conn: Any) -> None:
            if keep_days > 0:
                # the retention's clock never runs ahead of the monotonic one (a forward step purges nothing)
                answers.put(conn, self._answers_to_store(job, c, path, rows), now=self.ctx.trusted_wall(), keep_days=keep_days)

        try:
            self.ctx.emit(job.job_id, _e("AnswersStored", chunk=c.index, error=None), also=put)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # the transaction was rolled back
            error = f"the chunk's results could not be read: {exc}"
            log.warning("job %s chunk %s: answers not stored: %s", job.job_id, c.index, error)
            self.ctx.emit(job.job_id, _e("AnswersStored", chunk=c.index, error=error))

    def _answers_to_store(self, job: JobState, c: ChunkState, results_path: Path, rows: int) -> Iterator[dict[str, Any]]:
        """The successful, complete answers of a merged chunk, by request key, one at a time: the
        chunk's request lines and the first ``rows`` lines of its results file (the same rows in the
        same order) are read side by side."""
        provider = self.ctx.provider_key_for(job)
        with open(results_path, "rb") as results:
            pairs = zip(line_keys(provider, _lines(Path(c.path))), islice(results, rows))
            for (cid, key), raw in pairs:
                r = json.loads(raw)
                if r["custom_id"] != cid:  # not in one order (never expected): match the rest by custom id
                    yield from self._answers_by_id(job, c, results_path, rows, provider)
                    return
                if _storable(r):
                    yield _answer_row(job, c, provider, key, r)

    def _answers_by_id(
        self, job: JobState, c: ChunkState, results_path: Path, rows: int, provider: str
    ) -> Iterator[dict[str, Any]]:
        with open(results_path, "rb") as results:
            ok = {r["custom_id"]: r for r in map(json.loads, islice(results, rows)) if _storable(r)}
        for cid, key in line_keys(provider, _lines(Path(c.path))):
            if cid in ok:
                yield _answer_row(job, c, provider, key, ok[cid])


def preflight_answers(job: JobState) -> dict[str, answers.StoredAnswer]:
    """The answers of the job's passed preflight, and those of its synchronous route
    (daemon/online.py, marked with the route), by request key, as stored answers: prepare takes
    them like answers from the answers store, so those rows are not sent in a batch."""
    found = {a["key"]: _in_job(job, a, PREFLIGHT) for a in job.preflight_answers}
    found.update({a["key"]: _in_job(job, a, a["tier"]) for a in job.online.answers.values()})
    return found


def _as_copy(cid: str, a: Any) -> Any:
    """An answer the job paid for itself (its preflight's, its synchronous route's) taken for
    another row than its own (a row identical to it): a duplicate (``answered_by: duplicate``,
    its tokens not billed again, counted as saved), not a second row answered and billed."""
    if a.ts in ANSWERED_IN_JOB and a.custom_id != cid and not a.error_code:
        return dataclasses.replace(a, ts=DUPLICATE)
    return a


def _in_job(job: JobState, a: dict[str, Any], how: str) -> answers.StoredAnswer:
    """An answer this job paid for itself, as a stored answer (``how``: preflight, flex or online;
    with its code when it is not usable)."""
    return answers.StoredAnswer(
        a["key"],
        a["content"],
        a.get("finish_reason"),
        int(a["prompt_tokens"]),
        int(a["cached_tokens"]),
        int(a["completion_tokens"]),
        int(a["reasoning_tokens"]),
        job.job_id,
        a["custom_id"],
        how,
        a.get("error_code"),
        a.get("error_message"),
    )


def _storable(r: dict[str, Any]) -> bool:
    return bool(r["ok"] and isinstance(r.get("content"), str) and r.get("status_code") == 200)


def _answer_row(job: JobState, c: ChunkState, provider: str, key: str, r: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": key,
        "provider": provider,
        "model": job.model or "",
        "content": r["content"],
        "finish_reason": r.get("finish_reason"),
        "prompt_tokens": int(r.get("prompt_tokens") or 0),
        "cached_tokens": int(r.get("cached_tokens") or 0),
        "completion_tokens": int(r.get("completion_tokens") or 0),
        "reasoning_tokens": int(r.get("reasoning_tokens") or 0),
        "job_id": job.job_id,
        "custom_id": r["custom_id"],
        "batch_id": c.batch_id,
    }

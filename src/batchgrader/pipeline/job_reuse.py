"""A job's answer reuse as the daemon's steps ask for it: the probes prepare and the preflight
read the rows with, the answers the job paid for itself before it was prepared, the reuse plan of
a prepared job, and the answers a merged chunk adds to the store.

Pure apart from the files it reads: the stored answers come through the ``lookup`` the caller
gives (the answers store's, :mod:`batchgrader.store.answers`, over the daemon's connection).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import Profile
from batchgrader.core.log.answer_sources import ANSWERED_IN_JOB, DUPLICATE, PREFLIGHT
from batchgrader.core.log.route_state import refused_rows
from batchgrader.core.log.state import ChunkState, JobState
from batchgrader.core.rules.decide import reuse_enabled
from batchgrader.pipeline.answerkey import line_keys
from batchgrader.pipeline.chunkplan import lines
from batchgrader.pipeline.prepare import unsent_positions
from batchgrader.pipeline.reuse import Lookup, ReusePlan, ReuseProbe, StoredAnswer, read_reuse_file, replan
from batchgrader.pipeline.splitting import Limits


def reuse_probe(
    job: JobState, profile: Profile, provider_key: str, lookup: Lookup, on_send: Callable[[], None]
) -> ReuseProbe | None:
    """What decides, while the job's rows are prepared, which need no request: rows whose request
    key has a stored answer (``lookup``), rows the job answered itself (its preflight, its
    synchronous route), and rows identical to an earlier row of the file.  None when every row is
    sent.  ``on_send``: called at the first row to send."""
    own = paid_in_job(job)
    if not reuse_enabled(job, profile):
        if not own:
            return None

        def own_only(keys: Sequence[str]) -> dict[str, Any]:
            return {k: own[k] for k in keys if k in own}

        return ReuseProbe(provider_key, own_only, dedupe=False, on_send=on_send)

    def stored_or_own(keys: Sequence[str]) -> dict[str, Any]:
        found = lookup(keys)
        found.update({k: own[k] for k in keys if k in own})  # this job's own answers first
        return found

    return ReuseProbe(provider_key, stored_or_own, on_send=on_send)


def send_probe(
    job: JobState, profile: Profile, provider_key: str, lookup: Lookup, on_send: Callable[[], None] | None = None
) -> ReuseProbe | None:
    """What tells the preflight, as it reads the rows, which of them prepare would send: the rows
    :func:`reuse_probe` leaves to send, except that a row the job's own preflight answered stays
    one of them (its answer, stored too, must not make the preflight take a further row).  None
    when every row is sent (reuse off)."""
    if not reuse_enabled(job, profile):
        return None
    own = {a["key"] for a in job.preflight_answers}

    def stored(keys: Sequence[str]) -> dict[str, Any]:
        return {k: a for k, a in lookup(keys).items() if k not in own}

    return ReuseProbe(provider_key, stored, on_send=on_send)


def decide_reuse(probe: ReuseProbe | None, prep: Any, limits: Limits) -> ReusePlan | None:
    """The reuse plan of a prepared job; None when every row is sent.  When some rows are answered
    already, ``prep.chunks`` is planned again (within ``limits``) over the rows still to send."""
    if probe is None:
        return None
    plan = probe.finish(unsent_positions(prep))
    if not plan.reused:
        return None
    plan.cached = [(cid, _as_copy(cid, a)) for cid, a in plan.cached]
    prep.chunks = replan(prep.tokens, prep.sizes, plan.keep, limits)
    return plan


def paid_in_job(job: JobState) -> dict[str, StoredAnswer]:
    """The answers of the job's passed preflight, and those of its synchronous route (marked with
    the route), by request key, as stored answers: prepare takes them like answers from the store,
    so those rows are not sent in a batch."""
    found = {a["key"]: _in_job(job, a, PREFLIGHT) for a in job.preflight_answers}
    found.update({a["key"]: _in_job(job, a, a["tier"]) for a in job.online.answers.values()})
    return found


def _as_copy(cid: str, a: Any) -> Any:
    """An answer the job paid for itself taken for another row than its own (a row identical to
    it): a duplicate (``answered_by: duplicate``, its tokens not billed again, counted as saved),
    not a second row answered and billed."""
    if a.ts in ANSWERED_IN_JOB and a.custom_id != cid and not a.error_code:
        return dataclasses.replace(a, ts=DUPLICATE)
    return a


def _in_job(job: JobState, a: dict[str, Any], how: str) -> StoredAnswer:
    """An answer this job paid for itself, as a stored answer (``how``: preflight, flex or online;
    with its code when it is not usable)."""
    return StoredAnswer(
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


class _AnsweredFirst(ReuseProbe):
    """A :class:`ReuseProbe` that keys a row the job's preflight or synchronous route answered with
    the key it was answered under: a settings edit (prompt, model, output bound) after it was
    answered changes the request prepare builds for it, but the row is answered and paid for, so
    it is taken, never sent again in a batch.  A row the provider refused for good is taken the
    same way, as a failed answer with the refusal's code and message (``refused``)."""

    def __init__(
        self,
        provider: str,
        lookup: Lookup | None,
        dedupe: bool,
        on_send: Callable[[], None] | None,
        pinned: dict[str, str],
        refused: dict[str, Any],
    ) -> None:
        def with_refused(keys: Sequence[str]) -> dict[str, Any]:
            # a refused row's key is ours alone: never asked of the answers store (PostgreSQL's
            # text refuses its NUL byte)
            found = lookup([k for k in keys if k not in refused]) if lookup is not None else {}
            found.update({k: refused[k] for k in keys if k in refused})
            return found

        super().__init__(provider, with_refused, dedupe, on_send)
        self.pinned = pinned

    def _keys(
        self, lines: Sequence[bytes], cids: Sequence[str] | None = None, contents: Sequence[str] | None = None
    ) -> list[tuple[str, str]]:
        pinned = self.pinned
        return [(cid, pinned.get(cid, key)) for cid, key in super()._keys(lines, cids, contents)]


def answered_first(probe: ReuseProbe | None, job: JobState, provider: str, on_send: Callable[[], None]) -> ReuseProbe | None:
    """The prepare step's reuse probe for ``job``: the rows its preflight or its synchronous route
    answered are found by their custom id (their answer's key), not by the request the settings
    build now (a config edit after they were paid for never sends them again), and so are the rows
    the provider refused for good (they fail with the refusal).  ``provider``/``on_send``: the
    probe's, for a job whose rows would all be sent otherwise."""
    pinned = {str(a["custom_id"]): str(a["key"]) for a in job.preflight_answers}
    pinned.update({cid: str(a["key"]) for cid, a in job.online.answers.items()})
    refused: dict[str, Any] = {}
    tier = job.online.route or "online"
    for cid in refused_rows(job):
        f = job.failed_rows[cid]
        key = pinned[cid] = f"refused\x00{cid}"  # never a request's key (those are hex digests)
        refused[key] = StoredAnswer(key, "", None, 0, 0, 0, 0, job.job_id, cid, tier, str(f["code"]), str(f["message"]))
    if not pinned:
        return probe
    if probe is None:
        return _AnsweredFirst(provider, None, False, on_send, pinned, refused)
    return _AnsweredFirst(probe.provider, probe.lookup, probe.dedupe, probe.on_send, pinned, refused)


def answers_to_store(job: JobState, c: ChunkState, provider: str, results_path: Path, rows: int) -> Iterator[dict[str, Any]]:
    """The successful, complete answers of a merged chunk, by request key, one at a time: the
    chunk's request lines and the first ``rows`` lines of its results file (the same rows in the
    same order) are read side by side."""
    with open(results_path, "rb") as results:
        pairs = zip(line_keys(provider, lines(Path(c.path))), islice(results, rows))
        for (cid, key), raw in pairs:
            r = json.loads(raw)
            if r["custom_id"] != cid:  # not in one order (never expected): match the rest by custom id
                yield from _answers_by_id(job, c, results_path, rows, provider)
                return
            if _storable(r):
                yield _answer_row(job, c, provider, key, r)


def _answers_by_id(job: JobState, c: ChunkState, results_path: Path, rows: int, provider: str) -> Iterator[dict[str, Any]]:
    with open(results_path, "rb") as results:
        ok = {r["custom_id"]: r for r in map(json.loads, islice(results, rows)) if _storable(r)}
    for cid, key in line_keys(provider, lines(Path(c.path))):
        if cid in ok:
            yield _answer_row(job, c, provider, key, ok[cid])


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


class ReuseFiles:
    """What this process read of each job's reuse file (``results/reused.jsonl``): the duplicate
    rows of each leader (small), and the plan of a job answered entirely (its result is written
    at once, without reading the file again)."""

    def __init__(self) -> None:
        self._followers: dict[str, dict[str, list[str]]] = {}  # job -> leader -> duplicates
        self._answered: dict[str, ReusePlan] = {}  # job -> its plan, when no row is left to send

    def remember(self, job_id: str, plan: ReusePlan) -> None:
        """The plan just recorded for ``job_id`` (its reuse file written)."""
        followers: dict[str, list[str]] = {}
        for cid, leader in plan.followers.items():
            followers.setdefault(leader, []).append(cid)
        self._followers[job_id] = followers
        if plan.keep:
            self._answered.pop(job_id, None)
        else:
            self._answered[job_id] = plan

    def followers_of(self, job: JobState) -> dict[str, list[str]]:
        """leader custom_id -> the duplicate rows that take its answer (from the reuse file)."""
        if not job.duplicate_rows or not job.reuse_path:
            return {}
        got = self._followers.get(job.job_id)
        if got is None:
            got = self._followers[job.job_id] = read_reuse_file(Path(job.reuse_path))[1]
        return got

    def take_answered(self, job_id: str) -> ReusePlan | None:
        """The plan of a job answered entirely, prepared in this process (once), else None."""
        return self._answered.pop(job_id, None)

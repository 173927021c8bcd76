"""The preflight step: a few of its requests through the provider's
synchronous API, with exactly the bodies its batches would carry, before it is prepared into
batches.

The preflight's rows are the first ``preflight_rows`` requests prepare would actually send
(:meth:`PreflightStep.rows`): a row with a usable stored answer, a row identical to an earlier
one of the file, and a row prepare would fail alone as ``request_too_large`` are left out; with
nothing left to send there is no preflight.  The input is opened through prepare's own checks
(:func:`~batchgrader.pipeline.input_checks.open_checked`: sheet, required columns, label and group
columns) and each row read is checked as prepare checks it (its id, its label), so a file prepare
refuses fails the job (at prepare, with its own code) before anything is paid.

Intent -> call -> outcome, the rows together: every row's ``PreflightRequested`` (that row,
stamped before any request leaves), then the rows' ``complete`` calls at once (at most
:data:`PREFLIGHT_WORKERS` in flight; the provider object is shared, its SDK client is thread-safe),
then, once every call has returned, each row's outcome in row order:

* ``PreflightRowAnswered`` (with a ``TokensUsed`` of chunk -1 at the standard price, and the
  answer put in the answers store, in the same transaction): the row is answered and paid for,
  and never sent again, whatever the other rows met.  When the job is prepared these answers are
  taken like answers from the answers store (:func:`~batchgrader.pipeline.job_reuse.paid_in_job`),
  so those rows are not sent in a batch;
* a definite failure: a refusal (4xx other than 429), an answer that is ``truncated``,
  ``refused``, ``invalid_output`` or ``unexpected_finish`` (billed: its ``TokensUsed`` is
  recorded), a request the client would not send (``request_not_sent``: a parameter the SDK
  refuses, a missing key), an answer that cannot be read (``malformed_result``);
* a transient error (connection, timeout, lost reply, 5xx, 429).

Then the preflight's own outcome, after the rows' answers, by this rule:

* any row failed definitely: ``PreflightFailed`` naming the first such row in row order (the
  ``TokensUsed`` of every paid failure beside it), and the job fails with ``preflight_failed``
  (error report, input moved to failed/, ``JobFailed``).  A definite failure wins over a
  transient error on another row: sent one row at a time, the transient row would have been
  sent again and the refused row refused again, so the job ended the same way, one backoff later;
* else any row met a transient error: ``PreflightUnreachable`` naming the first such row; the
  rows not answered yet are sent again no earlier than the longest Retry-After those rows were
  given (a row given none: the backoff,
  :func:`~batchgrader.core.rules.preflight_rules.preflight_delay`); the reason is the job's last
  error meanwhile (``bgctl status``).  After
  :data:`~batchgrader.core.rules.preflight_rules.PREFLIGHT_MAX_ATTEMPTS` tries that met only
  transient errors: ``PreflightFailed``;
* else (every row answered): ``PreflightPassed``.

A synchronous request has no record at the provider to reconcile with, so a daemon killed
between a row's ``PreflightRequested`` and its outcome (after the intents, before the outcomes:
every row of that try) sends that row again on restart, once: a row left so a second time is not
sent again by the preflight (it goes in a batch).
An unknown profile, a missing price or input prepare refuses are left to prepare, which fails the
job for them with their own codes.  A job with no row to send in a preflight has none: the
dispatch table then prepares it at once.

The job's provider is built (its SDK imported, its client made) in the background from the
first row to send on, while the rest of the preflight's rows are read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import ConfigError, Profile
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import Action
from batchgrader.core.rules.decide import utc_day
from batchgrader.core.rules.preflight_rules import PREFLIGHT_MAX_ATTEMPTS, preflight_delay
from batchgrader.daemon.context import Context
from batchgrader.pipeline.answerkey import line_keys
from batchgrader.pipeline.input_checks import open_checked
from batchgrader.pipeline.job_reuse import send_probe
from batchgrader.pipeline.merge import outcome_record
from batchgrader.pipeline.prepare import request_lines
from batchgrader.pipeline.pricing import PricingError, billed_cost, standard_price
from batchgrader.pipeline.requests import RequestBuilder
from batchgrader.pipeline.results import parse_line
from batchgrader.pipeline.rowschema import request_schema
from batchgrader.pipeline.sync_lines import oversized_lines
from batchgrader.pipeline.tables import InputError
from batchgrader.provider.protocol import (
    RETRYABLE_STATUSES,
    OutcomeUnknown,
    Provider,
    ProviderRejected,
    ProviderUnavailable,
)
from batchgrader.store.eventstore import NewEvent

log = logging.getLogger("batchgrader.engine")

USAGE = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
FIRST_BLOCK = 16  # request lines read before the first look-up (then 4 times more each time, at most 4096)
PREFLIGHT_WORKERS = 8  # the preflight's requests in flight at once, at most (preflight_rows may ask for more rows)


def fix_for(code: str, job_id: str) -> str:
    """What to do about a preflight that failed with a row ``code``."""
    retry = f"then `bgctl retry {job_id}` runs the preflight again"
    if code == "truncated":
        return f"Raise max_completion_tokens in the profile (reasoning models spend output tokens on reasoning), {retry}."
    if code == "refused":
        return f"Change the prompts so the model answers them, {retry}."
    if code == "invalid_output":
        return f"Check the profile's response_format schema and the prompts, {retry}."
    if code == "unexpected_finish":
        return f"See the provider's documentation of that finish reason, {retry}."
    if code in ("unreachable", "rate_limited"):
        return f"Check the network and the provider's status and rate limits (`bgctl doctor`), {retry}."
    if code == "request_not_sent":
        return f"The provider's client refused to send the request: fix the setting it names (model, parameters, key) in config.yaml, {retry}."
    return f"Fix the setting the provider names (model, parameters, key, deployment) in config.yaml, {retry}."


def transient(exc: ProviderRejected) -> bool:
    """A refusal that means "not now": 429 (and 408, 409), or a 5xx."""
    return exc.retryable or exc.status_code in RETRYABLE_STATUSES or exc.status_code >= 500


@dataclass(frozen=True)
class RowOutcome:
    """What one preflight row's call came to: ``answered`` (``answer`` and ``usage`` set),
    ``failed`` (a definite failure: ``code``, ``error``) or ``transient`` (``code``, ``error``,
    ``retry_after``); ``paid``: its ``TokensUsed`` (an answer, or a billed answer not usable)."""

    custom_id: str
    kind: str  # answered | failed | transient
    code: str = ""
    error: str = ""
    retry_after: float | None = None
    answer: Mapping[str, Any] | None = None
    usage: Mapping[str, int] | None = None
    cost: float = 0.0
    paid: NewEvent | None = None


def call_all(provider: Provider, lines: Sequence[Mapping[str, Any]], job_id: str) -> list[Any]:
    """Each line's ``provider.complete`` reply, or the exception it raised, in the lines' order;
    the calls in flight together (at most :data:`PREFLIGHT_WORKERS`)."""

    def one(line: Mapping[str, Any]) -> Any:
        try:
            return provider.complete(line, job_id)
        except Exception as exc:  # noqa: BLE001 - classified by the caller, in the tick's thread
            return exc

    if len(lines) <= 1:
        return [one(line) for line in lines]
    with ThreadPoolExecutor(max_workers=min(len(lines), PREFLIGHT_WORKERS), thread_name_prefix="preflight") as pool:
        return list(pool.map(one, lines))


class PreflightStep:
    """The preflight step, over the :class:`~batchgrader.daemon.context.Context`; a failed
    preflight is recorded (``PreflightFailed``), and the rules end the job (core/rules/ending.py)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def run(self, a: Action, job: JobState, now: float) -> bool:
        """Send the rows of ``job``'s preflight not answered yet, and record each outcome (see
        the module docstring); False when the job has no preflight (no row to send)."""
        try:
            profile = self.ctx.profile_of(job)
            self.ctx.prices.get(profile.model)
            lines = self.rows(job, profile)
        except (ConfigError, InputError, PricingError, UnicodeError, OSError):
            lines = []  # prepare fails the job for it, with its own code, before anything is paid
        job = self.ctx.state.jobs[job.job_id]
        if not lines and not job.preflight_answers:  # nothing to send: no preflight
            return False
        self._send(job, profile, lines, now)
        return True

    def _send(self, job: JobState, profile: Profile, lines: list[bytes], now: float) -> None:
        keys = dict(line_keys(self.ctx.provider_key_for(job), lines))
        answered = {(a["custom_id"], a["key"]) for a in job.preflight_answers}  # the same request answered: never paid again
        given_up = job.preflight_open & job.preflight_resent  # left without an outcome twice by a crash
        todo = [json.loads(raw) for raw, row in zip(lines, keys.items()) if row not in answered and row[0] not in given_up]
        attempt = job.preflight_attempts + 1
        outcomes: list[RowOutcome] = []
        if todo:
            provider = self.ctx.provider_for(job)
            intents = [_e("PreflightRequested", rows=[str(line["custom_id"])], attempt=attempt) for line in todo]
            self.ctx.emit(job.job_id, *intents)  # every row's intent, before any request leaves
            replies = call_all(provider, todo, job.job_id)
            outcomes = [self._outcome(profile, line, keys, got, now) for line, got in zip(todo, replies)]
        for o in outcomes:  # every answer paid for is kept, in row order, whatever the other rows met
            if o.kind == "answered":
                assert o.answer is not None and o.usage is not None and o.paid is not None
                self.ctx.on_progress()
                self.ctx.emit(
                    job.job_id,
                    _e("PreflightRowAnswered", **o.answer, **o.usage, cost_usd=o.cost),
                    o.paid,
                    also=self._store(job, profile, {**o.answer, **o.usage}),
                )
        failed = [o for o in outcomes if o.kind == "failed"]
        transient_rows = [o for o in outcomes if o.kind == "transient"]
        if failed:  # a definite failure wins over a transient error (see the module docstring)
            paid = [o.paid for o in failed if o.paid is not None]
            return self._failed(job, failed[0].custom_id, failed[0].code, failed[0].error, now, *paid)
        if transient_rows:
            first = transient_rows[0]
            wait = max(o.retry_after if o.retry_after is not None else preflight_delay(attempt) for o in transient_rows)
            return self._unreachable(job, first.custom_id, first.code, first.error, wait, attempt, now)
        self._passed(job, profile.model)

    def _outcome(self, profile: Profile, line: Mapping[str, Any], keys: Mapping[str, str], got: Any, now: float) -> RowOutcome:
        """What one row's reply (or the exception its call raised) comes to (see the module docstring)."""
        cid = str(line["custom_id"])
        if isinstance(got, ProviderRejected):
            if transient(got):
                code = "rate_limited" if got.status_code == 429 else "unreachable"
                return RowOutcome(cid, "transient", code, str(got), got.retry_after)
            return RowOutcome(cid, "failed", str(got.code or f"http_{got.status_code}"), str(got))
        if isinstance(got, (OutcomeUnknown, ProviderUnavailable)):
            return RowOutcome(cid, "transient", "unreachable", str(got), getattr(got, "retry_after", None))
        if isinstance(got, Exception):  # the client would not send it (TypeError, ValueError, the SDK's own)
            return RowOutcome(cid, "failed", "request_not_sent", f"{type(got).__name__}: {got}")
        try:
            rec = outcome_record(parse_line(got), request_schema(profile, line["body"]))
        except Exception as exc:  # noqa: BLE001 - an answer that cannot be read is not retried (it was paid)
            return RowOutcome(cid, "failed", "malformed_result", f"the answer could not be read: {exc}")
        usage = {k: int(rec.get(k) or 0) for k in USAGE}
        cost = self._cost(profile.model, usage)
        used = _e("TokensUsed", chunk=-1, batch_id=None, model=profile.model, cost_usd=cost, day=utc_day(now), **usage)
        if not rec["ok"]:  # paid for, not usable: its cost recorded with the failure, and the job fails
            return RowOutcome(cid, "failed", str(rec["error_code"]), str(rec["error_message"]), paid=used)
        answer = {
            "custom_id": cid,
            "key": keys[cid],
            "content": rec.get("content") or "",
            "finish_reason": rec.get("finish_reason"),
        }
        return RowOutcome(cid, "answered", answer=answer, usage=usage, cost=cost, paid=used)

    def rows(self, job: JobState, profile: Profile) -> list[bytes]:
        """The request lines of the job's preflight: the first ``preflight_rows`` requests prepare
        would send (those of rows the preflight answered already included).  Raises what prepare
        raises for the rows read (:func:`~batchgrader.pipeline.input_checks.open_checked`,
        :func:`~batchgrader.pipeline.prepare.request_lines`)."""
        n = int(profile.preflight_rows or 0)
        if n <= 0:
            return []
        path = Path(job.input_path)
        builder = RequestBuilder(profile, self.ctx.home, job.sha256)

        def on_send() -> None:  # the job's provider is built in the background from its first row to send on
            self.ctx.providers.prefetch(profile.provider)

        lookup = self.ctx.stored_answers(profile, self.ctx.trusted_wall())
        probe = send_probe(job, profile, self.ctx.provider_key_for(job), lookup, on_send)
        if probe is None:
            on_send()
        limits = self.ctx.split_limits(profile)
        out: list[bytes] = []
        size = FIRST_BLOCK
        try:
            with open_checked(path, profile, builder) as reader:
                lines = request_lines(path, profile, builder, reader, job.sha256)
                while len(out) < n:
                    block = list(islice(lines, size))
                    if not block:
                        break
                    send = probe.block(block) if probe is not None else [True] * len(block)
                    sendable = [line for line, s in zip(block, send) if s]
                    too_large = oversized_lines(sendable, profile, limits)  # failed alone by prepare: not sent here
                    out += [line for i, line in enumerate(sendable) if i not in too_large][: n - len(out)]
                    size = min(4096, 4 * size)
        finally:
            if probe is not None:
                probe.finish(())  # its temporary table of keys closed
        return out

    def _cost(self, model: str, usage: dict[str, int]) -> float:
        try:
            price = standard_price(self.ctx.prices.get(model))
        except PricingError:
            return 0.0
        return float(billed_cost(price, usage["prompt_tokens"], usage["cached_tokens"], usage["completion_tokens"]))

    def _store(self, job: JobState, profile: Profile, answer: dict[str, Any]) -> Any:
        """Put one preflight answer in the answers store, in the transaction of its event, for
        later jobs (nothing when ``cache_days`` is 0)."""
        keep_days = self.ctx.settings.cache_days
        if keep_days <= 0:
            return None
        row = {
            **answer,
            "provider": self.ctx.provider_key_for(job),
            "model": profile.model,
            "job_id": job.job_id,
            "batch_id": None,
        }
        when = self.ctx.trusted_wall()  # retention: not by a clock stepped forward

        store = self.ctx.store.answers

        def put(conn: Any) -> None:
            store.put(conn, [row], now=when, keep_days=keep_days)

        return put

    def _passed(self, job: JobState, model: str) -> None:
        answers = list(self.ctx.state.jobs[job.job_id].preflight_answers)
        usage = {k: sum(int(a[k]) for a in answers) for k in USAGE}
        cost = self._cost(model, usage)  # each row's cost is in its own TokensUsed already
        self.ctx.emit(job.job_id, _e("PreflightPassed", answers=answers, cost_usd=cost))
        log.info("job %s: preflight passed (%d rows, $%.6f at the standard price)", job.job_id, len(answers), cost)

    def _failed(self, job: JobState, custom_id: str, code: str, message: str, now: float, *paid: NewEvent) -> None:
        hint = fix_for(code, job.job_id)
        self.ctx.emit(job.job_id, *paid, _e("PreflightFailed", custom_id=custom_id, row_code=code, error=message, hint=hint))
        log.warning("job %s: preflight failed on row %s: %s: %s", job.job_id, custom_id, code, message)
        # the rules end the job (core/rules/ending.py: its PreflightFailed is its start failure)

    def _unreachable(self, job: JobState, custom_id: str, code: str, error: str, wait: float, attempt: int, now: float) -> None:
        if attempt >= PREFLIGHT_MAX_ATTEMPTS:
            why = f"{attempt} tries of the preflight met only transient errors (the limit is {PREFLIGHT_MAX_ATTEMPTS}); the last: {error}"
            return self._failed(job, custom_id, code, why, now)
        self.ctx.emit(job.job_id, _e("PreflightUnreachable", error=error, retry_at=now + wait))
        log.warning("job %s: preflight row %s: %s (%s); sent again in %.0f s", job.job_id, custom_id, code, error, wait)

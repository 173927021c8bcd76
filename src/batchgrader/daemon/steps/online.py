"""The online step: rows through the provider's synchronous API.  A job's rows on the
synchronous routes (``route: flex``, ``online``, or ``auto`` choosing one of them) before it is
prepared (``SendOnline``), and a straggler's unanswered rows (``SendStragglers``: the chunk's
results file written and its outcome recorded once every row has one).

One :class:`SyncSender` carries out one such action, with what it needs given explicitly
(home, profile, prices, provider, the event sink and the clocks):

* a route not chosen yet is chosen first (``RouteChosen``): the profile's, or for ``auto`` what
  :func:`~batchgrader.core.configuration.routes.choose_route` makes of the row count and the deadline; ``batch``
  ends the step (the job is prepared into batches as usual); ``flex`` and ``online`` carry the
  rows' estimate at the route's price, and the step ends there if the budget's rules
  (:mod:`~batchgrader.core.rules.budget`) would not let it spend: the next tick holds the job;
* every row not answered yet is sent, ``concurrency`` at a time (a small thread pool; events are
  written by the calling thread only): the intent ``OnlineRequestSent`` when the request leaves,
  then ``OnlineRequestAnswered`` (with a ``TokensUsed`` of chunk -1 in the same transaction:
  flex at the catalogue's Batch price, online at its standard price; the answer is put in the
  answers store in that transaction too, as a batch's answers are) or ``OnlineRequestFailed``;
* a 429 (or a 408, a 5xx, a timeout, a lost reply) stops the step: no request leaves before the
  provider's ``Retry-After`` (else a backoff doubling from 1 s) has passed, on the monotonic clock
  (``not_before``) and, after a restart, the wall clock its event recorded; a row is tried at most
  :data:`~batchgrader.core.log.route_state.MAX_ATTEMPTS` times, and a definite refusal (another 4xx) or an
  answer that is not valid (``invalid_output``, ``unexpected_finish``) fails it at once: such a row is
  failed ``final`` and goes in the job's batch, where it is answered or fails with its code in the
  result like any batch row; an answer cut off or refused (``truncated``, ``refused``) is billed and
  recorded as the row's answer with its code (``OnlineRequestAnswered.error_code``, a ``RowsFailed``
  beside it): the same request would fail the same way, so it is not sent again (as a batch never
  resends such a row by itself); ``bgctl retry`` (with ``--max-completion-tokens``) sends it again;
* a request left without an outcome by a crash is uncertain (a synchronous call has no record
  to reconcile with): it is sent again once, marked ``resent_after_crash``; one left so twice is
  failed ``final`` (``outcome_unknown``) and goes in the batch;
* once every row is answered or failed for good, ``OnlineRowsDone``; the job is then prepared
  and its answers are taken like stored answers (:mod:`batchgrader.pipeline.job_reuse`), so only
  the failed rows are sent in a batch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import ConfigError, Profile
from batchgrader.core.configuration.routes import DEFAULT_BATCH_SECONDS, choose_route, deadline_at
from batchgrader.core.host.control_files import cancel_pending
from batchgrader.core.host.home import Home
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.route_state import MAX_ATTEMPTS, RouteState, backoff, refused_rows
from batchgrader.core.log.state import ChunkState, JobState
from batchgrader.core.rules.actions import ONLINE_TIMER, SendOnline, SendStragglers
from batchgrader.core.rules.budget import budget_problem
from batchgrader.core.rules.decide import NEVER_RETRIED, epoch, reuse_enabled, utc_day
from batchgrader.daemon.context import Context
from batchgrader.fsio import atomic_write_bytes
from batchgrader.pipeline.answerkey import line_keys
from batchgrader.pipeline.chunkplan import chunk_custom_ids, lines
from batchgrader.pipeline.input_checks import check_input
from batchgrader.pipeline.merge import outcome_record
from batchgrader.pipeline.pricing import PriceTable, PricingError, billed_cost, estimate, has_flex, standard_price
from batchgrader.pipeline.requests import dumps_line
from batchgrader.pipeline.results import parse_line
from batchgrader.pipeline.rowschema import request_schema
from batchgrader.pipeline.samples import sample_ids
from batchgrader.pipeline.sync_lines import first_requests, input_tokens_of
from batchgrader.pipeline.tables import InputError
from batchgrader.provider.protocol import OutcomeUnknown, Provider, ProviderError, ProviderRejected, ProviderUnavailable
from batchgrader.store.eventstore import NewEvent

log = logging.getLogger("batchgrader.engine")

#: refusals tried again like a 429 (the request timed out at the provider: an adapter may report
#: it as a 4xx); every other 4xx fails its row at its first request
TRANSIENT_4XX = frozenset({408})
USAGE = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
ALL_ROWS = 1 << 40


class OnlineStep:
    """Rows through the synchronous API, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def send_online(self, a: SendOnline, job: JobState, now: float) -> None:
        """The job's route chosen, then its rows sent (see the module docstring)."""
        SyncSender.of(self.ctx, job).run()

    def send_stragglers(self, a: SendStragglers, job: JobState, now: float) -> None:
        """Send the straggler chunk's rows not settled yet (at its route's tier); complete the
        chunk once every row has its outcome."""
        c = job.chunks[a.chunk]
        sender = dataclasses.replace(SyncSender.of(self.ctx, job), tier=c.route, lookup=None)
        raw = list(lines(Path(c.path)))
        keys = dict(line_keys(sender.provider_key, raw))
        if not sender.send(raw, keys, set()):
            return  # the provider asked to wait: the rest is sent later
        job = self.ctx.state.jobs[job.job_id]
        self._complete(job, job.chunks[a.chunk], [json.loads(x)["custom_id"] for x in raw])

    def _complete(self, job: JobState, c: ChunkState, sent: list[str]) -> None:
        """Write the chunk's results file and record its outcome, once every row sent has one."""
        r: RouteState = job.online
        if any(cid in r.open or not r.settled(cid) for cid in sent):
            return
        records = {cid: _record(job.job_id, r, cid) for cid in sent}
        here = set(sent)
        leader_of = {d: lead for lead, ds in self.ctx.reuse.followers_of(job).items() for d in ds if lead in here}
        riders = [cid for cid in chunk_custom_ids(c) if cid not in here and cid in leader_of]
        out = [records[cid] for cid in sent]
        out += [{**records[leader_of[cid]], "custom_id": cid, "reused": "duplicate", "leader": leader_of[cid]} for cid in riders]
        path = Path(self.ctx.outbox.results_path(job, c))
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, b"".join(json.dumps(x, ensure_ascii=False).encode() + b"\n" for x in out))
        failed = [_failed_row(x) for x in out if not x["ok"]]
        events: list[NewEvent] = []
        if failed:
            events.append(_e("RowsFailed", chunk=c.index, batch_id=None, rows=failed))
        events.append(
            _e(
                "ChunkCompleted",
                chunk=c.index,
                batch_id=None,
                status=None,
                succeeded=len(out) - len(failed),
                failed=len(failed),
                results_path=str(path),
            )
        )
        self.ctx.emit(job.job_id, *events)


@dataclass
class SyncSender:
    """One ``SendOnline`` or ``SendStragglers`` carried out (see the module docstring)."""

    home: Home
    profile: Profile
    prices: PriceTable
    provider: Callable[[], Provider]  # built at its first request
    emit: Callable[..., None]  # emit(job_id, *events): appended and folded
    job: Callable[[], JobState]  # the job's state as folded now
    provider_key: str
    not_before: MutableMapping[tuple[str, int], float]  # the engine's timers (monotonic clock)
    wall: Callable[[], float]
    mono: Callable[[], float]
    batch_seconds: float = DEFAULT_BATCH_SECONDS
    on_progress: Callable[[], None] = lambda: None
    keep_days: float = 0.0  # the answers store's retention (cache_days): 0 stores nothing
    stored_at: Callable[[], float] | None = None  # the answers store's clock (default: wall)
    answer_store: Any = None  # the store's answers (``ctx.store.answers``): None stores nothing
    # with answer reuse on: request keys -> those with a usable stored answer (None: reuse off)
    lookup: Callable[[list[str]], set[str]] | None = None
    tier: str | None = None  # flex | online: the tier sent at (None: the job's route)
    # the budget's rule (core/rules/budget.py) on the job as folded now: True while it may not spend
    over_budget: Callable[[], bool] = lambda: False
    # whether the job is cancelled (or a cancel of it is queued): no request leaves after that
    cancelled: Callable[[], bool] = lambda: False

    @classmethod
    def of(cls, ctx: Context, job: JobState) -> SyncSender:
        """The sender with what the context holds for ``job`` (the one place that reads it)."""
        profile = ctx.profile_of(job)
        return cls(
            home=ctx.home,
            profile=profile,
            prices=ctx.prices,
            provider=lambda: ctx.provider_for(job),
            emit=ctx.emit,
            job=lambda: ctx.state.jobs[job.job_id],
            provider_key=ctx.provider_key_for(job),
            not_before=ctx.schedule.not_before,
            wall=lambda: ctx.wall + (ctx.mono_now() - ctx.mono),
            mono=ctx.mono_now,
            batch_seconds=batch_seconds(ctx, profile, job.sandbox),
            on_progress=ctx.on_progress,
            keep_days=float(ctx.settings.cache_days),
            stored_at=ctx.trusted_wall,
            answer_store=ctx.store.answers,
            lookup=_lookup(ctx, job, profile),
            over_budget=lambda: _over_budget(ctx, job.job_id),
            cancelled=lambda: _cancelled(ctx, job.job_id),
        )

    # --- the step -----------------------------------------------------------------------------
    def run(self) -> None:
        job = self.job()
        try:
            if job.online.route is None and self.profile.get("route") == "auto":
                # the rows counted without building their requests: a large file going by batch is not held in memory
                rows = check_input(Path(job.input_path), self.profile, self.home)
                route, reason = self._choose(job, rows)
                if route == "batch":
                    self.emit(job.job_id, _e("RouteChosen", route=route, reason=reason, rows=rows))
                    return
            rows_lines = first_requests(Path(job.input_path), self.profile, self.home, job.sha256, ALL_ROWS)
            lines = with_samples(rows_lines, int(self.profile.get("samples") or 1))
        except (ConfigError, InputError, UnicodeError, OSError) as exc:
            # prepare fails the job for its input with its own codes
            self.emit(job.job_id, _e("RouteChosen", route="batch", reason=f"the input could not be read: {exc}", rows=0))
            return
        if job.online.route is None:
            route, reason = self._choose(job, len(rows_lines))
            # every request the route sends is priced: k per row with samples
            est = self._estimate(route, input_tokens_of(lines, self.profile), len(lines)) if route != "batch" else None
            more = {"estimate_usd": est} if est is not None else {}
            self.emit(job.job_id, _e("RouteChosen", route=route, reason=reason, rows=len(rows_lines), **more))
            if route == "batch" or self.over_budget():
                return  # batch: prepared as usual; over budget: the next tick holds the job
        self._send_all(lines)

    def _estimate(self, tier: str, input_tokens: int, rows: int) -> dict[str, float] | None:
        """The rows' cost at ``tier``'s price with every output bound spent (None: no price)."""
        try:
            price = self.prices.get(self.profile.model)
        except PricingError:
            return None
        if tier == "online":
            price = standard_price(price)
        est = estimate(price, input_tokens, rows, self.profile.max_completion_tokens)
        return {"input": float(est.input_usd), "max_output": float(est.max_output_usd), "max_total": float(est.max_total_usd)}

    def _choose(self, job: JobState, rows: int) -> tuple[str, str]:
        route = str(self.profile.get("route") or "batch")
        if route != "auto":
            return route, f"the profile's route is {route!r}"
        flex = has_flex(self.profile, self.prices)
        now = self.wall()
        arrival = min(epoch(job.created_ts, now), now)  # the job's arrival, never after now
        return choose_route(
            rows,
            int(self.profile.get("online_max_rows") or 0),
            deadline=deadline_at(self.profile.get("deadline"), arrival),
            now=now,
            flex=flex,
            batch_seconds=self.batch_seconds,
        )

    def _send_all(self, lines: list[bytes]) -> None:
        keys = dict(line_keys(self.provider_key, lines))
        reused = self._reused(keys)
        if self.send(lines, keys, reused):
            self._maybe_done(list(keys), reused)

    def send(self, lines: list[bytes], keys: dict[str, str], reused: set[str]) -> bool:
        """Send every row of ``lines`` not settled yet (nor in ``reused``), wave by wave; False
        when the provider asked to wait (the rest is sent by a later step)."""
        job = self.job()
        todo = [json.loads(raw) for raw in lines]
        todo = [line for line in todo if not job.online.settled(line["custom_id"]) and line["custom_id"] not in reused]
        if self._given_up_after_crashes(job, todo):
            job = self.job()
            todo = [line for line in todo if not job.online.settled(line["custom_id"])]
        concurrency = max(1, int(self.profile.get("online_concurrency") or 1))
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bg-online") as pool:
            for start in range(0, len(todo), concurrency):
                if self._waiting() or self.cancelled():
                    return False  # a cancel: nothing more is sent (the job is cancelled at the next tick)
                if not self._send_wave(pool, todo[start : start + concurrency], keys):
                    return False  # asked to wait: the rest waits for the next step
        return True

    def _reused(self, keys: dict[str, str]) -> set[str]:
        """Rows not sent, with answer reuse on: those whose request has a usable stored answer,
        and repeats of an earlier row of the file (its answer is stored when it comes).  Prepare
        takes their answers from the store, as for a batch."""
        if self.lookup is None:
            return set()
        job = self.job()
        stored = self.lookup([k for cid, k in keys.items() if cid not in job.online.answers])
        out, seen = set(), set()
        for cid, key in keys.items():
            if cid in job.online.answers:
                seen.add(key)
            elif key in stored or (key in seen and self.keep_days > 0):
                out.add(cid)
            else:
                seen.add(key)
        return out

    def _given_up_after_crashes(self, job: JobState, todo: list[dict[str, Any]]) -> bool:
        """A request left without an outcome by a crash, already sent again once after one: not
        sent a third time (failed for good; the row goes in the batch)."""
        events = [
            _failed(cid, "outcome_unknown", "a crash left it without an outcome twice; it goes in the batch", None, None, True)
            for cid in sorted(job.online.open & job.online.resent)
        ]
        if events:
            self.emit(job.job_id, *events)
        return bool(events)

    def _waiting(self) -> bool:
        job = self.job()
        return self.not_before.get((job.job_id, ONLINE_TIMER), float("-inf")) > self.mono()

    def _send_wave(self, pool: ThreadPoolExecutor, wave: list[dict[str, Any]], keys: dict[str, str]) -> bool:
        """Send one wave; False when the provider asked to wait (or could not be reached)."""
        job = self.job()
        tier = self.tier or job.online.route or "online"
        intents = [
            _e(
                "OnlineRequestSent",
                custom_id=line["custom_id"],
                attempt=job.online.attempts.get(line["custom_id"], 0) + 1,
                tier=tier,
                resent_after_crash=line["custom_id"] in job.online.open,
            )
            for line in wave
        ]
        self.emit(job.job_id, *intents)  # stamped before the requests leave
        futures: list[Future[dict[str, Any]]] = [
            pool.submit(self.provider().complete, _with_tier(line, tier), job.job_id) for line in wave
        ]
        go_on = True
        for line, fut in zip(wave, futures, strict=True):
            go_on = self._outcome(line, fut, keys, tier) and go_on
            self.on_progress()
        return go_on

    def _outcome(self, line: dict[str, Any], fut: Future[dict[str, Any]], keys: dict[str, str], tier: str) -> bool:
        job = self.job()
        cid = line["custom_id"]
        attempt = job.online.attempts.get(cid, 1)
        try:
            got = fut.result()
        except ProviderRejected as exc:
            if exc.retryable or exc.status_code in TRANSIENT_4XX:
                code = "rate_limited" if exc.retryable else "timeout"
                return self._retry_later(job, cid, attempt, code, str(exc), exc.status_code, exc.retry_after)
            # refused for good: the row fails now with the message (not sent in the batch, where
            # the same request would be refused after the batch's wait)
            code = str(exc.code or f"http_{exc.status_code}")
            row = {"custom_id": cid, "code": code, "message": str(exc), "status": exc.status_code}
            self.emit(
                job.job_id,
                _failed(cid, code, str(exc), exc.status_code, None, True),
                _e("RowsFailed", chunk=None, batch_id=None, rows=[row]),
            )
            return True
        except (OutcomeUnknown, ProviderUnavailable) as exc:
            status = getattr(exc, "status_code", None)
            code = "server_error" if status else "outcome_unknown"
            return self._retry_later(job, cid, attempt, code, str(exc), status, getattr(exc, "retry_after", None))
        except ProviderError as exc:
            self.emit(job.job_id, _failed(cid, "provider_error", str(exc), None, None, True))
            return True
        rec = outcome_record(parse_line(got), request_schema(self.profile, line["body"]))
        unusable = not rec["ok"] and rec.get("status_code") == 200 and rec.get("error_code") in NEVER_RETRIED
        if not rec["ok"] and not unusable:  # sent in the batch: it may be answered there
            self.emit(
                job.job_id, _failed(cid, str(rec["error_code"]), str(rec["error_message"]), rec.get("status_code"), None, True)
            )
            return True
        usage = {k: int(rec.get(k) or 0) for k in USAGE}
        cost = self._cost(tier, usage)
        problem = {"error_code": str(rec["error_code"]), "error_message": str(rec["error_message"])} if unusable else {}
        answer = _e(
            "OnlineRequestAnswered",
            custom_id=cid,
            key=keys[cid],
            content=rec.get("content") or "",
            finish_reason=rec.get("finish_reason"),
            tier=tier,
            cost_usd=cost,
            **usage,
            **problem,
        )
        used = _e(
            "TokensUsed",
            chunk=-1,
            batch_id=None,
            model=self.profile.model,
            cost_usd=cost,
            day=utc_day(self.wall()),
            route=tier,
            **usage,
        )
        stored = {
            "key": keys[cid],
            "provider": self.provider_key,
            "model": self.profile.model,
            "content": rec.get("content") or "",
            "finish_reason": rec.get("finish_reason"),
            **usage,
            "job_id": job.job_id,
            "custom_id": cid,
            "batch_id": None,
        }
        if unusable:  # billed, but the same request would fail the same way: the row fails with it
            row = {"custom_id": cid, "code": problem["error_code"], "message": problem["error_message"], "status": 200}
            self.emit(job.job_id, answer, used, _e("RowsFailed", chunk=None, batch_id=None, rows=[row]))
            return True
        self.emit(job.job_id, answer, used, also=self._store(stored))  # stored for reuse as a batch's answers are
        return True

    def _store(self, row: dict[str, Any]) -> Callable[[Any], None] | None:
        """Put one answer in the answers store, in the transaction of its event (nothing when
        ``cache_days`` is 0)."""
        store = self.answer_store
        if self.keep_days <= 0 or store is None:
            return None
        when = (self.stored_at or self.wall)()

        def put(conn: Any) -> None:
            store.put(conn, [row], now=when, keep_days=self.keep_days)

        return put

    def _retry_later(
        self, job: JobState, cid: str, attempt: int, code: str, error: str, status: int | None, retry_after: float | None
    ) -> bool:
        """A request the provider asked to wait for (429) or did not answer: no request of the job
        leaves before the wait has passed; after :data:`MAX_ATTEMPTS` the row is failed for good."""
        wait = retry_after if retry_after is not None else backoff(attempt)
        final = attempt >= MAX_ATTEMPTS
        self.not_before[(job.job_id, ONLINE_TIMER)] = max(
            self.not_before.get((job.job_id, ONLINE_TIMER), float("-inf")), self.mono() + wait
        )
        retry_at = None if final else self.wall() + wait
        self.emit(job.job_id, _failed(cid, code, error, status, retry_at, final))
        log.warning(
            "job %s row %s: %s (%s); %s",
            job.job_id,
            cid,
            code,
            error,
            "sent in the batch" if final else f"sent again in {wait:.1f} s",
        )
        return False

    def _cost(self, tier: str, usage: dict[str, int]) -> float:
        try:
            price = self.prices.get(self.profile.model)
        except PricingError:
            return 0.0
        if tier == "online":
            price = standard_price(price)
        return float(billed_cost(price, usage["prompt_tokens"], usage["cached_tokens"], usage["completion_tokens"]))

    def _maybe_done(self, cids: list[str], reused: set[str]) -> None:
        job = self.job()
        r: RouteState = job.online
        if r.open or any(not r.settled(cid) and cid not in reused for cid in cids):
            return
        self.emit(
            job.job_id,
            _e(
                "OnlineRowsDone",
                answered=len(r.answers),
                to_batch=len(r.to_batch) - len(refused_rows(job)),
                resent_after_crash=len(r.resent),
                cost_usd=sum(r.cost_by_tier.values()),
            ),
        )


def with_samples(lines: list[bytes], k: int) -> list[bytes]:
    """The request lines of every sample of each row (``samples: k``), as prepare writes them:
    sample ``j`` of a row is its request with the custom id ``sample_id(cid, j)``."""
    if k <= 1:
        return lines
    out: list[bytes] = []
    for raw in lines:
        line = json.loads(raw)
        for scid in sample_ids(line["custom_id"], k):
            out.append(raw if scid == line["custom_id"] else dumps_line({**line, "custom_id": scid}))
    return out


def _cancelled(ctx: Context, job_id: str) -> bool:
    return bool(ctx.state.jobs[job_id].cancel_requested) or cancel_pending(ctx.home, job_id)


def _over_budget(ctx: Context, job_id: str) -> bool:
    job = ctx.state.jobs[job_id]
    return not job.override_budget and budget_problem(ctx.state, job, ctx.config, ctx.wall) is not None


def _failed(cid: str, code: str, error: str, status: int | None, retry_at: float | None, final: bool) -> NewEvent:
    return _e("OnlineRequestFailed", custom_id=cid, code=code, error=error, status_code=status, retry_at=retry_at, final=final)


def _with_tier(line: dict[str, Any], tier: str) -> dict[str, Any]:
    """The request line as it is sent: at the flex tier, ``service_tier: "flex"`` in its body."""
    if tier != "flex":
        return line
    return {**line, "body": {**line["body"], "service_tier": "flex"}}


def _lookup(ctx: Context, job: JobState, profile: Profile) -> Callable[[list[str]], set[str]] | None:
    """The answers store's lookup for the job, or None when it reuses no answers."""
    if not reuse_enabled(job, profile):
        return None

    def lookup(keys: list[str]) -> set[str]:
        return set(ctx.stored_answers(profile, ctx.trusted_wall())(keys))

    return lookup


def _record(job_id: str, r: RouteState, cid: str) -> dict[str, Any]:
    """A row's result record (the shape of a merged chunk's results file) from its outcome on
    the synchronous route."""
    a = r.answers.get(cid)
    if a is not None:
        return {
            "custom_id": cid,
            "ok": True,
            "content": a["content"],
            "status_code": 200,
            "error_code": None,
            "error_message": None,
            "prompt_tokens": a["prompt_tokens"],
            "cached_tokens": a["cached_tokens"],
            "completion_tokens": a["completion_tokens"],
            "reasoning_tokens": a["reasoning_tokens"],
            "finish_reason": a["finish_reason"],
            "reused": a["tier"],  # answered_by: flex or online, billed in this job
            "key": a["key"],
            "answered_in": job_id,
        }
    f = r.failed.get(cid) or {}
    return {
        "custom_id": cid,
        "ok": False,
        "content": None,
        "status_code": f.get("status"),
        "error_code": f.get("code") or "outcome_unknown",
        "error_message": f.get("error") or "no outcome on the synchronous route",
    }


def _failed_row(x: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"custom_id": x["custom_id"], "code": x["error_code"], "message": x["error_message"]}
    if x.get("status_code") is not None:
        row["status"] = int(x["status_code"])
    return row


def batch_seconds(ctx: Context, profile: Profile, sandbox: bool) -> float:
    """What a batch of the profile's model is expected to take: the median of its observed run
    times (``store/runtimes.py``), else the completion window (24 h)."""
    import statistics

    try:
        runs = ctx.store.learned_run_times([(profile.model, sandbox)]).get((profile.model, sandbox)) or []
    except Exception:  # noqa: BLE001 - no read model yet: the default
        return DEFAULT_BATCH_SECONDS
    return float(statistics.median(runs)) if runs else DEFAULT_BATCH_SECONDS

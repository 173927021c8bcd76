"""The engine's one explicit context: all that the steps (``daemon/steps/``) share.

:class:`Context` holds the home, the config and prices, the event store and the folded state,
the providers by name (:class:`~batchgrader.provider.pool.Providers`), the clocks of the tick
under way, the :class:`~batchgrader.core.rules.schedule.Schedule` (all timing state), what this process
read of each job's reuse file, and the hooks the daemon sets (stop, heartbeat, counting, merge
workers).  Its methods are the effects more than one step has: ``emit`` (append events, fold
them in), a job's profile and its provider (:meth:`Context.provider_for`), a chunk's rows failed,
a refused chunk's file deleted, the stored answers a job may take, whose queue a limit belongs
to, the split limits, the cost of usage; and :class:`Outbox` (``ctx.outbox``): the outbox paths
reserved, error reports, a chunk's results file.  Each step is built over the context alone and
never reaches another step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import Config, ConfigError, Profile
from batchgrader.core.configuration.providers import PROVIDER_FACTS
from batchgrader.core.host.home import Home
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import ChunkState, JobState, State, fold
from batchgrader.core.rules import queue
from batchgrader.core.rules.decide import Timers, queue_limit
from batchgrader.core.rules.panel import judge_profile, judge_result_path
from batchgrader.core.rules.schedule import Schedule
from batchgrader.daemon.workers import MergeWorkers
from batchgrader.fsio import atomic_write_bytes, fit_name, free_path, stamp
from batchgrader.pipeline.answerkey import provider_id_of
from batchgrader.pipeline.chunkplan import chunk_custom_ids, with_followers
from batchgrader.pipeline.job_reuse import ReuseFiles
from batchgrader.pipeline.outbox import error_name, error_report, report_name
from batchgrader.pipeline.pricing import PriceTable, PricingError, billed_cost
from batchgrader.pipeline.reuse import Lookup
from batchgrader.pipeline.splitting import Limits
from batchgrader.provider.pool import Providers
from batchgrader.provider.protocol import Provider, ProviderError
from batchgrader.store.backend import EventLog, Follower, catch_up, emit_decided
from batchgrader.store.eventstore import ConcurrencyError, NewEvent

log = logging.getLogger("batchgrader.engine")

CLOCK_SKEW_SLACK = 600  # s, between our clock and the provider's, for created_after


def _short(payload: dict[str, Any]) -> str:
    s = json.dumps(
        {k: v for k, v in payload.items() if k not in ("rows", "custom_ids", "chunks", "row_errors")},
        ensure_ascii=False,
        default=str,
    )
    return s if len(s) < 300 else s[:297] + "..."


@dataclass
class Context:
    """What every engine step shares (see the module docstring)."""

    home: Home
    config: Config
    store: EventLog
    providers: Providers  # by name; a job's calls go to provider_for(job)
    prices: PriceTable
    sandbox: bool = False
    state: State = field(default_factory=State)
    schedule: Schedule = field(default_factory=Schedule)  # all timing state (core/rules/schedule.py)
    # the clocks of the tick under way: the wall clock (timestamps, UTC days, retention) and the
    # monotonic clock (every wait); mono_started: time.monotonic() when the tick began
    wall: float = 0.0
    mono: float = 0.0
    mono_started: float = 0.0
    anchor: tuple[float, float] | None = None  # (wall, mono) of the first tick
    should_stop: Callable[[], bool] = lambda: False  # set by the daemon: SIGTERM finishes the current step
    on_progress: Callable[[], None] = lambda: None  # heartbeat for long steps (systemd watchdog)
    # the counting hook per profile (provider/counting.py); set by the daemon (the sandbox points it
    # at the emulator); None: built from the profile's settings (counter_for)
    token_counter: Callable[[Profile], Any] | None = None
    # set by the daemon: where chunks of at least ``merge_worker_rows`` rows are merged (worker
    # processes); None: every chunk is merged in this process, within its tick
    merge_workers: MergeWorkers | None = None
    reuse: ReuseFiles = field(default_factory=ReuseFiles)  # what this process read of each job's reuse file
    # on a log other daemons append to (PostgreSQL): the reader of what they appended, folded in
    # before each decision (:meth:`follow`); None: this daemon is the log's only writer (SQLite)
    follower: Follower | None = None
    # on a store several daemons share: the leases this daemon appends under (daemon/shared.py
    # SharedWork; its ``append`` and ``claim``); None: the log's only writer
    shared: Any = None
    outbox: Outbox = field(init=False)

    def __post_init__(self) -> None:
        self.state = fold(self.store.read())
        self.outbox = Outbox(self)
        # a long listing (many pages) keeps the watchdog fed from this, the working thread
        self.providers.set_on_page(lambda: self.on_progress())
        if not self.store.readonly:
            removed = self.store.answers.forget_simulated([j.job_id for j in self.state.jobs.values() if j.sandbox])
            if removed:
                log.warning("removed %d simulated answers stored under a real provider's key by an older version", removed)

    # --- plumbing -----------------------------------------------------------------------------
    def follow(self) -> None:
        """Run on a shared log: fold what other daemons append (:meth:`catch_up`, :meth:`emit`)."""
        self.follower = Follower(self.store, self.state.last_seq)

    def catch_up(self) -> None:
        """Fold the events other daemons appended since the last read (nothing on SQLite)."""
        if self.follower is not None:
            catch_up(self.state, self.follower)

    def emit(self, job_id: str, *events: NewEvent, also: Callable[[Any], None] | None = None) -> None:
        """Append ``events`` to the job and fold them in.  On a shared log
        (:attr:`follower`) the other daemons' events are folded first, and the append is made
        only while the job is as the caller decided on (:func:`~batchgrader.store.backend.emit_decided`):
        when another daemon appended to the job meanwhile, its events are folded and
        :class:`ConcurrencyError` tells the engine to decide again."""
        job = self.state.jobs.get(job_id)
        decided_on = job.version if job else 0
        if self.follower is None:
            stored = self.store.append(job_id, events, expected_version=decided_on, also=also)
            for ev in stored:
                self.state.apply(ev)
        else:

            def decide(now: JobState | None) -> list[NewEvent]:
                if (now.version if now else 0) != decided_on:
                    raise ConcurrencyError(f"job {job_id}: another daemon appended to it; deciding again")
                return list(events)

            append = self.shared.append if self.shared is not None else None
            stored = emit_decided(self.store, self.state, self.follower, job_id, decide, also=also, append=append)
        for ev in stored:
            log.info("event %s %s %s", job_id, ev.type, _short(ev.payload))

    def profile_of(self, job: JobState) -> Profile:
        """The job's profile, with the provider recorded when it was accepted: an edit of the
        profile's ``provider`` never re-routes a job in flight; a panel's judge runs with the
        panel's ``samples`` (:func:`~batchgrader.core.rules.panel.judge_profile`)."""
        profile = self.config.profile(job.profile)
        if job.provider and profile.provider != job.provider:
            profile = Profile(profile.name, {**profile.values, "provider": job.provider}, profile.sources)
        if job.panel_of is not None:  # a panel's judge: the panel's samples, unless its own profile sets them
            panel = self.state.jobs.get(job.panel_of)
            profile = judge_profile(profile, int((panel.settings if panel else {}).get("samples") or 1))
        return profile

    def provider_for(self, job: JobState) -> Provider:
        """The provider a job's calls go to: the one recorded when it was accepted
        (``JobAccepted.provider``), else (an older log) its profile's; built at its first call."""
        return self.providers.get(job.provider or self.profile_of(job).provider)

    def rows_failed(self, job: JobState, c: ChunkState, code: str, message: str) -> None:
        """Every row of chunk ``c`` fails with ``code`` (its duplicates with it): ``RowsFailed``."""
        cids = with_followers(chunk_custom_ids(c), self.reuse.followers_of(job))
        rows = [{"custom_id": cid, "code": code, "message": message} for cid in cids]
        if rows:
            self.emit(job.job_id, _e("RowsFailed", chunk=c.index, batch_id=c.batch_id, rows=rows))

    def delete_refused_file(self, job: JobState, c: ChunkState, refused: bool = False) -> None:
        """Delete the input file of a batch refused for the queue limit (``refused``: it is, whatever
        the chunk's state says), or of a chunk uploaded ahead of queue room and never created,
        before its rows are sent again (a new upload, or new chunks) or given up, so it is never
        left at the provider.  Idempotent: after a crash it is simply done again."""
        refused = refused or bool(c.failure is not None and c.failure.get("retryable"))
        refused_create = c.upload == "done" and c.create == "failed"  # refused at once: no batch uses the file
        staged = c.staged and c.upload == "done"  # uploaded ahead of queue room, never created
        if not c.file_id or not (refused or refused_create or staged):
            return
        try:
            self.delete_provider_file(job, c.file_id, "refused")
        except ProviderError as exc:
            log.info("could not delete refused batch file %s: %s", c.file_id, exc)

    def delete_provider_file(self, job: JobState, file_id: str, reason: str) -> None:
        """Delete a file at the provider, its intent (``ProviderFileDeleteRequested``) recorded
        before the call leaves: on a shared store through the account lease's fence check, so a
        daemon that lost the lease makes no call.  :class:`ProviderError` as the call raises it."""
        self.emit(job.job_id, _e("ProviderFileDeleteRequested", file_id=file_id, reason=reason))
        self.provider_for(job).delete_file(file_id)

    def stored_answers(self, profile: Profile, now: float) -> Lookup:
        """The answers store's lookup for a job of ``profile`` at ``now`` (its retention)."""
        store = self.store.answers

        def lookup(keys: Any) -> dict[str, Any]:
            return dict(
                store.lookup(keys, now=now, keep_days=profile.cache_days, allow_truncated=profile.reuse_truncated_answers)
            )

        return lookup

    def accepted_as(self, profile: Profile, sandbox: bool) -> dict[str, Any]:
        """What ``JobAccepted`` records of who answers a job of ``profile`` (fixed from then on)."""
        return {"sandbox": sandbox, "provider": profile.provider, "provider_id": provider_id_of(profile, sandbox)}

    def left_alone_because(self, job: JobState) -> tuple[str, str] | None:
        """``(code, reason)`` when this daemon must not touch ``job``: a sandbox job met by a
        normal daemon (it would pay a real provider for it and poll it for the emulator's batch
        ids), a real job met by a sandbox daemon (it would put simulated answers in a real
        result), or a job whose provider endpoint is no longer this daemon's (its batches are
        there).  None: the job is this daemon's."""
        if job.rejected or job.corrupt:
            return None
        if job.sandbox and not self.sandbox:
            return (
                "sandbox_job",
                "accepted by a sandbox daemon (SIMULATED): a normal daemon leaves it alone; "
                "finish it with `bgctl daemon --sandbox` (or cancel it: `bgctl cancel`, then that daemon)",
            )
        if self.sandbox and not job.sandbox:
            return (
                "real_job",
                "accepted by a normal daemon (real provider): the sandbox daemon leaves it alone; "
                "finish it with `bgctl daemon` (without --sandbox)",
            )
        if job.provider_id is None:
            return None  # an older log: the job follows its profile as before
        try:
            now = provider_id_of(self.profile_of(job), self.sandbox)
        except ConfigError:
            return None  # reported where the profile is needed
        if now != job.provider_id:
            return (
                "endpoint_changed",
                f"its batches belong to {job.provider_id}, but this daemon's {job.provider} endpoint is {now}: "
                "left alone; set the endpoint back in config.yaml (or the environment) and restart the daemon to finish it",
            )
        return None

    def reload(self, config: Config, prices: PriceTable) -> None:
        self.config, self.prices = config, prices

    @property
    def settings(self) -> Profile:
        return self.config.default

    def timers(self, mono: float | None = None) -> Timers:
        """What the rules read of the schedule, at ``mono`` (default: the tick's monotonic time)."""
        merging = self.merge_workers.awaited() if self.merge_workers is not None else None
        return self.schedule.timers(self.mono if mono is None else mono, merging)

    # --- clocks -------------------------------------------------------------------------------
    def set_clocks(self, wall: float, mono: float | None) -> None:
        """The clocks of a tick: ``wall`` for timestamps, ``mono`` (default: ``wall``, one clock
        for both, as tick tests with one fake clock use) for every wait."""
        self.wall = wall
        self.mono = wall if mono is None else mono
        self.mono_started = time.monotonic()
        if self.anchor is None:
            self.anchor = (self.wall, self.mono)

    def mono_now(self) -> float:
        """The monotonic time at this moment of the tick (a request is stamped when it leaves,
        not when the tick began): the tick's, plus what the tick has taken so far."""
        return self.mono + (time.monotonic() - self.mono_started)

    def trusted_wall(self) -> float:
        """The wall-clock time, never ahead of what the monotonic clock measured since the first
        tick (a clock stepped forward must not age stored answers: late retention is harmless,
        early retention loses answers)."""
        if self.anchor is None:
            return self.wall
        wall0, mono0 = self.anchor
        return min(self.wall, wall0 + (self.mono - mono0))

    def provider_key_for(self, job: JobState) -> str:
        """Who answers a job's rows (whose stored answers they may reuse, and under whom their
        answers are stored): the ``provider_id`` recorded when it was accepted; in an older log,
        :func:`~batchgrader.pipeline.answerkey.provider_id_of` of its profile in the job's own
        mode (sandbox or not), the rule ``bgctl count`` follows too."""
        if job.provider_id:
            return job.provider_id
        try:
            profile = self.profile_of(job)
        except ConfigError:
            return provider_id_of(self.settings, job.sandbox)
        return provider_id_of(profile, job.sandbox)

    def queue_url_for(self, of: JobState | Profile) -> str:
        """Whose queue a job or profile's batches wait in, which a learned limit belongs to: in
        the sandbox, the emulator's for that provider (``sandbox`` for OpenAI, else
        ``sandbox:<provider>``, never a real provider's); an Azure deployment's (enqueued-token
        quota) is its resource endpoint's, kept per endpoint and deployment (the model name);
        Anthropic's and Gemini's are their provider ids; OpenAI's is :attr:`queue_url`."""
        try:
            profile = of if isinstance(of, Profile) else self.profile_of(of)
        except ConfigError:
            return self.queue_url
        if self.sandbox:
            return provider_id_of(profile, sandbox=True)
        facts = PROVIDER_FACTS[profile.provider]
        if facts.identity == "prefixed":
            return provider_id_of(profile)
        if facts.identity == "base":
            return self.queue_url
        return str(profile.get(facts.base_setting) or "").rstrip("/")  # the client's base_url (one resource per daemon)

    def cost(self, model: str, usage: dict[str, int]) -> float:
        try:
            price = self.prices.get(model)
        except PricingError:
            return 0.0
        return float(billed_cost(price, usage["prompt_tokens"], usage["cached_tokens"], usage["completion_tokens"]))

    # --- the provider's queue limit -----------------------------------------------------------
    def split_limits(self, profile: Profile) -> Limits:
        """The limits a job of ``profile`` is split by: :meth:`limits` when the queue limit is
        tighter, else the profile's (with the model's context window)."""
        found = self.limits(profile)
        if found is not None:
            return found
        price = self.prices.find(profile.model)
        window = profile.context_window if profile.context_window is not None else (price.context_window if price else None)
        return Limits.from_settings(profile, window)

    def limits(self, profile: Profile) -> Limits | None:
        """The split limits, tightened to the model's queue limit (configured or learned)."""
        cap = queue_limit(self.state, self.config, profile.model, self.queue_url_for(profile))[0]
        if cap is None or (profile.split_token_limit is not None and cap >= profile.split_token_limit):
            return None
        price = self.prices.find(profile.model)
        limits = Limits.from_settings(profile, price.context_window if price else None)
        return dataclasses.replace(limits, token_limit=cap, token_limit_name="enqueued_token_limit")

    @property
    def queue_url(self) -> str:
        """Whose queue a learned limit belongs to: the provider's base URL ('sandbox' in sandbox mode)."""
        if self.sandbox:
            return "sandbox"
        return str(self.providers.base_url or self.settings.base_url or "").rstrip("/")

    def learned_event(
        self, model: str, learned: queue.Learned | None, chunk: int, message: str | None, job: JobState | None = None
    ) -> list[NewEvent]:
        """The ``QueueLimitLearned`` of what a refusal or a completion taught (none: nothing)."""
        if learned is None:
            return []
        queue_url = self.queue_url_for(job) if job is not None else self.queue_url
        log.warning(
            "queue limit for %s at %s: %s tokens (%s)",
            model,
            queue_url or "the provider",
            f"{learned.limit:,}",
            learned.source,
        )
        return [
            _e(
                "QueueLimitLearned",
                base_url=queue_url,
                model=model,
                limit=learned.limit,
                exact=learned.exact,
                source=learned.source,
                chunk=chunk,
                message=message,
            )
        ]


class Outbox:
    """The outbox as the steps share it (``ctx.outbox``): free paths no other job recorded, error
    reports, a chunk's results file."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def owner(self, path: str, job_id: str) -> str | None:
        """Another job that recorded ``path`` as its result or error file, if any."""
        for j in self.ctx.state.jobs.values():
            if j.job_id != job_id and path in (j.result_path, j.error_path):
                return j.job_id
        return None

    def reserve(self, name: str, job_id: str, now: float, companion: Callable[[str], str] | None = None) -> Path:
        """A free outbox path that no other job has recorded either (a job that recorded a path
        and crashed before writing it still owns it: two inputs with the same name never swap).
        With ``companion`` (the result's report name), its companion's name is free too.  A
        judge of a panel writes in the panel's folder, not the outbox."""
        home = self.ctx.home
        job = self.ctx.state.jobs.get(job_id)
        if job is not None and job.panel_of is not None:
            mine = judge_result_path(home, job, name)
            return free_path(mine.parent, mine.name, stamp(now))  # a retried judge writes a new one
        path = free_path(home.outbox, name, stamp(now), companion)
        if self.owner(str(path), job_id) is None:
            return path
        own = fit_name(Path(name).stem, f"_{job_id[:12]}{Path(name).suffix}")  # a name only this job uses
        return free_path(home.outbox, own, stamp(now), companion)

    def report_of(self, job: JobState) -> Callable[[str], str] | None:
        """The report's name for a result's (``write_report``), so the two share their stem."""
        try:
            return report_name if self.ctx.profile_of(job).get("write_report") else None
        except ConfigError:
            return None

    def error_path(self, job: JobState, now: float) -> Path:
        """A free path for a job's error report (a judge of a panel: in the panel's folder)."""
        if job.panel_of is not None:
            mine = judge_result_path(self.ctx.home, job, error_name(job.file))
            return free_path(mine.parent, mine.name, stamp(now))
        return free_path(self.ctx.home.outbox, error_name(job.file), stamp(now))

    def write_error_report(self, job_id: str, file: str, path: Path, reason: str, hint: str) -> None:
        """Name the error report in an intent (``OutboxWriteStarted``), write it, record it."""
        self.ctx.emit(job_id, _e("OutboxWriteStarted", path=None, error_path=str(path)))
        if not path.exists():
            atomic_write_bytes(path, error_report(file, job_id, reason, hint).encode("utf-8"), overwrite=False)
        self.ctx.emit(job_id, _e("ResultWritten", path=None, rows=0, succeeded=0, failed=0, error_path=str(path)))

    def results_path(self, job: JobState, c: ChunkState) -> str:
        """Where chunk ``c``'s results are written when it is merged (or answered synchronously)."""
        return str(self.ctx.home.job_dir(job.job_id) / "results" / f"chunk-{c.index:04d}.jsonl")

"""The engine's one explicit context: what every step object shares.

:class:`Context` holds the home, the config and prices, the event store and the folded state,
the provider (or router), the clocks of the tick under way, the :class:`~batchgrader.core.schedule.Schedule`
(all timing state), and the hooks the daemon sets (stop, heartbeat, prefetch, counting, merge
workers); its methods are the plumbing every step uses: ``emit`` (append events, fold them in),
a job's profile and provider, whose queue a limit belongs to, the split limits, the cost of usage.
Steps (``daemon/intake.py``, ``prepare.py``, ``submit.py``, ``collect.py``, ``finish.py``,
``reuse.py``, ``preflight.py``) each receive it, and the other steps they call, explicitly.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batchgrader.core import queue
from batchgrader.core.config import Config, ConfigError, Profile
from batchgrader.core.decide import Timers, queue_limit
from batchgrader.core.home import Home
from batchgrader.core.panel import judge_profile
from batchgrader.core.providers import PROVIDER_FACTS
from batchgrader.core.schedule import Schedule
from batchgrader.core.state import JobState, State, fold
from batchgrader.daemon.base import _e, _short
from batchgrader.daemon.workers import MergeWorkers
from batchgrader.pipeline.answerkey import provider_id_of
from batchgrader.pipeline.pricing import PriceTable, PricingError, billed_cost
from batchgrader.pipeline.splitting import Limits
from batchgrader.provider.protocol import Provider
from batchgrader.store import answers
from batchgrader.store.eventstore import EventStore, NewEvent

log = logging.getLogger("batchgrader.engine")


@dataclass
class Context:
    """What every engine step shares (see the module docstring)."""

    home: Home
    config: Config
    store: EventStore
    provider: Provider | None
    prices: PriceTable
    sandbox: bool = False
    state: State = field(default_factory=State)
    schedule: Schedule = field(default_factory=Schedule)  # all timing state (core/schedule.py)
    # the clocks of the tick under way: the wall clock (timestamps, UTC days, retention) and the
    # monotonic clock (every wait); mono_started: time.monotonic() when the tick began
    wall: float = 0.0
    mono: float = 0.0
    mono_started: float = 0.0
    anchor: tuple[float, float] | None = None  # (wall, mono) of the first tick
    should_stop: Callable[[], bool] = lambda: False  # set by the daemon: SIGTERM finishes the current step
    on_progress: Callable[[], None] = lambda: None  # heartbeat for long steps (systemd watchdog)
    # set by the daemon: a job being prepared has rows to send to this provider (its SDK can be
    # readied meanwhile)
    on_rows_to_send: Callable[[str], None] = lambda provider: None
    # the counting hook per profile (provider/counting.py); set by the daemon (the sandbox points it
    # at the emulator); None: built from the profile's settings (counter_for)
    token_counter: Callable[[Profile], Any] | None = None
    # set by the daemon: where chunks of at least ``merge_worker_rows`` rows are merged (worker
    # processes); None: every chunk is merged in this process, within its tick
    merge_workers: MergeWorkers | None = None

    def __post_init__(self) -> None:
        self.state = fold(self.store.read())
        if self.provider is not None and hasattr(self.provider, "on_page"):
            # a long listing (many pages) keeps the watchdog fed from this, the working thread
            self.provider.on_page = lambda: self.on_progress()
        if not self.store.readonly:
            with self.store.write() as conn:
                answers.ensure(conn)
                removed = answers.forget_simulated(conn, (j.job_id for j in self.state.jobs.values() if j.sandbox))
            if removed:
                log.warning("removed %d simulated answers stored under a real provider's key by an older version", removed)

    # --- plumbing -----------------------------------------------------------------------------
    def emit(self, job_id: str, *events: NewEvent, also: Callable[[Any], None] | None = None) -> None:
        job = self.state.jobs.get(job_id)
        stored = self.store.append(job_id, events, expected_version=job.version if job else 0, also=also)
        for ev in stored:
            self.state.apply(ev)
            log.info("event %s %s %s", job_id, ev.type, _short(ev.payload))

    def profile_of(self, job: JobState) -> Profile:
        """The job's profile, with the provider recorded when it was accepted: an edit of the
        profile's ``provider`` never re-routes a job in flight; a panel's judge runs with the
        panel's ``samples`` (:func:`~batchgrader.core.panel.judge_profile`)."""
        profile = self.config.profile(job.profile)
        if job.provider and profile.provider != job.provider:
            profile = Profile(profile.name, {**profile.values, "provider": job.provider}, profile.sources)
        if job.panel_of is not None:  # a panel's judge: the panel's samples, unless its own profile sets them
            panel = self.state.jobs.get(job.panel_of)
            profile = judge_profile(profile, int((panel.settings if panel else {}).get("samples") or 1))
        return profile

    def provider_name_of(self, job_id: str) -> str:
        """The provider a job's calls go to (``ProviderRouter.provider_of_job``): the one recorded
        when it was accepted, else its profile's."""
        job = self.state.jobs[job_id]
        return job.provider or self.profile_of(job).provider

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

    def provider_key(self) -> str:
        return provider_id_of(self.settings, self.sandbox)

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
        return str(getattr(self.provider, "base_url", "") or self.settings.base_url or "").rstrip("/")

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

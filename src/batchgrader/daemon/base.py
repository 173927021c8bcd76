"""The engine's shared state and plumbing: the fields every executor step reads, ``emit``
(append events and fold them in), settings, and small helpers the step modules share.

:class:`batchgrader.daemon.engine.Engine` is assembled from the step classes in
``intake``, ``submit``, ``collect``, ``finish`` and ``reuse``; each inherits the ones it calls.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batchgrader.core.config import Config, ConfigError, Profile
from batchgrader.core.decide import Timers, queue_limit
from batchgrader.core.home import Home
from batchgrader.core.polling import Durations
from batchgrader.core.state import ChunkState, JobState, State, fold
from batchgrader.daemon.workers import MergeWorkers
from batchgrader.pipeline import inbox as inbox_mod
from batchgrader.pipeline.answerkey import provider_id_of
from batchgrader.pipeline.pricing import PriceTable, PricingError, billed_cost
from batchgrader.pipeline.splitting import Limits, custom_ids_in
from batchgrader.provider.protocol import Provider
from batchgrader.store import answers
from batchgrader.store.eventstore import EventStore, NewEvent

log = logging.getLogger("batchgrader.engine")

CLOCK_SKEW_SLACK = 600  # s, between our clock and the provider's, for created_after


def _e(type_: str, **payload: Any) -> NewEvent:
    return NewEvent(type_, payload)


def stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y%m%dT%H%M%SZ")


def _status_event(c: ChunkState, b: Any) -> NewEvent | None:
    """A BatchStatusChanged for what the provider says of ``c``'s batch, or None if nothing changed."""
    counts = dataclasses.asdict(b.request_counts)
    if (b.status, counts, b.output_file_id, b.error_file_id) == (c.status, c.request_counts, c.output_file_id, c.error_file_id):
        return None
    return _e(
        "BatchStatusChanged",
        chunk=c.index,
        batch_id=b.id,
        status=b.status,
        request_counts=counts,
        output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        errors=[dataclasses.asdict(x) for x in b.errors],
    )


def _short(payload: dict[str, Any]) -> str:
    s = json.dumps(
        {k: v for k, v in payload.items() if k not in ("rows", "custom_ids", "chunks", "row_errors")},
        ensure_ascii=False,
        default=str,
    )
    return s if len(s) < 300 else s[:297] + "..."


def _lines(path: Path) -> Iterable[bytes]:
    with open(path, "rb") as f:
        yield from f


def _load_token_sizes(path: Path) -> tuple[array, array]:
    data = array("Q")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    half = len(data) // 2
    return data[:half], data[half:]


def chunk_custom_ids(c: ChunkState) -> list[str]:
    if c.custom_ids is not None:
        return list(c.custom_ids)
    return custom_ids_in(Path(c.path))


def result_settings(profile: Profile) -> dict[str, Any]:
    """The settings that shape the result file, fixed when the job is prepared."""
    return {
        "output_column": profile.output_column,
        "response_format": profile.response_format,
        "id_column": profile.id_column,
        "csv_formula_guard": profile.csv_formula_guard,
        "sheet": profile.get("sheet"),
        "encoding": profile.get("encoding", "utf-8"),
    }


@dataclass
class EngineBase:
    home: Home
    config: Config
    store: EventStore
    provider: Provider | None
    prices: PriceTable
    sandbox: bool = False
    state: State = field(default_factory=State)
    _next_poll: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    _not_before: dict[tuple[str, int], float] = field(default_factory=dict)
    _cancel_sent: set[str] = field(default_factory=set)
    _next_listing: dict[tuple[str, int], float] = field(default_factory=dict)
    _requested_at: dict[tuple[str, int], float] = field(default_factory=dict)
    _corrupt_logged: set[str] = field(default_factory=set)
    _effects_checked: set[str] = field(default_factory=set)
    _download_failures: dict[tuple[str, int, str], tuple[int, float]] = field(default_factory=dict)
    _outbox_failures: dict[str, int] = field(default_factory=dict)  # job -> results not written in a row
    _merge_here: set[tuple[str, int]] = field(default_factory=set)  # chunks whose merge worker failed
    _followers: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # job -> leader -> duplicates
    _answered: dict[str, Any] = field(default_factory=dict)  # job -> its ReusePlan, when no row is left to send
    _durations: Durations = field(default_factory=Durations)  # how long the last batches of each model took
    _progress: dict[tuple[str, int], tuple[float, int]] = field(default_factory=dict)  # (when, requests done) first seen
    _finalizing: dict[tuple[str, int], float] = field(default_factory=dict)  # when a batch was first seen finishing
    _scanner: inbox_mod.InboxScanner | None = None
    idle: bool = False
    again: bool = False  # a job stopped its tick after an action with more to do now (tick again at once)
    scan_requested: bool = True  # set by the daemon when the watcher saw a change
    _last_scan: float = float("-inf")
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

    # --- plumbing -----------------------------------------------------------------------------
    def emit(self, job_id: str, *events: NewEvent, also: Callable[[Any], None] | None = None) -> None:
        job = self.state.jobs.get(job_id)
        stored = self.store.append(job_id, events, expected_version=job.version if job else 0, also=also)
        for ev in stored:
            self.state.apply(ev)
            log.info("event %s %s %s", job_id, ev.type, _short(ev.payload))

    def profile_of(self, job: JobState) -> Profile:
        return self.config.profile(job.profile)

    def reload(self, config: Config, prices: PriceTable) -> None:
        self.config, self.prices = config, prices
        if self._scanner is not None:
            self._scanner.profiles = set(config.profiles)
            self._scanner.stable_seconds = config.default.stable_seconds
        self.scan_requested = True

    @property
    def settings(self) -> Profile:
        return self.config.default

    def timers(self) -> Timers:
        return Timers(self._next_poll, self._not_before, self._cancel_sent)

    def provider_key(self) -> str:
        return provider_id_of(self.settings, self.sandbox)

    def provider_key_for(self, job: JobState) -> str:
        """Who answers a job's rows (whose stored answers they may reuse, and under whom their
        answers are stored): :func:`~batchgrader.pipeline.answerkey.provider_id_of` of its
        profile, the rule ``bgctl count`` follows too."""
        try:
            profile = self.profile_of(job)
        except ConfigError:
            return self.provider_key()
        return provider_id_of(profile, self.sandbox)

    def queue_url_for(self, of: JobState | Profile) -> str:
        """:attr:`queue_url` for one job or profile: an Azure deployment's queue (enqueued-token
        quota) is its resource endpoint's, so a limit learned there is kept per endpoint and
        deployment (the model name); every other provider's is :attr:`queue_url`."""
        try:
            profile = of if isinstance(of, Profile) else self.profile_of(of)
        except ConfigError:
            return self.queue_url
        if self.sandbox or profile.provider != "azure":
            return self.queue_url
        return str(profile.get("azure_endpoint") or "").rstrip("/")  # the client's base_url (one resource per daemon)

    def _cost(self, model: str, usage: dict[str, int]) -> float:
        try:
            price = self.prices.get(model)
        except PricingError:
            return 0.0
        return float(billed_cost(price, usage["prompt_tokens"], usage["cached_tokens"], usage["completion_tokens"]))

    # --- the provider's queue limit -----------------------------------------------------------
    def _limits(self, profile: Profile) -> Limits | None:
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

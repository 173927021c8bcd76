"""`bgctl daemon`: the long-running process around :class:`batchgrader.daemon.engine.Engine`.

Small roles, each with one job: the lock (one daemon per home, :mod:`batchgrader.core.host.lock`),
signal handlers that only set flags, one loop that runs the engine's tick and then waits on one
event (``wake``) until the earliest time anything is due (:func:`batchgrader.core.rules.due.next_due`,
paced by :class:`~batchgrader.core.rules.due.TickPace`) or a wake-up: a watchdog observer that only sets
it (the inbox, control files, :func:`~batchgrader.daemon.control.watch_control`), a signal, a
merge worker ending.  Control requests from `bgctl cancel` / `bgctl retry` are files in
``control/`` (:mod:`batchgrader.daemon.control`), so the daemon stays the only writer of the
event log; sd_notify for systemd, masked rotating logs, and the live table the CLI hands in when
it runs in a terminal, given the immutable :class:`~batchgrader.store.snapshot.Snapshot` taken
after each tick.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from batchgrader.core.configuration.config import Config, ConfigError, load_config
from batchgrader.core.configuration.watch import ConfigWatch, restart_only_changes
from batchgrader.core.host.control_files import pending_controls
from batchgrader.core.host.home import Home
from batchgrader.core.host.lock import AlreadyRunning as AlreadyRunning  # re-exported
from batchgrader.core.host.lock import DaemonError as DaemonError  # re-exported
from batchgrader.core.host.lock import InstanceLock
from batchgrader.core.host.secrets import EnvFileError, MaskSecrets
from batchgrader.core.rules.due import TickOutcome, TickPace
from batchgrader.daemon.control import apply_controls, watch_control
from batchgrader.daemon.workers import MergeWorkers
from batchgrader.pipeline.pricing import PriceTable, PricingError
from batchgrader.store.snapshot import Snapshot, take

if TYPE_CHECKING:
    from batchgrader.provider.pool import Providers

SANDBOX_KEY = "sk-sandbox-not-a-real-key"
log = logging.getLogger("batchgrader")


class DatabaseLost(DaemonError):
    """The database file was replaced or deleted under the running daemon (exit 1: a service
    manager may start it again, on the file that is there now)."""

    exit_code = 1


# --- logging with the key masked ---------------------------------------------------------------------


def setup_logging(home: Home, level: str, secrets: list[str], to_stderr: bool) -> logging.Handler:
    home.logs.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(home.logs / "daemon.log", maxBytes=5_000_000, backupCount=5, encoding="utf-8")
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    fmt.converter = time.gmtime  # UTC, like the event log (`bgctl logs --since` reads it)
    handler.setFormatter(fmt)
    mask = MaskSecrets(secrets)
    handler.addFilter(mask)
    root = logging.getLogger("batchgrader")
    root.setLevel(level)
    root.addHandler(handler)
    if to_stderr:
        err = logging.StreamHandler()
        err.setLevel(logging.WARNING)
        err.addFilter(mask)
        err.setFormatter(logging.Formatter("bgctl: %(levelname)s %(message)s"))
        root.addHandler(err)
    for noisy in ("openai", "httpx", "httpx2", "watchdog", "google_genai"):
        logging.getLogger(noisy).addFilter(mask)
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return handler


def sandbox_emulator(
    data_dir: Path, label: str = "sandbox emulator", models: tuple[str, ...] = (), models_file: Path | None = None
):
    """The emulator behind `--sandbox`, in a child process (:mod:`batchgrader.daemon.sandbox`):
    state kept under the home, so a restarted sandbox daemon finds its batches again.  It serves
    the shipped catalogue's models, ``models`` (the profiles' models: Azure deployment names) and
    the rows of ``models_file`` (the user's pricing.csv); any other model id is answered 404."""
    from batchgrader.daemon.sandbox import SandboxEmulator

    return SandboxEmulator(data_dir, SANDBOX_KEY, label, models, models_file).start()


# --- the daemon --------------------------------------------------------------------------------------


class View(Protocol):
    """What the daemon shows while it runs in a terminal (the CLI's live table): started, given
    each new snapshot on the main loop, stopped."""

    def start(self) -> None: ...
    def update(self, snapshot: Snapshot) -> None: ...
    def stop(self) -> None: ...


@dataclass
class Daemon:
    home: Home
    sandbox: bool = False
    once: bool = False
    view: View | None = None  # the live view the CLI hands in when it runs in a terminal (warnings then go to the log only)
    environ: dict[str, str] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)
    reload_requested: threading.Event = field(default_factory=threading.Event)
    heartbeat: float = field(default_factory=time.monotonic)
    snapshot: Snapshot = field(default_factory=Snapshot)  # taken after each tick, for the screen and systemd
    fatal: BaseException | None = None  # the database file was replaced or deleted: stop
    stop_reason: str = "stopped"
    emulator: Any = None  # the sandbox's emulator process, started at the first provider call (see _sandbox_url)
    emulator_lock: threading.Lock = field(default_factory=threading.Lock)
    config_watch: ConfigWatch | None = None  # config.yaml and pricing.csv as last loaded: an edit reloads them
    ticks: int = 0  # ticks run so far
    next_delay: float = 0.0  # s, the wait after the last tick (until the next due time, or a wake-up)
    shared: Any = None  # on a shared store (store_url): the leases this daemon works under (daemon/shared.py)

    def _load(self) -> tuple[Config, PriceTable]:
        from batchgrader.core.host.secrets import apply_env_file, env_file_path

        env = os.environ if self.environ is None else self.environ
        apply_env_file(env_file_path(self.home), env)  # launchd cannot load it for us; refuses unsafe modes
        from batchgrader.pipeline.catalogue import load_checked

        return load_checked(load_config(self.home, environ=self.environ))

    def _providers(self, config: Config) -> Providers:
        """The providers a profile uses, by name (:class:`~batchgrader.provider.pool.Providers`):
        a job's calls go to the one recorded for the job.  A provider first used after a reload
        needs a restart.

        Each is built (its SDK imported, its client made, the sandbox's emulator started) at its
        first call, or ahead of it while a job with rows for it is prepared: a daemon whose jobs
        are answered from the answers store never pays for them.  What can be refused (a missing
        key or endpoint) is checked here, at start-up; outside the sandbox a provider whose spec
        says so is built now, so that its constructor refuses a missing key."""
        from batchgrader.core.configuration.config import provider_key_problem
        from batchgrader.provider.pool import Providers
        from batchgrader.provider.registry import PROVIDERS

        used = {p.values["provider"] for p in (config.default, *config.profiles.values())}
        if not self.sandbox and not config.api_key and "openai" in used:
            raise DaemonError(
                "no API key: set OPENAI_API_KEY (or run `bgctl daemon --sandbox` to try it with the local emulator)"
            )
        problem = provider_key_problem(config, sandbox=self.sandbox)
        if problem:
            raise DaemonError(problem)
        builders = {name: self._adapter_factory(spec, config) for name, spec in PROVIDERS.items() if name in used}
        if "openai" not in used and (self.sandbox or config.api_key):  # a job of an older log may still be OpenAI's
            builders["openai"] = self._adapter_factory(PROVIDERS["openai"], config)
        providers = Providers(builders)
        for name in builders:
            if PROVIDERS[name].built_at_start and not self.sandbox:
                providers.get(name)
        return providers

    def _sandbox_url(self, root: bool = True, config: Config | None = None) -> str:
        """The emulator's URL (its root, or its OpenAI ``/v1`` base), started at the first call
        (serving ``config``'s models and its pricing file's besides the shipped catalogue's); two
        providers built at once (one ahead, in the background) start one."""
        with self.emulator_lock:
            if self.emulator is None:
                models = (
                    tuple(sorted({str(p.values["model"]) for p in (config.default, *config.profiles.values())})) if config else ()
                )
                self.emulator = sandbox_emulator(
                    self.home.root / "sandbox",
                    f"sandbox emulator of {self.home.root}",
                    models,
                    config.pricing_path() if config is not None else None,
                )
        return str(self.emulator.root_url if root else self.emulator.base_url)

    def _adapter_factory(self, spec, config: Config) -> Callable[[], Any]:  # noqa: ANN001
        """Build ``spec``'s batch adapter: with the profile settings' key and API base, or in the
        sandbox with the emulator's (started at the first call)."""
        timeout = config.request_timeout_seconds

        def build() -> Any:
            if self.sandbox:
                return spec.batch(SANDBOX_KEY, self._sandbox_url(spec.sandbox_base == "root", config), timeout, config)
            facts = spec.facts
            return spec.batch(getattr(config, facts.key_setting), getattr(config, facts.base_setting), timeout, config)

        return build

    def _sandbox_counter(self, config: Config):  # noqa: ANN202
        """The counting hook in the sandbox: the emulator's count_tokens, cached apart from real counts
        (the provider's SDK is imported, and the emulator started, only when a profile of a provider
        with a sandbox counter counts)."""
        from batchgrader.provider.registry import PROVIDERS

        timeout = config.request_timeout_seconds

        def counter(profile):  # noqa: ANN001, ANN202
            spec = PROVIDERS.get(profile.provider)
            if spec is None or spec.sandbox_counter is None:
                return None
            return spec.sandbox_counter(SANDBOX_KEY, self._sandbox_url(True, config), timeout)

        return counter

    def install_signal_handlers(self) -> None:
        def on_stop(signum, frame):  # noqa: ANN001
            self.stop_reason = f"signal {signal.Signals(signum).name}"
            self.stop.set()
            self.wake.set()

        def on_hup(signum, frame):  # noqa: ANN001
            self.reload_requested.set()
            self.wake.set()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    def run(self) -> int:

        os.umask(0o077)
        self.home.ensure()
        self.emulator = None
        self.config_watch = ConfigWatch([self.home.config_file, self.home.pricing_file])  # before the load it watches
        try:
            config, prices = self._load()
        except (ConfigError, PricingError, EnvFileError) as exc:
            raise DaemonError(str(exc)) from None
        # the home's SQLite file: one daemon per home, by the file lock; a shared store
        # (store_url): any number, each job and provider account under a lease (daemon/shared.py)
        lock = None if config.store_url else InstanceLock(self.home.lock_file)
        if lock is not None:
            lock.acquire()
        try:
            setup_logging(
                self.home,
                config.log_level,
                config.secret_values(os.environ),  # every registered provider's key, and every secret setting
                to_stderr=self.view is None,
            )
            try:
                return self._serve(config, prices)
            except BaseException as exc:
                self.stop_reason = f"error: {exc}" if isinstance(exc, Exception) else type(exc).__name__
                raise
            finally:
                log.info("daemon stopped (pid %s): %s", os.getpid(), self.stop_reason)
        finally:
            if self.emulator is not None:
                self.emulator.stop()
            if lock is not None:
                lock.release()

    def _serve(self, config: Config, prices: PriceTable) -> int:
        from batchgrader.core.host.sdnotify import Notifier
        from batchgrader.daemon.engine import Engine
        from batchgrader.pipeline.inbox import InboxWatcher
        from batchgrader.store.backend import open_store
        from batchgrader.store.eventstore import EventStore, SchemaTooNew

        log.info(
            "daemon starting (pid %s, home %s%s%s)",
            os.getpid(),
            self.home.root,
            ", SANDBOX: simulated results" if self.sandbox else "",
            ", --once" if self.once else "",
        )
        providers = self._providers(config)
        try:
            store = open_store(self.home, config.store_url)  # store_url: PostgreSQL; else the home's SQLite file
        except (SchemaTooNew, ConnectionError) as exc:
            raise DaemonError(str(exc)) from None
        except sqlite3.DatabaseError as exc:  # e.g. the file was removed while it was being opened
            raise DaemonError(f"cannot open the event log {self.home.db}: {exc}") from None
        try:
            engine = Engine(self.home, config, store, providers, prices, sandbox=self.sandbox)
            if not isinstance(store, EventStore):  # fold what other daemons append; work under leases
                self.shared = engine.share_store(wake=self.wake.set)
        except BaseException:
            self._let_go(store)
            raise
        if self.sandbox:
            engine.ctx.token_counter = self._sandbox_counter(config)
        engine.ctx.should_stop = self.stop.is_set
        engine.ctx.on_progress = self._beat
        engine.ctx.merge_workers = MergeWorkers(wake=self.wake.set)
        self.engine = engine
        engine.startup(time.time())
        self._controls(engine)
        self._publish()
        notifier = Notifier()
        notifier.ready()
        log.info("daemon ready: %d jobs in the log", len(engine.ctx.state.jobs))
        watcher = InboxWatcher(self.home, self.wake)
        watch_control(watcher.observer, self.home, self.wake)
        watcher.start()
        feeder = WatchdogFeeder(notifier, lambda: self.heartbeat)
        feeder.start()
        try:
            code = self._main_loop(engine, notifier, self._tick, TickPace.of(config.poll_interval_seconds))
            if self.fatal is not None:
                raise DatabaseLost(str(self.fatal))
            return code
        finally:
            feeder.stop()
            notifier.stopping()
            watcher.stop()
            self._let_go(store)

    def _let_go(self, store: Any) -> None:
        """Release this daemon's leases (a shared store) and close the store."""
        try:
            if self.shared is not None:
                self.shared.release_all()
        finally:
            store.close()

    def _beat(self) -> None:
        self.heartbeat = time.monotonic()
        if self.shared is not None and self.fatal is None:
            try:
                self.shared.keep()  # a long step renews its leases as it feeds the watchdog
            except Exception as exc:  # noqa: BLE001 - the database unreachable: the leases lapse, appends fail
                log.warning("could not renew the leases: %s", exc)

    def _tick(self) -> TickOutcome:
        """One tick: a pending reload, control requests, the engine's tick; then when the next
        is due (:meth:`Engine.next_due`)."""
        from batchgrader.store.eventstore import DatabaseMoved

        if self.stop.is_set():
            return TickOutcome(None, time.monotonic())
        failed = False
        try:
            self._reload_if_asked()
            self._controls(self.engine)
            self.engine.ctx.store.check_file()
            self.engine.tick(time.time(), time.monotonic())  # wall for timestamps, monotonic for waits
            failed = self.engine.failed
        except DatabaseMoved as exc:
            log.error("%s", exc)
            self.fatal = exc
            self.stop.set()
            self.wake.set()
        except Exception as exc:  # the daemon keeps serving; the error is logged
            log.exception("tick failed: %s", exc)
            failed = True
        finally:
            self._publish()
            self._beat()
        mono = time.monotonic()
        try:
            due = self.engine.next_due(mono, time.time())
        except Exception as exc:  # never left without a next tick
            log.exception("next due time: %s", exc)
            return TickOutcome(None, mono, failed=True)
        return TickOutcome(due, mono, again=self.engine.again, failed=failed)

    def _reload_if_asked(self) -> None:
        """Reload config.yaml and pricing.csv when either changed or SIGHUP asked for it (the old
        configuration stays when the new one cannot be loaded)."""
        edited = self.config_watch.changed() if self.config_watch is not None else []
        if edited:
            log.info("%s changed: reloading the configuration", ", ".join(p.name for p in edited))
            self.reload_requested.set()
        if not self.reload_requested.is_set():
            return
        self.reload_requested.clear()
        try:
            config, prices = self._load()
            restart = restart_only_changes(self.engine.ctx.config, config)
            self.engine.reload(config, prices)
            log.info("configuration reloaded")
            if restart:
                log.warning(
                    "configuration reloaded, but these changes apply only after a restart "
                    "(bgctl daemon, or the service's restart): %s",
                    ", ".join(restart),
                )
        except (ConfigError, Exception) as exc:  # keep running on the old config
            log.error("config reload failed, keeping the old configuration: %s", exc)

    def _publish(self) -> None:
        """Take a snapshot for the screen and systemd (on the thread that owns the state)."""
        try:
            self.snapshot = take(self.engine.ctx.state)
        except Exception as exc:  # the screen must never stop the daemon
            log.exception("snapshot failed: %s", exc)

    def _controls(self, engine) -> None:  # noqa: ANN001
        apply_controls(engine, self.home)

    def _done_once(self, engine) -> bool:  # noqa: ANN001
        return engine.idle and not pending_controls(self.home)

    def _main_loop(self, engine, notifier, tick: Callable[[], TickOutcome], pace: TickPace) -> int:  # noqa: ANN001
        """The daemon's one loop: a tick, the screen and systemd's status given its snapshot, then
        one wait on ``wake`` until the next tick is due (:meth:`TickPace.delay` of the tick's
        outcome) or a wake-up (the inbox watcher, a request in ``control/``, a signal, a merge
        worker ending: the inbox is then scanned at once); with ``--once``, stop when every job
        has ended."""
        view = self.view
        last_status = ""
        overdue = False
        try:
            if view:
                view.start()
            while not self.stop.is_set():
                outcome = tick()
                self.ticks += 1
                self.next_delay, overdue = pace.delay(outcome, overdue)
                log.debug("tick %d done: next in %.3f s", self.ticks, self.next_delay)
                snapshot = self.snapshot
                line = snapshot.status_line(self.sandbox)
                if line != last_status:  # systemd needs it only when it changes
                    notifier.status(line)
                    last_status = line
                if view:
                    view.update(snapshot)
                if self.once and self._done_once(engine):
                    self.stop_reason = "--once: every job has ended"
                    break
                if not self.stop.is_set() and self.wake.wait(timeout=self.next_delay):
                    self.wake.clear()
                    engine.scan_requested = True
        finally:
            if view:
                view.stop()
        return 0


class WatchdogFeeder:
    """Feeds systemd's watchdog (when it asks for one) every half ``WatchdogSec`` from a thread of
    its own, as long as the daemon's heartbeat (a tick, or progress within a long step) is less
    than :data:`STALE_HEARTBEAT` seconds old: a long step is not taken for a hang, a hang is."""

    def __init__(self, notifier: Any, heartbeat: Callable[[], float]) -> None:
        self.notifier = notifier
        self.heartbeat = heartbeat
        self.interval = notifier.watchdog_interval()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval:
            self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self.interval
        while not self._stop.wait(self.interval):
            if time.monotonic() - self.heartbeat() < STALE_HEARTBEAT:
                self.notifier.watchdog()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


#: s, how old the heartbeat may be for systemd's watchdog to be fed
STALE_HEARTBEAT = 600.0

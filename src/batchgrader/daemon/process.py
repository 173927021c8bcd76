"""`bgctl daemon`: the long-running process around :class:`batchgrader.engine.Engine`.

Small roles, each with one job: a lock (one daemon per home), signal handlers that only set
flags, an APScheduler job that runs the engine's tick, a watchdog observer that only wakes it,
control requests from `bgctl cancel` / `bgctl retry` (files in ``control/``, so the daemon stays
the only writer of the event log), sd_notify for systemd, masked rotating logs, and a live table
when attached to a terminal.  Only the tick thread touches the engine's state; the main loop's
status line and live table read the immutable :class:`~batchgrader.daemon.snapshot.Snapshot` it
publishes after each tick.
"""

from __future__ import annotations

import fcntl
import json
import logging
import logging.handlers
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from batchgrader.core.config import Config, ConfigError, load_config
from batchgrader.core.home import Home
from batchgrader.daemon.snapshot import Snapshot, take
from batchgrader.ops.service import ServiceError
from batchgrader.pipeline.pricing import PriceTable, PricingError, load_pricing
from batchgrader.secrets import EnvFileError, MaskSecrets

SANDBOX_KEY = "sk-sandbox-not-a-real-key"
CONTROL_DIR = "control"
log = logging.getLogger("batchgrader")


class DaemonError(RuntimeError):
    """A reason the daemon cannot start, with the fix in the message. Exit code 78 (EX_CONFIG):
    the service unit does not restart on it (RestartPreventExitStatus=78)."""

    exit_code = 78


# --- single instance --------------------------------------------------------------------------


class AlreadyRunning(DaemonError):
    exit_code = 75  # EX_TEMPFAIL


class InstanceLock:
    """flock on ``daemon.lock``: released by the kernel when the process dies (even kill -9)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid = os.read(fd, 32).decode().strip()
            finally:
                os.close(fd)
            raise AlreadyRunning(
                f"another bgctl daemon (pid {pid or '?'}) is already running for {self.path.parent}; "
                "stop it first, or use another --home"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def daemon_pid(home: Home) -> int | None:
    """The pid of the daemon holding the home's lock, or None."""
    if not home.lock_file.exists():
        return None
    fd = os.open(home.lock_file, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# --- control requests (bgctl cancel / retry) --------------------------------------------------------


def request_control(home: Home, action: str, job_id: str, reason: str = "") -> Path:
    """Queue a request for the daemon (atomic file in ``control/``)."""
    from batchgrader.fsio import atomic_write_bytes

    folder = home.root / CONTROL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.time_ns()}-{action}-{uuid.uuid4().hex[:8]}.json"
    atomic_write_bytes(path, json.dumps({"action": action, "job_id": job_id, "reason": reason}).encode())
    return path


def pending_controls(home: Home) -> list[Path]:
    folder = home.root / CONTROL_DIR
    return sorted(p for p in folder.glob("*.json") if not p.name.startswith(".")) if folder.is_dir() else []


# --- logging with the key masked ---------------------------------------------------------------------


def setup_logging(home: Home, level: str, secrets: list[str], to_stderr: bool) -> logging.Handler:
    home.logs.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(home.logs / "daemon.log", maxBytes=5_000_000, backupCount=5, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
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
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "skipped: max instances" is expected while a tick runs
    for noisy in ("openai", "httpx", "httpx2", "watchdog"):
        logging.getLogger(noisy).addFilter(mask)
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return handler


def sandbox_emulator(data_dir: Path):
    """The in-process emulator behind `--sandbox`: state kept under the home, so a restarted
    sandbox daemon finds its batches again."""
    from batchgrader.provider.emulator import Emulator, EmulatorConfig

    data_dir.mkdir(parents=True, exist_ok=True)
    return Emulator(
        EmulatorConfig(api_key=SANDBOX_KEY, data_dir=str(data_dir), validating_s=0.5, in_progress_s=1.5, finalizing_s=0.5)
    ).start()


# --- the daemon --------------------------------------------------------------------------------------


@dataclass
class Daemon:
    home: Home
    sandbox: bool = False
    once: bool = False
    live: bool = False
    environ: dict[str, str] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)
    reload_requested: threading.Event = field(default_factory=threading.Event)
    heartbeat: float = field(default_factory=time.monotonic)
    tick_error: BaseException | None = None
    snapshot: Snapshot = field(default_factory=Snapshot)  # replaced by the tick thread, read by the main loop

    def make_projectors(self) -> list:
        from batchgrader.store.readmodels import projectors

        return projectors()

    def _load(self) -> tuple[Config, PriceTable]:
        from batchgrader.secrets import apply_env_file, env_file_path

        env = os.environ if self.environ is None else self.environ
        apply_env_file(env_file_path(self.home), env)  # launchd cannot load it for us; refuses unsafe modes
        config = load_config(self.home, environ=self.environ)
        prices = load_pricing(config.pricing_path())
        return config, prices

    def _provider(self, config: Config):
        from batchgrader.provider.openai_api import OpenAIProvider

        if self.sandbox:
            self.emulator = sandbox_emulator(self.home.root / "sandbox")
            return OpenAIProvider(api_key=SANDBOX_KEY, base_url=self.emulator.base_url, timeout=config.request_timeout_seconds)
        if not config.api_key:
            raise DaemonError(
                "no API key: set OPENAI_API_KEY (or run `bgctl daemon --sandbox` to try it with the local emulator)"
            )
        return OpenAIProvider(api_key=config.api_key, base_url=config.base_url, timeout=config.request_timeout_seconds)

    def install_signal_handlers(self) -> None:
        def on_stop(signum, frame):  # noqa: ANN001
            self.stop.set()
            self.wake.set()

        def on_hup(signum, frame):  # noqa: ANN001
            self.reload_requested.set()
            self.wake.set()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    def run(self) -> int:
        from apscheduler.schedulers.background import BackgroundScheduler

        from batchgrader.daemon.engine import Engine
        from batchgrader.daemon.notify import Notifier
        from batchgrader.pipeline.inbox import InboxWatcher
        from batchgrader.store.eventstore import EventStore

        os.umask(0o077)
        self.home.ensure()
        lock = InstanceLock(self.home.lock_file)
        lock.acquire()
        self.emulator = None
        try:
            try:
                config, prices = self._load()
            except (ConfigError, PricingError, ServiceError, EnvFileError) as exc:
                raise DaemonError(str(exc)) from None
            setup_logging(self.home, config.log_level, [config.api_key or ""], to_stderr=not self.live)
            provider = self._provider(config)
            store = EventStore(self.home.db, projectors=self.make_projectors())
            engine = Engine(self.home, config, store, provider, prices, sandbox=self.sandbox)
            engine.should_stop = self.stop.is_set
            engine.on_progress = self._beat
            self.engine = engine
            log.info(
                "daemon starting (pid %s, home %s%s)",
                os.getpid(),
                self.home.root,
                ", SANDBOX: simulated results" if self.sandbox else "",
            )
            engine.startup(time.time())
            self._controls(engine)
            self._publish()
            notifier = Notifier()
            notifier.ready()
            watcher = InboxWatcher(self.home, self.wake)
            watcher.start()
            tick_seconds = max(0.05, min(0.5, config.poll_interval_seconds / 2))
            scheduler = BackgroundScheduler()
            job = scheduler.add_job(
                self._tick, "interval", seconds=tick_seconds, max_instances=1, coalesce=True, misfire_grace_time=None
            )
            scheduler.start()
            try:
                return self._main_loop(engine, notifier, job, tick_seconds)
            finally:
                notifier.stopping()
                watcher.stop()
                scheduler.shutdown(wait=True)  # lets a running tick finish its step
                store.close()
        finally:
            if self.emulator is not None:
                self.emulator.stop()
            lock.release()

    def _beat(self) -> None:
        self.heartbeat = time.monotonic()

    def _tick(self) -> None:
        if self.stop.is_set():
            return
        try:
            if self.reload_requested.is_set():
                self.reload_requested.clear()
                try:
                    config, prices = self._load()
                    self.engine.reload(config, prices)
                    log.info("configuration reloaded")
                except (ConfigError, Exception) as exc:  # keep running on the old config
                    log.error("config reload failed, keeping the old configuration: %s", exc)
            self._controls(self.engine)
            self.engine.tick(time.time())
            self.tick_error = None
        except Exception as exc:  # the daemon keeps serving; the error is logged and shown
            self.tick_error = exc
            log.exception("tick failed: %s", exc)
        finally:
            self._publish()
            self._beat()

    def _publish(self) -> None:
        """Take a snapshot for the screen and systemd (on the thread that owns the state)."""
        try:
            self.snapshot = take(self.engine.state)
        except Exception as exc:  # the screen must never stop the daemon
            log.exception("snapshot failed: %s", exc)

    def _controls(self, engine) -> None:  # noqa: ANN001
        from batchgrader.store.eventstore import NewEvent

        for path in pending_controls(self.home):
            try:
                req = json.loads(path.read_text())
                job = engine.state.jobs.get(req.get("job_id"))
                if job is None:
                    log.warning("control request for unknown job %s ignored", req.get("job_id"))
                elif req.get("action") == "cancel" and not job.terminal:
                    engine.emit(job.job_id, NewEvent("CancelRequested", {"reason": req.get("reason", "")}))
                elif req.get("action") == "retry" and (job.terminal or job.held):
                    engine.emit(job.job_id, NewEvent("RetryRequested", {"reason": req.get("reason", "")}))
            except (OSError, ValueError) as exc:
                log.warning("bad control request %s: %s", path.name, exc)
            path.unlink(missing_ok=True)

    def _done_once(self, engine) -> bool:  # noqa: ANN001
        return engine.idle and not pending_controls(self.home)

    def _main_loop(self, engine, notifier, job, tick_seconds: float) -> int:  # noqa: ANN001
        from batchgrader.cli.render import LiveView

        view = LiveView(sandbox=self.sandbox) if self.live else None
        wd = notifier.watchdog_interval()
        last_wd = 0.0
        last_status = ""
        try:
            if view:
                view.start()
            while not self.stop.is_set():
                if self.wake.wait(timeout=tick_seconds):
                    self.wake.clear()
                    engine.scan_requested = True
                    job.modify(next_run_time=datetime.now(UTC))
                now = time.monotonic()
                if wd and now - last_wd >= wd and now - self.heartbeat < 600:
                    notifier.watchdog()
                    last_wd = now
                snapshot = self.snapshot  # one read: an immutable value the tick thread replaces
                line = snapshot.status_line(self.sandbox)
                if line != last_status:  # systemd needs it only when it changes
                    notifier.status(line)
                    last_status = line
                if view:
                    view.update(snapshot)
                if self.once and self._done_once(engine):
                    break
        finally:
            if view:
                view.stop()
        return 0

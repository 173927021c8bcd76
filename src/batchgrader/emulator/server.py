"""The emulator object (start, stop, inspection, control) and the ``bgctl emulator`` command."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from batchgrader.emulator.config import SIMULATED_BANNER, EmulatorConfig
from batchgrader.emulator.faults import Fault
from batchgrader.emulator.routing import _Handler
from batchgrader.emulator.store import Store


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128


class Emulator:
    """The emulator: ``with Emulator(EmulatorConfig(...)) as emu: OpenAI(base_url=emu.base_url, ...)``."""

    def __init__(self, config: EmulatorConfig | None = None, **overrides: Any):
        config = config or EmulatorConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self.store = Store(config)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> Emulator:
        if self._server is not None:
            return self
        self._stopping.clear()
        handler = type("_BoundHandler", (_Handler,), {"emulator": self})
        self._server = _Server((self.config.host, self.config.port), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, name="batch-emulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None
        self.store.stop_background()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("emulator not started")
        return int(self._server.server_address[1])

    @property
    def root_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    # --- inspection and control ------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def request_count(self, method: str, route: str) -> int:
        """Calls received for a route template, e.g. ``("POST", "/v1/batches")``,
        ``("GET", "/v1/batches/{id}")`` (faulted calls included)."""
        with self.store.lock:
            return self.store.state.requests.get(f"{method.upper()} {route}", 0)

    def batches_created(self) -> int:
        """Batches that exist because a POST /v1/batches took effect (faulted ones included)."""
        with self.store.lock:
            return self.store.state.batches_created

    def files_created(self) -> int:
        """Files uploaded through POST /v1/files that took effect (outputs not counted)."""
        with self.store.lock:
            return self.store.state.files_created

    def background_jobs(self) -> int:
        """The emulator's own background jobs (parsing and counting input files, drafting the
        answers of running batches) queued or running; 0 when it has nothing left to do."""
        return self.store.background_jobs()

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self.store.batches.retrieve_batch(batch_id)

    def batches(self) -> list[dict[str, Any]]:
        """Every batch, oldest first, as the API would show it now."""
        with self.store.lock:
            self.store.batches.advance_all()
            return [self.store.batches.view(b) for b in sorted(self.store.state.batches.values(), key=lambda b: b.seq)]

    def file_bytes(self, file_id: str) -> bytes:
        return self.store.files.file_content(file_id)

    def script_fault(self, method: str, path: str, fault: Fault | str, times: int = 1, **kwargs: Any) -> None:
        """Inject ``fault`` into the next ``times`` calls matching ``method`` (or ``*``) and
        ``path`` (a route template such as ``/v1/batches/{id}`` or an fnmatch pattern of the path)."""
        if isinstance(fault, str):
            fault = Fault(fault, **kwargs)
        self.store.faults.script_fault(method, path, fault, times)

    def clear_faults(self) -> None:
        self.store.faults.clear_faults()

    def expire_batch(self, batch_id: str, completed: int | None = None) -> dict[str, Any]:
        return self.store.batches.expire_batch(batch_id, completed)


def serve_forever(
    port: int = 0,
    faults: str = "none",
    seed: int = 0,
    data_dir: str | None = None,
    *,
    host: str = "127.0.0.1",
    ready: Callable[[Emulator], None] | None = None,
    stop_event: threading.Event | None = None,
    **config: Any,
) -> None:
    """Run an emulator until ``stop_event`` is set or KeyboardInterrupt."""
    emu = Emulator(EmulatorConfig(host=host, port=port, faults=faults, seed=seed, data_dir=data_dir, **config)).start()
    try:
        if ready is not None:
            ready(emu)
        (stop_event or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        emu.stop()


def run_emulator(port: int, faults: str, seed: int, data_dir: str | None, **config: Any) -> None:
    """The ``bgctl emulator`` command: print the banner and base URL, serve until interrupted.

    Phase durations default to a few seconds so a person can watch a batch move."""
    config.setdefault("validating_s", 2.0)
    config.setdefault("in_progress_s", 5.0)
    config.setdefault("finalizing_s", 2.0)
    config.setdefault("cancelling_s", 2.0)

    def ready(emu: Emulator) -> None:
        print("=" * 64, flush=True)
        print(f"  {SIMULATED_BANNER}", flush=True)
        print(f"  base URL: {emu.base_url}", flush=True)
        print(f"  faults: {faults}  seed: {seed}  data: {data_dir or '(in memory)'}", flush=True)
        print(f"  stats: {emu.root_url}/_emulator/stats", flush=True)
        print("  export OPENAI_BASE_URL=" + emu.base_url + "  (any non-empty OPENAI_API_KEY works)", flush=True)
        print("  Anthropic: ANTHROPIC_BASE_URL=" + emu.root_url + "   Gemini: GOOGLE_GEMINI_BASE_URL=" + emu.root_url, flush=True)
        print(
            "  Azure OpenAI: export AZURE_OPENAI_ENDPOINT=" + emu.root_url + "  (any non-empty AZURE_OPENAI_API_KEY)", flush=True
        )
        print("  Ctrl-C to stop.", flush=True)
        print("=" * 64, flush=True)

    serve_forever(port, faults, seed, data_dir, ready=ready, **config)

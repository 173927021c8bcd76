"""A rig for tick-level tests: a real Engine and EventStore on a tmp SQLite file, the in-memory
provider, and a clock the test moves.  No subprocess, no HTTP, no sleeps."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.core.log.state import JobState
from batchgrader.daemon.engine import Engine
from batchgrader.emulator.config import token_limit_message
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.memory import MemoryProvider
from batchgrader.store.eventstore import EventStore, NewEvent

BASE_CONFIG = "stable_seconds: 0\npoll_interval_seconds: 2\nmax_completion_tokens: 50\n"

#: several daemons on one store: their leases' lifetime (lease_seconds), and the longest a call may
#: take (request_timeout_seconds 5, in SHARED_CONFIG, plus the call margin)
SHARED_TTL, SHARED_BOUND = 30.0, 6.0
SHARED_CONFIG = f"request_timeout_seconds: 5\nlease_seconds: {SHARED_TTL}\n"


def shared_engines(
    home: Home, pg_url: str, provider: Any, clock: Any, names: str = "ab", read_models: bool = False
) -> tuple[list[Any], dict[str, Engine]]:
    """Daemons named by the letters of ``names`` on one PostgreSQL store and ``home``: each an
    Engine on its own connection (with the read models a daemon keeps when ``read_models``) and
    under its own leases, decided at ``clock()``; all with ``provider``, one provider account."""
    from batchgrader.daemon.shared import SharedWork
    from batchgrader.store.leases import Leases
    from batchgrader.store.pg_readmodels import projectors
    from batchgrader.store.pgstore import PostgresEventStore

    stores = [PostgresEventStore(pg_url, projectors=projectors() if read_models else ()) for _ in names]
    config = load_config(home, environ={})
    engines: dict[str, Engine] = {}
    for name, store in zip(names, stores, strict=True):
        engine = Engine(home, config, store, provider, load_pricing())
        engine.share(SharedWork(Leases(store, name), SHARED_TTL, SHARED_BOUND, clock=clock))
        engines[name] = engine
    return stores, engines


def config_text(config: str) -> str:
    """The rig's config: the preflight is off unless the test's own config sets it."""
    return BASE_CONFIG + ("" if "preflight_rows" in config else "preflight_rows: 0\n") + config


class Rig:
    def __init__(self, home: Home, config: str = "") -> None:
        self.home = home
        home.config_file.write_text(config_text(config))
        self.store = EventStore(home.db)
        self.provider = MemoryProvider()
        self.now = 1_000_000.0
        self.provider.now = self.now
        self.engine = Engine(home, load_config(home, environ={}), self.store, self.provider, load_pricing())

    def close(self) -> None:
        self.store.close()

    def reconfigure(self, config: str) -> None:
        self.home.config_file.write_text(config_text(config))
        self.engine.reload(load_config(self.home, environ={}), load_pricing())

    def tick(self, seconds: float = 1.0) -> list[str]:
        """Move the clock and run one tick; the types of the events it appended."""
        before = self.store.last_seq()
        self.now += seconds
        self.provider.now = self.now
        self.engine.tick(self.now)
        return [e.type for e in self.store.read(after=before)]

    def drop(self, rows: int, name: str = "a.csv", text: str = "review") -> JobState:
        """Put a file in the inbox and tick until its job is prepared."""
        (self.home.inbox / name).write_text("id,response\n" + "".join(f"{i},{text} {i}\n" for i in range(rows)))
        self.tick()  # first look
        assert self.tick()[:2] == ["JobAccepted", "JobPrepared"]
        return self.job()

    def run_file(self, name: str, texts: list[str]) -> JobState:
        """Drop a file ``id,response`` of ``texts`` and tick (finishing every batch) until its job has ended."""
        (self.home.inbox / name).write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))
        for _ in range(40):
            self.tick()
            self.provider.finish_all()
            jobs = [j for j in self.engine.ctx.state.jobs.values() if j.file == name]
            if jobs and jobs[-1].ended:
                return jobs[-1]
        raise AssertionError(f"{name} did not end")

    def job(self) -> JobState:
        (job,) = [j for j in self.engine.ctx.state.jobs.values() if not j.rejected]
        return job

    def control(self, type_: str, **payload: Any) -> None:
        self.engine.ctx.emit(self.job().job_id, NewEvent(type_, {"reason": "test", **payload}))

    def events(self, type_: str) -> list[dict[str, Any]]:
        return [e.payload for e in self.store.read() if e.type == type_]

    def result_rows(self, name: str = "a_results.csv") -> list[dict[str, str]]:
        return list(csv.DictReader(io.StringIO((self.home.outbox / name).read_text(encoding="utf-8"))))

    def calls(self, op: str) -> int:
        return sum(1 for o, _ in self.provider.calls if o == op)


def refusal(limit: int) -> list[tuple[str, str]]:
    """The errors of a batch refused for the enqueued-token limit (``finish(..., errors=...)``),
    with the real API's message stating ``limit``."""
    return [("token_limit_exceeded", token_limit_message("gpt-5.4-mini", "org-x", limit))]


def leftovers(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.name.startswith(".")]

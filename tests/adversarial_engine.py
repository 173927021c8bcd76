"""Run the real engine in this process against a real emulator (real SDK, real HTTP).

Used by the issue-10 adversarial tests: the daemon's own tick, driven with the wall clock,
until a condition holds; nothing is mocked."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.daemon.engine import Engine
from batchgrader.emulator import Emulator
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.openai_api import OpenAIProvider
from batchgrader.store.eventstore import EventStore
from harness import FAST_CONFIG, TEST_KEY


def make_engine(home: Home, emu: Emulator | None, store: EventStore, extra_config: str = "") -> Engine:
    # the rules tested here start at prepare: the preflight (tests/test_preflight*.py) is off
    home.config_file.write_text(FAST_CONFIG + ("" if "preflight_rows" in extra_config else "preflight_rows: 0\n") + extra_config)
    cfg = load_config(home, environ={})
    provider = None
    if emu is not None:
        provider = OpenAIProvider(
            api_key=TEST_KEY,
            base_url=emu.base_url,
            timeout=cfg.request_timeout_seconds,
            max_retries=0,  # every fault reaches the engine's own rules (the SDK's retries: test_provider.py)
        )
    return Engine(home, cfg, store, provider, load_pricing())


def run_until(engine: Engine, cond: Callable[[], Any], timeout: float = 60.0, started: bool = False) -> Any:
    """Tick (as the daemon does, with the wall clock) until ``cond()`` is truthy."""
    if not started:
        engine.startup(time.time())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engine.tick(time.time(), time.monotonic())  # as the daemon does: wall for stamps, monotonic for waits
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"engine did not reach the condition within {timeout}s")


def all_ended(engine: Engine) -> bool:
    return bool(engine.ctx.state.jobs) and all(j.ended for j in engine.ctx.state.jobs.values())


def write_rows(path, n: int) -> None:
    path.write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(n)))


class CreateTracker:
    """Counts POST /v1/batches received and carried out, so a test can wait for late ones."""

    def __init__(self) -> None:
        self.seen: Counter = Counter()

    def __call__(self, method: str, route: str, phase: str) -> None:
        if method == "POST" and route == "/v1/batches":
            self.seen[phase] += 1

    def settled(self) -> bool:
        return self.seen["received"] == self.seen["effected"]


def paid_per_key(emu: Emulator) -> Counter:
    """bg_key -> batches that answered at least one request (a request answered twice is paid twice)."""
    out: Counter = Counter()
    for b in emu.batches():
        if (b["request_counts"] or {}).get("completed", 0) or (b["request_counts"] or {}).get("failed", 0):
            out[b["metadata"]["bg_key"]] += 1
    return out

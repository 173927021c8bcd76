"""Run the real engine in this process against a real emulator (real SDK, real HTTP).

Used by the issue-10 adversarial tests: the daemon's own tick, driven with the wall clock,
until a condition holds; nothing is mocked."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from batchgrader.core.config import load_config
from batchgrader.core.home import Home
from batchgrader.daemon.engine import Engine
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.emulator import Emulator
from batchgrader.provider.openai_api import OpenAIProvider, RetryPolicy
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
            retry=RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05),
        )
    return Engine(home, cfg, store, provider, load_pricing())


def run_until(engine: Engine, cond: Callable[[], Any], timeout: float = 60.0, started: bool = False) -> Any:
    """Tick (as the daemon does, with the wall clock) until ``cond()`` is truthy."""
    if not started:
        engine.startup(time.time())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engine.tick(time.time())
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"engine did not reach the condition within {timeout}s")


def all_ended(engine: Engine) -> bool:
    return bool(engine.state.jobs) and all(j.ended for j in engine.state.jobs.values())

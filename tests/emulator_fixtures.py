"""Fixtures and helpers shared by the emulator, provider and results tests.

Import the fixtures you use into a test module (``from emulator_fixtures import emu, ...``).
Everything talks to a real emulator over real HTTP with the real SDK; nothing is mocked.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import openai
import pytest

from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.provider.openai_api import OpenAIProvider
from batchgrader.provider.tls import httpx_context

API_KEY = "sk-emulator-test-key-0123456789abcdef"
MODEL = "gpt-5.4-mini"
CHAT = "/v1/chat/completions"


def chat_line(
    custom_id: str, content: str, *, model: str = MODEL, url: str = CHAT, system: str | None = None, **body: Any
) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": model, "messages": messages, **body}}


def jsonl(items: Iterable[dict[str, Any] | str]) -> bytes:
    return ("\n".join(i if isinstance(i, str) else json.dumps(i) for i in items) + "\n").encode("utf-8")


def simple_input(n: int, *, prefix: str = "row", **kw: Any) -> bytes:
    return jsonl(chat_line(f"{prefix}-{i}", f"Grade essay number {i}: the quick brown fox.", **kw) for i in range(n))


def wait_for(cond: Callable[[], Any], timeout: float = 5.0, interval: float = 0.01) -> Any:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


class RecordingSleep:
    """An injectable sleep (reconciliation's settle wait): records each requested wait and
    advances a ManualClock by it (if given) instead of blocking."""

    def __init__(self, clock: ManualClock | None = None):
        self.calls: list[float] = []
        self.clock = clock

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if self.clock is not None:
            self.clock.advance(seconds)


def run_to_terminal(client: openai.OpenAI, clock: ManualClock, batch_id: str, step: float = 0.05, limit: int = 200) -> Any:
    """Advance the manual clock step by step, retrieving the batch, until it is terminal."""
    for _ in range(limit):
        b = client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        clock.advance(step)
    raise AssertionError(f"batch {batch_id} not terminal after {limit} steps")


def upload(client: openai.OpenAI, data: bytes, name: str = "input.jsonl") -> Any:
    return client.files.create(file=(name, data, "application/jsonl"), purpose="batch")


def read_jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line.strip()]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def emu_factory(clock: ManualClock):
    started: list[Emulator] = []

    def make(**overrides: Any) -> Emulator:
        overrides.setdefault("clock", clock)
        e = Emulator(EmulatorConfig(**overrides)).start()
        started.append(e)
        return e

    yield make
    for e in started:
        e.stop()


@pytest.fixture
def emu(emu_factory) -> Emulator:
    return emu_factory()


def sdk_client(e: Emulator, **kw: Any) -> openai.OpenAI:
    """The official client on ``e``; its HTTP client is the SDK's default one, on the process's one
    TLS context of the SDK's own making (provider/tls.py: the CA store is not loaded per test)."""
    kw.setdefault("http_client", openai.DefaultHttpxClient(verify=httpx_context()))
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 10.0)
    kw.setdefault("api_key", API_KEY)
    return openai.OpenAI(base_url=e.base_url, **kw)


@pytest.fixture
def client(emu: Emulator) -> openai.OpenAI:
    return sdk_client(emu)


@pytest.fixture
def sleeper(clock: ManualClock) -> RecordingSleep:
    return RecordingSleep(clock)


def make_provider(e: Emulator, **kw: Any) -> OpenAIProvider:
    """The OpenAI adapter on ``e``, with the SDK's read retries (``max_retries``) as in production."""
    kw.setdefault("timeout", 10.0)
    return OpenAIProvider(api_key=kw.pop("api_key", API_KEY), base_url=e.base_url, **kw)


@pytest.fixture
def provider(emu: Emulator) -> OpenAIProvider:
    return make_provider(emu)


def write_input(tmp_path: Path, data: bytes, name: str = "input.jsonl") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p

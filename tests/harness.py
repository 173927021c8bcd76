"""Helpers for tests that run the real daemon as a subprocess against the real emulator, and
``merged``: a chunk's results merged the way the engine merges them."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from batchgrader.pipeline.merge import ChunkSpool, StreamedMerge

TEST_KEY = "sk-test-DO-NOT-LEAK-0123456789abcdef"
BGCTL = str(Path(sys.executable).parent / "bgctl")

FAST_CONFIG = """\
poll_interval_seconds: 0.05
stable_seconds: 0.05
rescan_interval_seconds: 0.2
max_completion_tokens: 50
request_timeout_seconds: 5
preflight_rows: 0
"""  # the preflight is off: the suites built on this test the batch path (tests/test_preflight*.py turn it on)


def daemon_env(home: Path, base_url: str | None, key: str | None = TEST_KEY) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BATCHGRADER_"))}
    env["BATCHGRADER_HOME"] = str(home)
    if key:
        env["OPENAI_API_KEY"] = key
    if base_url:
        env["OPENAI_BASE_URL"] = base_url
    env["PYTHONUNBUFFERED"] = "1"
    return env


def bgctl(
    home: Path, *args: str, base_url: str | None = None, timeout: float = 120, check: bool = False, key: str | None = TEST_KEY
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BGCTL, *args], env=daemon_env(home, base_url, key), capture_output=True, text=True, timeout=timeout, check=check
    )


def start_daemon(
    home: Path, base_url: str | None, *args: str, key: str | None = TEST_KEY, extra_env: dict[str, str] | None = None
) -> subprocess.Popen:
    env = {**daemon_env(home, base_url, key), **(extra_env or {})}
    return subprocess.Popen([BGCTL, "daemon", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(cond: Callable[[], object], timeout: float = 60, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def events_of(home: Path, type_: str) -> list[dict[str, Any]]:
    """The payloads of the home's events of one type, in order (read-only)."""
    conn = sqlite3.connect(f"file:{home / 'batchgrader.db'}?mode=ro", uri=True)
    try:
        return [json.loads(p) for (p,) in conn.execute("SELECT payload FROM events WHERE type = ? ORDER BY seq", (type_,))]
    finally:
        conn.close()


def event_types(db: Path) -> list[str]:
    if not db.exists():
        return []
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return [r[0] for r in conn.execute("SELECT type FROM events ORDER BY seq")]
        finally:
            conn.close()
    except sqlite3.OperationalError:
        return []


def outbox_files(home: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((home / "outbox").iterdir()) if p.is_file()}


def integrity(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def temp_leftovers(home: Path) -> list[Path]:
    return [p for p in home.rglob("*") if p.name.startswith(".bg-tmp-") or p.name.endswith((".tmp", ".part"))]


def merged(
    expected: Sequence[str],
    outcomes: Iterable[Any],
    status: str | None,
    missing: tuple[str, str] | None = None,
    followers: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[dict[str, Any]], StreamedMerge]:
    """A chunk's outcomes merged as ``daemon/steps/collect.py`` does (spooled, then written in the
    chunk's order): the records written, one a line, and the figures returned."""
    buf = io.BytesIO()
    with ChunkSpool(expected) as spool:
        spool.read(outcomes)
        m = spool.write(buf.write, status, missing, followers)
    return [json.loads(line) for line in buf.getvalue().splitlines()], m

"""kill -9 at many points, restart, and compare with an uninterrupted run.

Two kinds of kill point:
- inside an API call, from the emulator's request hook (the daemon is killed after the call was
  received but before it took effect, or after it took effect but before the answer reached the
  daemon: the windows where a naive client pays twice);
- right after the n-th event of a type is committed (a reader polls the log).
After each kill the daemon is restarted with --once until it finishes.  Then: the outbox equals
the golden run's byte for byte, the emulator saw exactly one batch per chunk, no temporary file
is left and the database passes PRAGMA integrity_check.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from batchgrader.provider.emulator import Emulator, EmulatorConfig
from harness import FAST_CONFIG, TEST_KEY, bgctl, event_types, integrity, outbox_files, start_daemon, temp_leftovers, wait_for

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

CONFIG = FAST_CONFIG + "split_row_limit: 3\nmax_simultaneous_batches: 2\n"
CHUNKS = 3 + 1  # a.csv: 7 rows / 3 per chunk; b.jsonl: 2 rows


def make_inputs(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(CONFIG)
    (home / "inbox").mkdir(parents=True, exist_ok=True)
    (home / "inbox" / "a.csv").write_text("id,response\n" + "".join(f"{i},row {i} =cmd\n" for i in range(7)))
    (home / "inbox" / "b.jsonl").write_text('{"response": "one"}\n{"response": "two"}\n')


def emulator(hook=None) -> Emulator:
    return Emulator(EmulatorConfig(api_key=TEST_KEY, seed=11, on_request=hook)).start()


def finish(home: Path, emu: Emulator, attempts: int = 4) -> None:
    for _ in range(attempts):
        res = bgctl(home, "daemon", "--once", base_url=emu.base_url, timeout=180)
        if res.returncode == 0:
            return
    raise AssertionError(f"daemon did not finish: {res.stderr[-2000:]}")


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    home = tmp_path_factory.mktemp("golden")
    make_inputs(home)
    emu = emulator()
    try:
        finish(home, emu, attempts=1)
        assert emu.batches_created() == CHUNKS
        return outbox_files(home)
    finally:
        emu.stop()


def check(home: Path, emu: Emulator, golden: dict[str, bytes]) -> None:
    assert outbox_files(home) == golden
    assert emu.batches_created() == CHUNKS, emu.batches()
    assert not temp_leftovers(home)
    assert integrity(home / "batchgrader.db") == "ok"
    assert sorted(p.name for p in (home / "archive").iterdir()) == ["a.csv", "b.jsonl"]


API_POINTS = [
    ("POST", "/v1/files", "received", 1),
    ("POST", "/v1/files", "effected", 1),
    ("POST", "/v1/files", "effected", 3),
    ("POST", "/v1/batches", "received", 1),
    ("POST", "/v1/batches", "effected", 1),
    ("POST", "/v1/batches", "effected", 2),
    ("POST", "/v1/batches", "effected", 4),
    ("GET", "/v1/batches", "effected", 2),  # a poll round: one listing for the batches in flight
    ("GET", "/v1/files/{id}/content", "received", 1),
    ("GET", "/v1/files/{id}/content", "effected", 2),
    ("DELETE", "/v1/files/{id}", "effected", 1),
]


@pytest.mark.parametrize("method,route,phase,nth", API_POINTS, ids=[f"{m} {r} {p} #{n}" for m, r, p, n in API_POINTS])
def test_kill_inside_api_call(tmp_path, golden, method, route, phase, nth):
    home = tmp_path / "home"
    make_inputs(home)
    target: dict[str, int] = {}
    seen = {"n": 0}
    killed = threading.Event()

    def hook(m: str, r: str, p: str) -> None:
        if (m, r, p) == (method, route, phase) and not killed.is_set():
            seen["n"] += 1
            if seen["n"] == nth and "pid" in target:
                os.kill(target["pid"], signal.SIGKILL)
                killed.set()
                time.sleep(0.2)  # the handler must not answer a dead client before it is gone

    emu = emulator(hook)
    try:
        proc = start_daemon(home, emu.base_url, "--once")
        target["pid"] = proc.pid
        proc.wait(timeout=180)
        assert killed.is_set(), f"kill point {method} {route} {phase} #{nth} never reached"
        assert proc.returncode == -signal.SIGKILL
        finish(home, emu)
        check(home, emu, golden)
    finally:
        emu.stop()


EVENT_POINTS = [
    ("JobAccepted", 1),
    ("JobPrepared", 1),
    ("UploadStarted", 1),
    ("FileUploaded", 2),
    ("BatchCreateRequested", 1),
    ("BatchCreated", 1),
    ("BatchStatusChanged", 3),
    ("OutputDownloadStarted", 1),
    ("OutputDownloaded", 1),
    ("ChunkCompleted", 2),
    ("OutboxWriteStarted", 1),
    ("ResultWritten", 1),
    ("InputArchived", 1),
    ("JobCompleted", 1),
]


@pytest.mark.parametrize("event,nth", EVENT_POINTS, ids=[f"after {e} #{n}" for e, n in EVENT_POINTS])
def test_kill_after_event(tmp_path, golden, event, nth):
    home = tmp_path / "home"
    make_inputs(home)
    emu = emulator()
    try:
        proc = start_daemon(home, emu.base_url, "--once")
        db = home / "batchgrader.db"
        try:
            wait_for(
                lambda: event_types(db).count(event) >= nth or proc.poll() is not None,
                timeout=120,
                interval=0.002,
                what=f"{event} #{nth}",
            )
        finally:
            if proc.poll() is None:
                proc.kill()
        proc.wait(timeout=30)
        finish(home, emu)
        check(home, emu, golden)
    finally:
        emu.stop()


def test_repeated_kills_at_random_times(tmp_path, golden):
    """A supervisor kills the daemon at pseudo-random moments until the work is done."""
    import random

    rng = random.Random(1234)
    home = tmp_path / "home"
    make_inputs(home)
    emu = emulator()
    try:
        for _ in range(6):
            proc = start_daemon(home, emu.base_url, "--once")
            try:
                proc.wait(timeout=rng.uniform(0.3, 1.5))
            except Exception:
                proc.kill()
                proc.wait(timeout=30)
            if proc.returncode == 0:
                break
        finish(home, emu)
        check(home, emu, golden)
    finally:
        emu.stop()

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

import dataclasses
from pathlib import Path

import pytest

from harness import FAST_CONFIG, TEST_KEY, daemon_env
from killsuite import SPLIT, KillSuite

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

SUITE = KillSuite(config=FAST_CONFIG + SPLIT, api_key=TEST_KEY, env_for=lambda home, emu: daemon_env(home, emu.base_url))


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return SUITE.golden(tmp_path_factory.mktemp("golden"))


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
def test_kill_inside_api_call(tmp_path: Path, golden: dict[str, bytes], method: str, route: str, phase: str, nth: int) -> None:
    SUITE.kill_inside_api_call(tmp_path / "home", golden, method, route, phase, nth)


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
def test_kill_after_event(tmp_path: Path, golden: dict[str, bytes], event: str, nth: int) -> None:
    SUITE.kill_after_event(tmp_path / "home", golden, event, nth)


# every chunk merged in a worker process (daemon/workers.py), killed while one merges
IN_WORKERS = dataclasses.replace(SUITE, config=SUITE.config + "merge_worker_rows: 1\n")
WORKER_POINTS = [("OutputDownloaded", 1), ("ChunkCompleted", 1)]


@pytest.mark.parametrize("event,nth", WORKER_POINTS, ids=[f"after {e} #{n}" for e, n in WORKER_POINTS])
def test_kill_while_chunks_are_merged_in_worker_processes(tmp_path: Path, golden: dict[str, bytes], event: str, nth: int) -> None:
    """The golden run merged in the daemon; this one in workers, with a kill while they run:
    the same outbox, one batch per chunk, no temporary file left."""
    home = tmp_path / "home"
    IN_WORKERS.kill_after_event(home, golden, event, nth)
    assert list((home / "work").glob("*/merging")), "no chunk was merged in a worker"


def test_repeated_kills_at_random_times(tmp_path: Path, golden: dict[str, bytes]) -> None:
    """A supervisor kills the daemon at pseudo-random moments until the work is done."""
    import random

    rng = random.Random(1234)
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    emu = SUITE.emulator()
    try:
        for _ in range(6):
            proc = SUITE.start(home, emu)
            try:
                proc.wait(timeout=rng.uniform(0.3, 1.5))
            except Exception:
                proc.kill()
                proc.wait(timeout=30)
            if proc.returncode == 0:
                break
        SUITE.finish(home, emu)
        SUITE.check(home, emu, golden)
    finally:
        emu.stop()

"""The real daemon (a subprocess) against the emulator with an enqueued-token limit it is not
told: every row answered once, no row paid twice, the learned limit in the log and in
`bgctl status --json`; and kill -9 while a refused batch is being re-planned."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from batchgrader.emulator import Emulator, EmulatorConfig
from harness import FAST_CONFIG, TEST_KEY, bgctl, event_types, events_of, integrity, start_daemon, temp_leftovers

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
MODEL = "gpt-5.4-mini"
ROWS = 40


def write_input(home: Path) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(FAST_CONFIG)
    src = home.parent / "reviews.csv"
    src.write_text("id,response\n" + "".join(f"{i},review {i}: it works and it is cheap\n" for i in range(ROWS)))
    return src


def file_tokens(home: Path, src: Path) -> int:
    res = bgctl(home, "count", str(src), "--json", check=True)
    return int(json.loads(res.stdout)["input_tokens"])


def paid_once(emu: Emulator) -> None:
    """Each row accepted by exactly one batch, every accepted row answered; refused batches
    processed nothing."""
    done = [b for b in emu.batches() if b["status"] == "completed"]
    assert sum(b["request_counts"]["completed"] for b in done) == ROWS
    assert all(b["status"] in ("completed", "failed") for b in emu.batches())
    assert all(b["request_counts"]["completed"] == 0 for b in emu.batches() if b["status"] == "failed")
    seen = Counter(  # the custom ids of every batch that passed validation (read from its own input link)
        json.loads(line)["custom_id"]
        for b in emu.store.state.batches.values()
        if b.input_path is not None
        for line in b.input_path.read_bytes().splitlines()
        if line.strip()
    )
    assert len(seen) == ROWS and set(seen.values()) == {1}


def test_the_daemon_learns_the_queue_limit_and_answers_every_row_once(tmp_path):
    home = tmp_path / "home"
    src = write_input(home)
    limit = file_tokens(home, src) * 45 // 100
    with Emulator(EmulatorConfig(api_key=TEST_KEY, token_limits={MODEL: limit}, in_progress_s=0.3)) as emu:
        assert bgctl(home, "submit", str(src)).returncode == 0
        res = bgctl(home, "daemon", "--once", base_url=emu.base_url, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        paid_once(emu)
        refused = [b for b in emu.batches() if b["status"] == "failed"]
        assert len(refused) == 1 and refused[0]["errors"]["data"][0]["code"] == "token_limit_exceeded"
        assert emu.store.state.files[refused[0]["input_file_id"]].deleted
        doctor = bgctl(home, "doctor", "--json", base_url=emu.base_url)
    (learned,) = events_of(home, "QueueLimitLearned")
    assert (learned["model"], learned["limit"], learned["exact"]) == (MODEL, limit, True)
    assert events_of(home, "ChunkReplanned")
    (job,) = json.loads(bgctl(home, "status", "--json").stdout)
    assert job["state"] == "completed" and job["succeeded"] == ROWS
    assert job["queue"]["limit"] == limit and job["queue"]["exact"] is True and job["queue"]["waiting"] is False
    assert job["queue"]["model"] == MODEL
    rows = (home / "outbox" / "reviews_results.csv").read_text().splitlines()[1:]
    assert len(rows) == ROWS and all(r.endswith(",") for r in rows)  # no error cell
    (q,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "queue limits"]
    assert f"{limit:,}" in q["detail"]


@pytest.mark.parametrize("point", ["delete of the refused file", "after ChunkReplanned"])
def test_kill_while_a_refused_batch_is_replanned(tmp_path, point):
    home = tmp_path / "home"
    src = write_input(home)
    limit = file_tokens(home, src) * 45 // 100
    target: dict[str, int] = {}
    killed = threading.Event()

    def hook(method: str, route: str, phase: str) -> None:
        if point.startswith("delete") and (method, route, phase) == ("DELETE", "/v1/files/{id}", "effected"):
            if "pid" in target and not killed.is_set():
                os.kill(target["pid"], signal.SIGKILL)
                killed.set()
                time.sleep(0.2)

    cfg = EmulatorConfig(api_key=TEST_KEY, token_limits={MODEL: limit}, in_progress_s=0.3, on_request=hook)
    with Emulator(cfg) as emu:
        assert bgctl(home, "submit", str(src)).returncode == 0
        proc = start_daemon(home, emu.base_url, "--once")
        target["pid"] = proc.pid
        db = home / "batchgrader.db"
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if point.startswith("after") and "ChunkReplanned" in event_types(db):
                proc.kill()
                killed.set()
                break
            time.sleep(0.002)
        proc.wait(timeout=30)
        assert killed.is_set() and proc.returncode == -signal.SIGKILL
        for _ in range(3):
            res = bgctl(home, "daemon", "--once", base_url=emu.base_url, timeout=300)
            if res.returncode == 0:
                break
        assert res.returncode == 0, res.stderr[-2000:]
        paid_once(emu)
        assert len([b for b in emu.batches() if b["status"] == "failed"]) == 1
    assert len(events_of(home, "ChunkReplanned")) == 1
    (job,) = json.loads(bgctl(home, "status", "--json").stdout)
    assert job["state"] == "completed" and job["succeeded"] == ROWS
    assert not temp_leftovers(home) and integrity(db) == "ok"

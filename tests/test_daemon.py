"""The daemon end to end: a real subprocess, the real emulator over HTTP, a real inbox folder."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.store.eventstore import EventStore
from harness import FAST_CONFIG, TEST_KEY, bgctl, integrity, outbox_files, start_daemon, temp_leftovers, wait_for

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def emu():
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=7)) as e:
        yield e


def state_of(home) -> dict:
    with EventStore(home.db, readonly=True) as s:
        return fold(s.read())


def rows_of(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


@pytest.mark.slow  # covered tick by tick in tests/test_ticks.py
def test_several_files_profiles_chunks_and_structured_output(home, emu):
    home.config_file.write_text(
        FAST_CONFIG
        + """
split_row_limit: 4
profiles:
  scored:
    output_column: verdict
    response_format:
      type: object
      properties: {score: {type: integer}, reason: {type: string}}
      required: [score, reason]
      additionalProperties: false
"""
    )
    (home.inbox / "reviews.csv").write_text(
        "id,response\n" + "".join(f"{i:03d},text {i} NA\n" for i in range(10)), encoding="utf-8"
    )
    (home.inbox / "scored").mkdir()
    (home.inbox / "scored" / "answers.jsonl").write_text(
        "".join(json.dumps({"n": i, "response": f"answer {i}"}) + "\n" for i in range(5))
    )
    (home.inbox / "list.json").write_text(json.dumps([{"response": "x", "keep": 1.50}, {"response": "y", "keep": None}]))
    res = bgctl(home.root, "daemon", "--once", base_url=emu.base_url)
    assert res.returncode == 0, res.stderr

    out = outbox_files(home.root)
    assert set(out) == {"reviews_results.csv", "answers_results.jsonl", "list_results.json"}
    rows = rows_of(home.outbox / "reviews_results.csv")
    assert [r["id"] for r in rows] == [f"{i:03d}" for i in range(10)]  # order and leading zeros kept
    assert all(r["grade"] and r["error"] == "" and int(r["input_tokens"]) > 0 for r in rows)
    scored = [json.loads(l) for l in out["answers_results.jsonl"].decode().splitlines()]
    assert [r["n"] for r in scored] == list(range(5))
    assert all(
        isinstance(r["score"], int) and isinstance(r["reason"], str) and json.loads(r["verdict"])["score"] == r["score"]
        for r in scored
    )
    lst = json.loads(out["list_results.json"])
    assert [r["keep"] for r in lst] == [1.50, None] and lst[0]["error"] is None

    st = state_of(home)
    jobs = {j.file: j for j in st.jobs.values()}
    assert jobs["reviews.csv"].ended == "completed" and jobs["reviews.csv"].chunks_total == 3
    assert jobs["answers.jsonl"].profile == "scored"
    assert emu.batches_created() == 6  # 3 + 2 + 1: exactly one batch per chunk
    assert sorted(p.name for p in home.archive.iterdir()) == ["answers.jsonl", "list.json", "reviews.csv"]
    assert not list(home.inbox.glob("*.*")) and not temp_leftovers(home.root)
    assert integrity(home.db) == "ok"


# every bad input, the symlink and the missing price: tick by tick in tests/test_ticks.py; here the
# real process: the exit code and `bgctl status`, for a file failed after intake and one rejected at it
@pytest.mark.slow
@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("ragged.csv", b"a,response\n1,x\n2,y,z\n", "line 3"),
        ("notes.txt", b"hello", "unsupported"),
    ],
)
def test_bad_input_fails_clearly_keeps_original_and_others_go_on(home, emu, name, content, needle):
    home.config_file.write_text(FAST_CONFIG)
    (home.inbox / name).write_bytes(content)
    (home.inbox / "good.csv").write_text("response\nfine\n")
    res = bgctl(home.root, "daemon", "--once", base_url=emu.base_url)
    assert res.returncode == 4, res.stderr  # a job ended failed (docs/guide.md: exit codes)
    stem = Path(name).stem
    report = (home.outbox / f"{stem}_error.txt").read_text()
    assert needle in report and name in report and "What to do" in report
    assert (home.failed / name).read_bytes() == content  # the original is kept, byte for byte
    assert (home.outbox / "good_results.csv").exists()
    st = state_of(home)
    bad = next(j for j in st.jobs.values() if j.file == name)
    assert bad.ended == "failed" and needle in bad.error["error"]
    status = json.loads(bgctl(home.root, "status", "--json").stdout)
    assert any(r["file"] == name and r["state"] == "failed" and needle in (r["error"] or "") for r in status)


@pytest.mark.slow  # a real daemon process: signals, sockets, files on disk
def test_api_key_never_written_anywhere(home, emu):
    home.config_file.write_text(FAST_CONFIG)
    (home.inbox / "a.csv").write_text("response\nx\ny\n")
    res = bgctl(home.root, "daemon", "--once", base_url=emu.base_url)
    assert res.returncode == 0, res.stderr
    assert TEST_KEY not in res.stdout + res.stderr
    for p in home.root.rglob("*"):
        if p.is_file():
            assert TEST_KEY.encode() not in p.read_bytes(), p
    assert bgctl(home.root, "config", "show", "--json").stdout.count(TEST_KEY) == 0


@pytest.mark.slow  # a real daemon process: signals, sockets, files on disk
def test_second_daemon_refuses_and_sigterm_exits_cleanly(home, emu):
    home.config_file.write_text(FAST_CONFIG)
    first = start_daemon(home.root, emu.base_url)
    try:
        wait_for(lambda: home.lock_file.exists() and home.db.exists(), what="first daemon up")
        second = bgctl(home.root, "daemon", base_url=emu.base_url, timeout=30)
        assert second.returncode == 75 and "already running" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0


@pytest.mark.slow  # a real daemon process: signals, sockets, files on disk
def test_no_key_without_sandbox_is_a_clear_error(home):
    res = bgctl(home.root, "daemon", "--once", key=None)
    assert res.returncode == 78 and "OPENAI_API_KEY" in res.stderr and "--sandbox" in res.stderr


@pytest.mark.slow  # a real daemon process: signals, sockets, files on disk
def test_daemon_speaks_sd_notify(home, emu, tmp_path):
    import socket

    home.config_file.write_text(FAST_CONFIG)
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(30)
    proc = start_daemon(home.root, emu.base_url, extra_env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "400000"})
    got: list[str] = []
    try:
        while not (any(m.startswith("WATCHDOG=1") for m in got) and any(m.startswith("STATUS=") for m in got)):
            got.append(sock.recv(4096).decode())
        assert got[0].startswith("READY=1")  # first message: after replay and reconciliation
        assert home.db.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        while not any(m.startswith("STOPPING=1") for m in got):
            got.append(sock.recv(4096).decode())
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
    status = next(m for m in got if m.startswith("STATUS="))
    assert "active jobs" in status and "\n" not in status.strip()

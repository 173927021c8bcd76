"""Answers reused end to end: the real daemon (subprocess) against the real emulator over HTTP."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import time
from pathlib import Path

import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.store import answers
from batchgrader.store.eventstore import EventStore
from harness import FAST_CONFIG, TEST_KEY, bgctl, event_types, integrity, outbox_files, start_daemon, temp_leftovers

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def state_of(home):
    with EventStore(home.db, readonly=True) as s:
        return fold(s.read())


def rows_of(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def write(path: Path, texts: list[str]) -> None:
    path.write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))


def sent(emu: Emulator) -> int:
    """Requests the provider received, over every batch."""
    return sum(b["request_counts"]["total"] for b in emu.batches())


def run(home, emu: Emulator, *args: str) -> None:
    res = bgctl(home.root, "daemon", "--once", base_url=emu.base_url, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]


def submit(home, src: Path, *flags: str) -> None:
    res = bgctl(home.root, "submit", *flags, str(src))
    assert res.returncode == 0, res.stderr


def newest_job(home):
    return max(state_of(home).jobs.values(), key=lambda j: j.created_ts)


def status_json(home) -> dict[str, dict]:
    res = bgctl(home.root, "status", "--json")
    assert res.returncode == 0, res.stderr
    return {j["job_id"]: j for j in json.loads(res.stdout)}


TEXTS = [f"essay number {i}" for i in range(12)]


def test_the_same_file_twice_costs_nothing_the_second_time(home, tmp_path):
    home.config_file.write_text(FAST_CONFIG + "split_row_limit: 5\n")
    src = tmp_path / "a.csv"
    write(src, TEXTS)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1)) as emu:
        submit(home, src)
        run(home, emu)
        first = newest_job(home)
        assert sent(emu) == 12 and first.cost_usd > 0
        batches = emu.batches_created()
        submit(home, src)
        run(home, emu)
        second = newest_job(home)
        assert emu.batches_created() == batches and sent(emu) == 12  # no batch, no request
    assert second.job_id != first.job_id and second.ended == "completed"
    assert second.requests == 0 and second.chunks == {} and second.cost_usd == 0
    assert second.cached_rows == 12 and second.saved_usd == pytest.approx(first.cost_usd)
    out = sorted(home.outbox.glob("a_results*.csv"))
    assert len(out) == 2
    a, b = (rows_of(p) for p in out)
    # the original answers; no token billed again (issue 27: the token columns sum to the bill)
    assert [r["grade"] for r in a] == [r["grade"] for r in b] and all(r["error"] == "" for r in b)
    assert {r["answered_by"] for r in a} == {"batch"} and {r["answered_by"] for r in b} == {"reused"}
    assert all(r["input_tokens"] == r["output_tokens"] == "0" for r in b)
    st = status_json(home)[second.job_id]
    assert st["cached_rows"] == 12 and st["requests"] == 0 and st["cost_usd"] == 0
    assert st["saved_usd"] == pytest.approx(first.cost_usd)
    costs = json.loads(bgctl(home.root, "costs", "--json").stdout)
    assert costs["totals"]["simulated_saved_usd"] == 0  # not a sandbox: real money
    assert costs["totals"]["saved_usd"] == pytest.approx(first.cost_usd)
    assert costs["totals"]["cost_usd"] == pytest.approx(first.cost_usd)


def test_count_shows_what_a_changed_file_would_reuse(home, tmp_path):
    """`bgctl count` sees the answers store (what the daemon then reuses, a changed row, a new
    prompt or model: tests/test_reuse_ticks.py)."""
    home.config_file.write_text(FAST_CONFIG)
    src = tmp_path / "a.csv"
    write(src, TEXTS)
    changed = tmp_path / "b.csv"
    write(changed, [*TEXTS[:5], "a corrected essay", *TEXTS[6:]])
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=2)) as emu:
        submit(home, src)
        run(home, emu)
        assert sent(emu) == 12
        count = json.loads(bgctl(home.root, "count", "--json", str(changed), base_url=emu.base_url).stdout)
        assert count["reuse"]["cached_rows"] == 11 and count["requests"] == 1 and count["reuse"]["saved_usd"] > 0


def test_identical_rows_in_one_file_are_sent_once(home, tmp_path):
    home.config_file.write_text(FAST_CONFIG + "split_row_limit: 4\n")
    texts = [f"answer {i % 10}" if i % 3 else "I don't know" for i in range(50)]
    distinct = len(set(texts))
    write(home.inbox / "dups.csv", texts)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=3)) as emu:
        run(home, emu)
        assert sent(emu) == distinct
    job = newest_job(home)
    assert job.ended == "completed" and job.succeeded_rows == 50 and job.duplicates_answered == 50 - distinct
    got = rows_of(home.outbox / "dups_results.csv")
    by_text: dict[str, set[tuple[str, str, str]]] = {}
    for r in got:
        by_text.setdefault(r["response"], set()).add(r["grade"])
    assert all(len(v) == 1 for v in by_text.values())  # every copy carries its leader's answer
    assert all(r["grade"] for r in got)
    st = status_json(home)[job.job_id]
    assert st["cached_rows"] == 50 - distinct and st["requests"] == distinct and st["saved_usd"] > 0


def test_submit_fresh_sends_every_row(home, tmp_path):
    home.config_file.write_text(FAST_CONFIG)
    src = tmp_path / "a.csv"
    write(src, TEXTS[:4] + TEXTS[:4])
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=4)) as emu:
        submit(home, src)
        run(home, emu)
        assert sent(emu) == 4
        submit(home, src, "--fresh")
        run(home, emu)
        job = newest_job(home)
        assert job.fresh and job.cached_rows == 0 and sent(emu) == 12
        assert not list(home.inbox.glob(".*.fresh"))
        # sampling, reuse_answers and cache_days: tests/test_reuse_ticks.py


def test_cache_clear_and_rebuild_never_touch_the_log(home, tmp_path):
    home.config_file.write_text(FAST_CONFIG)
    src = tmp_path / "a.csv"
    write(src, TEXTS[:6])
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=5)) as emu:
        submit(home, src)
        run(home, emu)
        assert bgctl(home.root, "rebuild").returncode == 0
        stats = json.loads(bgctl(home.root, "cache", "stats", "--json").stdout)
        assert stats["answers"] == 6 and stats["content_bytes"] > 0
        submit(home, src)
        run(home, emu)
        assert sent(emu) == 6 and newest_job(home).cached_rows == 6  # answers survived the rebuild
        n_events = len(event_types(home.db))
        res = bgctl(home.root, "cache", "clear", "--json")
        assert json.loads(res.stdout)["removed"] == 6
        assert len(event_types(home.db)) == n_events
        assert "answers store: empty" in bgctl(home.root, "doctor", "--json").stdout
        submit(home, src)
        run(home, emu)
        assert sent(emu) == 12


def _kill_when(db: Path, proc, cond) -> None:  # noqa: ANN001
    """SIGKILL ``proc`` as soon as ``cond(event types)`` holds (a reader polls the log)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if cond(event_types(db)):
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait(30)


def test_kill_between_deciding_and_writing_gives_the_uninterrupted_result(home, tmp_path):
    """kill -9 right after RequestsReused is committed: the restarted daemon writes the same result
    file as an uninterrupted run, sends nothing, and no row is both reused and sent."""
    home.config_file.write_text(FAST_CONFIG)
    src = tmp_path / "a.csv"
    write(src, [*TEXTS, TEXTS[0]])
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=6)) as emu:
        submit(home, src)
        run(home, emu)
        golden = (home.outbox / "a_results.csv").read_bytes()
        before = sent(emu), emu.batches_created()
        n_reused = event_types(home.db).count("RequestsReused")
        submit(home, src)
        proc = start_daemon(home.root, emu.base_url)
        _kill_when(home.db, proc, lambda types: types.count("RequestsReused") > n_reused)
        assert event_types(home.db).count("RequestsReused") == n_reused + 1
        run(home, emu)
        assert (sent(emu), emu.batches_created()) == before
    job = newest_job(home)
    assert job.ended == "completed" and job.cached_rows == 13 and job.requests == 0
    out = sorted(p for p in home.outbox.glob("a_results*.csv") if p.name != "a_results.csv")
    # an uninterrupted second run: the first run's answers, every row reused, no token billed again
    expected = [
        {**r, "answered_by": "reused", "input_tokens": "0", "output_tokens": "0"} for r in rows_of(home.outbox / "a_results.csv")
    ]
    assert len(out) == 1 and rows_of(out[0]) == expected
    assert out[0].read_bytes().count(b"\n") == golden.count(b"\n")
    assert not temp_leftovers(home.root) and integrity(home.db) == "ok"
    assert len(outbox_files(home.root)) == 2
    with EventStore(home.db, readonly=True) as s:
        assert answers.stats(s.conn)["answers"] == 12

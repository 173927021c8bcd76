"""Daemon flows over the emulator: retries, cancel, limits, budgets, halting, expiry, faults, reload."""

from __future__ import annotations

import csv
import io
import json
import signal
import time
from pathlib import Path

import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig, Fault
from batchgrader.store.eventstore import EventStore
from harness import FAST_CONFIG, TEST_KEY, bgctl, event_types, integrity, start_daemon, temp_leftovers, wait_for

pytestmark = pytest.mark.timeout(300)


def state_of(home):
    with EventStore(home.db, readonly=True) as s:
        return fold(s.read())


def result_rows(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def write_rows(path: Path, n: int, text: str = "review") -> None:
    path.write_text("id,response\n" + "".join(f"{i},{text} {i}\n" for i in range(n)))


def only_job(home):
    (job,) = state_of(home).jobs.values()
    return job


@pytest.mark.slow  # covered tick by tick in tests/test_ticks.py
def test_bgctl_retry_resubmits_failed_rows_and_writes_a_new_result(home):
    home.config_file.write_text(FAST_CONFIG + "max_row_retries: 0\n")
    write_rows(home.inbox / "a.csv", 20)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, request_failure_rate=0.5, seed=5)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
        job = only_job(home)
        assert job.ended == "completed_with_errors"
        first_errors = sum(1 for r in result_rows(home.outbox / "a_results.csv") if r["error"])
        assert first_errors == len(job.failed_rows) > 0
        res = bgctl(home.root, "retry", job.job_id[:6])
        assert res.returncode == 0 and "retry requested" in res.stdout
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    results = sorted(home.outbox.glob("a_results*.csv"))
    assert len(results) == 2  # never overwritten: the new one has a timestamp suffix
    newest = max(results, key=lambda p: p.stat().st_mtime_ns)
    second_errors = sum(1 for r in result_rows(newest) if r["error"])
    assert second_errors < first_errors
    assert (home.archive / "a.csv").exists()


@pytest.mark.slow  # covered tick by tick in tests/test_ticks.py
def test_cancel_ends_the_job_with_partial_results(home):
    home.config_file.write_text(FAST_CONFIG + "split_row_limit: 5\nmax_simultaneous_batches: 1\n")
    write_rows(home.inbox / "a.csv", 12)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, in_progress_s=3600)) as emu:
        proc = start_daemon(home.root, emu.base_url)
        try:
            wait_for(lambda: "BatchCreated" in event_types(home.db), what="first batch")
            job_id = only_job(home).job_id
            assert "cancel requested" in bgctl(home.root, "cancel", job_id).stdout
            wait_for(lambda: "JobCancelled" in event_types(home.db), what="cancelled")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        assert emu.batches_created() == 1  # the other chunks were never submitted
    job = only_job(home)
    assert job.ended == "cancelled"
    rows = result_rows(home.outbox / "a_results.csv")
    assert len(rows) == 12 and all("cancel" in r["error"] for r in rows)


@pytest.mark.slow  # covered tick by tick in tests/test_ticks.py
def test_budget_cap_holds_before_any_money_is_spent_and_retry_releases(home):
    home.config_file.write_text(FAST_CONFIG + "max_cost_per_job_usd: 0.0000001\n")
    write_rows(home.inbox / "a.csv", 3)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
        assert emu.files_created() == 0 and emu.batches_created() == 0
        status = json.loads(bgctl(home.root, "status", "--json").stdout)
        assert status[0]["state"] == "held" and "max_cost_per_job_usd" in (status[0]["held_reason"] or status[0]["error"] or "")
        bgctl(home.root, "retry", status[0]["job_id"])
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
        assert emu.batches_created() == 1
    assert only_job(home).ended == "completed"


@pytest.mark.slow  # covered tick by tick in tests/test_ticks.py
def test_halt_on_chunk_failure_stops_the_rest(home):
    home.config_file.write_text(FAST_CONFIG + "split_row_limit: 2\nmax_simultaneous_batches: 1\nhalt_on_chunk_failure: true\n")
    write_rows(home.inbox / "a.csv", 6)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        emu.script_fault("POST", "/v1/batches", Fault("status", status=400, message="model not allowed for this project"))
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 4  # the job ended failed
        assert emu.batches_created() == 0
    job = only_job(home)
    assert job.ended == "failed" and "model not allowed" in job.error["error"]
    rows = result_rows(home.outbox / "a_results.csv")
    assert [r["error"].split(":")[0] for r in rows] == ["create_rejected"] * 2 + ["halted"] * 4
    assert "model not allowed" in (home.outbox / "a_error.txt").read_text()


@pytest.mark.slow  # covered tick by tick in tests/test_ticks.py
@pytest.mark.parametrize("profile", ["flaky", "drops", "slow", "chaos"])
def test_fault_profiles_end_in_definite_states_without_paying_twice(home, profile):
    home.config_file.write_text(FAST_CONFIG + "split_row_limit: 4\n")
    write_rows(home.inbox / "a.csv", 10)
    (home.inbox / "b.jsonl").write_text("".join(json.dumps({"response": f"r{i}"}) + "\n" for i in range(3)))
    with Emulator(EmulatorConfig(api_key=TEST_KEY, faults=profile, seed=21)) as emu:
        for _ in range(3):  # the daemon stays up; --once may be re-run by cron after a hard fault
            res = bgctl(home.root, "daemon", "--once", base_url=emu.base_url, timeout=240)
            if res.returncode == 0:
                break
        assert res.returncode == 0, res.stderr[-3000:]
        keys = [b["metadata"]["bg_key"] for b in emu.batches()]
    assert len(keys) == len(set(keys)), "a chunk attempt was submitted twice"
    st = state_of(home)
    assert all(j.terminal for j in st.jobs.values())
    assert {j.file: j.ended for j in st.jobs.values()} == {"a.csv": "completed", "b.jsonl": "completed"}
    assert not temp_leftovers(home.root) and integrity(home.db) == "ok"


@pytest.mark.slow  # a real daemon process: signals, sockets, files on disk
def test_sighup_reloads_the_configuration(home):
    home.config_file.write_text(FAST_CONFIG)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        proc = start_daemon(home.root, emu.base_url)
        try:
            wait_for(lambda: home.db.exists(), what="daemon up")
            home.config_file.write_text(FAST_CONFIG + "max_cost_per_job_usd: 0.0000001\n")
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "configuration reloaded" in (home.logs / "daemon.log").read_text(), what="reload")
            write_rows(home.inbox / "a.csv", 2)
            wait_for(lambda: "JobHeld" in event_types(home.db), what="held by the reloaded limit")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


@pytest.mark.slow  # a real daemon process: signals, sockets, files on disk
def test_sandbox_mode_is_labelled_simulated(home):
    home.config_file.write_text(FAST_CONFIG)
    src = Path(__file__).parents[1] / "examples" / "reviews.csv"
    assert bgctl(home.root, "submit", str(src), key=None).returncode == 0
    res = bgctl(home.root, "daemon", "--sandbox", "--once", key=None, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "SIMULATED" in res.stdout
    status = json.loads(bgctl(home.root, "status", "--json", key=None).stdout)
    assert status[0]["state"] == "completed" and status[0]["sandbox"] is True
    assert "SIMULATED" in bgctl(home.root, "status", key=None).stdout
    rows = result_rows(home.outbox / "reviews_results.csv")
    assert len(rows) == 12 and all(r["grade"] for r in rows)
    assert rows[4]["grade"][:1] not in "=+-@"  # formula guard on model output
    assert rows[4]["response"].startswith("=SUM")  # input cells unchanged

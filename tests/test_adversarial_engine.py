"""Issue 10, engine side: the faults the kill -9 suite does not reach, each against the real
engine, the real SDK and the emulator over real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from adversarial_engine import CreateTracker, all_ended, make_engine, paid_per_key, run_until, write_rows
from batchgrader.emulator import Emulator, EmulatorConfig, Fault
from batchgrader.store.eventstore import EventStore
from harness import TEST_KEY

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
def test_late_create_within_the_settle_time_is_adopted_not_sent_again(home):
    """The provider carries out POST /batches 3 s after the client (timeout 1 s) gave up."""
    write_rows(home.inbox / "a.csv", 5)
    creates = CreateTracker()
    with Emulator(EmulatorConfig(api_key=TEST_KEY, on_request=creates)) as emu, EventStore(home.db) as store:
        emu.script_fault("POST", "/v1/batches", Fault("delay", seconds=3.0))
        engine = make_engine(home, emu, store, "request_timeout_seconds: 1\n")
        run_until(engine, lambda: all_ended(engine) and creates.settled())
        assert emu.batches_created() == 1, "the chunk was submitted twice"
        (job,) = engine.ctx.state.jobs.values()
        assert job.ended == "completed"
        assert (home.outbox / "a_results.csv").exists()


@pytest.mark.slow
def test_create_landing_after_the_settle_time_is_found_and_cancelled(home):
    """A create that lands even later than the settle time: the chunk is created again, and the
    look-again by bg_key cancels the late one before it runs (validation takes a while)."""
    write_rows(home.inbox / "a.csv", 5)
    creates = CreateTracker()
    cfg = EmulatorConfig(api_key=TEST_KEY, validating_s=6.0, on_request=creates)
    with Emulator(cfg) as emu, EventStore(home.db) as store:
        emu.script_fault("POST", "/v1/batches", Fault("delay", seconds=5.0))
        engine = make_engine(home, emu, store, "request_timeout_seconds: 0.5\n")
        run_until(engine, lambda: all_ended(engine) and creates.settled(), timeout=90)
        statuses = sorted(b["status"] for b in emu.batches())
        assert statuses == ["cancelled", "completed"]
        assert all(n == 1 for n in paid_per_key(emu).values())
        types = [e.type for e in store.read()]
        assert "DuplicateBatchesChecked" in types
        (job,) = engine.ctx.state.jobs.values()
        assert job.ended == "completed"


def result_rows(path):
    import csv
    import io

    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def test_a_result_file_that_is_gone_fails_its_rows_with_the_reason_and_the_job_finishes(home):
    """A 404 on the output file (expired or deleted): one intent, then the rows fail; never stuck."""
    write_rows(home.inbox / "a.csv", 4)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu, EventStore(home.db) as store:
        emu.script_fault("GET", "/v1/files/{id}/content", Fault("status", status=404, message="No such File object"), times=1000)
        engine = make_engine(home, emu, store)
        run_until(engine, lambda: all_ended(engine), timeout=30)
        types = [e.type for e in store.read()]
    (job,) = engine.ctx.state.jobs.values()
    assert job.ended == "failed"  # no row has an answer; never resubmitted (that would pay twice)
    assert types.count("OutputDownloadStarted") == 1 and types.count("OutputDownloadFailed") == 1
    rows = result_rows(home.outbox / "a_results.csv")
    assert len(rows) == 4 and all("No such File object" in r["error"] for r in rows)


def test_downloads_that_keep_failing_are_bounded_then_the_rows_fail(home):
    write_rows(home.inbox / "a.csv", 3)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu, EventStore(home.db) as store:
        emu.script_fault("GET", "/v1/files/{id}/content", Fault("status", status=500), times=1000)
        engine = make_engine(home, emu, store)
        # the engine pauses between attempts (2, 4, 8 s): run it on a clock that moves faster
        import time as _time

        engine.startup(_time.time())
        t = _time.time()
        for _ in range(400):
            t += 5.0
            engine.tick(t)
            if all_ended(engine):
                break
        types = [e.type for e in store.read()]
    (job,) = engine.ctx.state.jobs.values()
    assert job.ended == "failed", types[-5:]
    assert types.count("OutputDownloadStarted") == 1  # one intent for the whole download, not one per tick
    assert types.count("OutputDownloadFailed") == 1
    assert all("after 4 attempts" in r["error"] for r in result_rows(home.outbox / "a_results.csv"))


def test_a_malformed_output_file_is_downloaded_again_then_good_lines_are_kept(home):
    write_rows(home.inbox / "a.csv", 5)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, shuffle_output=False)) as emu, EventStore(home.db) as store:
        emu.script_fault("GET", "/v1/files/{id}/content", Fault("garble_line"), times=1000)
        engine = make_engine(home, emu, store)
        run_until(engine, lambda: all_ended(engine), timeout=30)
        types = [e.type for e in store.read()]
    (job,) = engine.ctx.state.jobs.values()
    assert types.count("OutputFileMalformed") == 2  # downloaded again twice, then merged
    rows = result_rows(home.outbox / "a_results.csv")
    bad = [r for r in rows if r["error"]]
    assert len(rows) == 5 and len(bad) == 1 and "malformed" in bad[0]["error"]
    assert all(r["grade"] for r in rows if not r["error"])  # answers already paid for are kept
    assert job.ended == "completed_with_errors"


def test_a_malformed_output_file_that_comes_right_the_second_time_loses_nothing(home):
    write_rows(home.inbox / "a.csv", 5)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu, EventStore(home.db) as store:
        emu.script_fault("GET", "/v1/files/{id}/content", Fault("garbage"), times=1)
        engine = make_engine(home, emu, store)
        run_until(engine, lambda: all_ended(engine), timeout=30)
    (job,) = engine.ctx.state.jobs.values()
    assert job.ended == "completed"
    assert all(not r["error"] for r in result_rows(home.outbox / "a_results.csv"))


# --- item 6: final events after their effects; missing effects redone on restart -----------------


def test_a_failed_job_whose_report_and_move_were_lost_gets_them_on_restart(home):
    """The crash came right after JobFailed (as the old order wrote it): no report, input in work/."""
    from batchgrader.store.eventstore import NewEvent

    work = home.job_dir("j1")
    work.mkdir(parents=True)
    (work / "input.csv").write_text("response\nx\n")
    with EventStore(home.db) as store:
        store.append(
            "j1",
            [
                NewEvent(
                    "JobAccepted",
                    {
                        "file": "a.csv",
                        "source": str(home.inbox / "a.csv"),
                        "profile": "default",
                        "sha256": "0" * 64,
                        "bytes": 11,
                        "input_path": str(work / "input.csv"),
                        "result_name": "a_results.csv",
                        "sandbox": False,
                    },
                ),
                NewEvent("JobFailed", {"code": "bad_input", "error": "no such column", "stage": "prepare", "hint": "fix it"}),
            ],
        )
        engine = make_engine(home, None, store)
        engine.startup(1_000.0)
        engine.tick(1_001.0)
        job = engine.ctx.state.jobs["j1"]
    reports = list(home.outbox.glob("a*error*"))
    assert len(reports) == 1 and "no such column" in reports[0].read_text()
    assert not (work / "input.csv").exists() and job.archived_path and Path(job.archived_path).parent == home.failed


def test_a_rejected_file_whose_report_and_move_were_lost_gets_them_on_restart(home):
    from batchgrader.pipeline.inbox import fingerprint
    from batchgrader.store.eventstore import NewEvent

    f = home.inbox / "notes.txt"
    f.write_text("hello")
    fp = fingerprint(f, f.lstat())
    with EventStore(home.db) as store:
        store.append(
            "x-1",
            [
                NewEvent(
                    "FileRejected",
                    {
                        "file": "notes.txt",
                        "path": str(f),
                        "reason": "unsupported file type",
                        "code": "unsupported_format",
                        "fingerprint": fp,
                    },
                )
            ],
        )
        engine = make_engine(home, None, store)
        engine.startup(1_000.0)
        engine.tick(1_001.0)
    assert not f.exists() and (home.failed / "notes.txt").read_text() == "hello"
    assert any("unsupported file type" in p.read_text() for p in home.outbox.iterdir())


def test_fail_writes_the_final_event_after_its_effects(home):
    (home.inbox / "bad.csv").write_text("nothing,here\n1,2\n")  # no response column
    with EventStore(home.db) as store:
        engine = make_engine(home, None, store)
        run_until(engine, lambda: all_ended(engine), timeout=20)
        types = [e.type for e in store.read()]
    assert types[-1] == "JobFailed"
    assert types.index("ResultWritten") < types.index("JobFailed") and types.index("InputArchived") < types.index("JobFailed")


# --- item 5: result file ownership -----------------------------------------------------------------


def test_two_inputs_with_the_same_name_never_take_each_others_result(home):
    """B recorded its result path and crashed before writing it; the older A, finishing later,
    must not take that path, and B must never accept A's file as its own."""
    from batchgrader.store.eventstore import NewEvent

    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},alpha {i}\n" for i in range(3)))
    with Emulator(EmulatorConfig(api_key=TEST_KEY, validating_s=1.0)) as emu, EventStore(home.db) as store:
        engine = make_engine(home, emu, store)
        run_until(engine, lambda: any(c.in_flight for j in engine.ctx.state.jobs.values() for c in j.chunks.values()))
        work = home.job_dir("bbbbbbbbbbbb")
        work.mkdir(parents=True)
        (work / "input.csv").write_text("id,response\n" + "".join(f"{i},beta {i}\n" for i in range(2)))
        taken = home.outbox / "a_results.csv"
        accepted = {
            "file": "a.csv",
            "source": str(home.inbox / "a.csv"),
            "profile": "default",
            "sha256": "b" * 64,
            "bytes": 40,
            "input_path": str(work / "input.csv"),
            "result_name": "a_results.csv",
            "sandbox": False,
        }
        engine.ctx.emit("bbbbbbbbbbbb", NewEvent("JobAccepted", accepted))
        engine.ctx.emit("bbbbbbbbbbbb", NewEvent("OutboxWriteStarted", {"path": str(taken), "error_path": None}))
        run_until(engine, lambda: all_ended(engine), timeout=60, started=True)
    jobs = {j.file + ("-B" if j.job_id == "bbbbbbbbbbbb" else "-A"): j for j in engine.ctx.state.jobs.values()}
    a, b = jobs["a.csv-A"], jobs["a.csv-B"]
    assert a.result_path != b.result_path
    assert [r["response"] for r in result_rows(Path(a.result_path))] == [f"alpha {i}" for i in range(3)]
    assert [r["response"] for r in result_rows(Path(b.result_path))] == [f"beta {i}" for i in range(2)]
    assert b.result_path == str(taken)


# --- item 2: the database lost (or restored from before the job) -------------------------------


def test_a_job_recovered_from_its_work_folder_adopts_its_batches_instead_of_paying_again(home):
    write_rows(home.inbox / "a.csv", 6)
    config = "split_row_limit: 3\n"
    with Emulator(EmulatorConfig(api_key=TEST_KEY, validating_s=1.5)) as emu:
        with EventStore(home.db) as store:
            engine = make_engine(home, emu, store, config)
            run_until(
                engine,
                lambda: any(j.chunks and all(c.in_flight for c in j.chunks.values()) for j in engine.ctx.state.jobs.values()),
            )
        assert emu.batches_created() == 2
        for p in home.root.glob(home.db.name + "*"):  # the database is lost; the work folder stays
            p.unlink()
        with EventStore(home.db) as store:
            engine = make_engine(home, emu, store, config)
            run_until(engine, lambda: all_ended(engine), timeout=60)
            types = [e.type for e in store.read()]
        assert emu.batches_created() == 2, "the recovered job paid for its rows again"
    (job,) = engine.ctx.state.jobs.values()
    assert job.ended == "completed" and "RecoveredBatchesAdopted" in types
    rows = result_rows(home.outbox / "a_results.csv")
    assert [r["response"] for r in rows] == [f"review {i}" for i in range(6)] and all(r["grade"] for r in rows)


# --- item 4: daily_token_limit counts jobs in flight -------------------------------------------------


def test_daily_token_limit_counts_jobs_already_in_flight(home):
    import time as _time

    from batchgrader.core.configuration.config import load_config
    from batchgrader.core.rules.budget import job_tokens_bound
    from batchgrader.pipeline.pricing import load_pricing

    write_rows(home.inbox / "a.csv", 4)
    write_rows(home.inbox / "b.csv", 4)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, validating_s=5.0)) as emu, EventStore(home.db) as store:
        engine = make_engine(home, emu, store, "daily_token_limit: 1\n")
        run_until(engine, lambda: len(engine.ctx.state.jobs) == 2 and all(j.held for j in engine.ctx.state.jobs.values()))
        bound = max(job_tokens_bound(j, engine.ctx.profile_of(j)) for j in engine.ctx.state.jobs.values())
        home.config_file.write_text(
            home.config_file.read_text().replace("daily_token_limit: 1\n", f"daily_token_limit: {int(bound * 1.5)}\n")
        )
        engine.reload(load_config(home, environ={}), load_pricing())
        run_until(
            engine, lambda: any(c.in_flight for j in engine.ctx.state.jobs.values() for c in j.chunks.values()), started=True
        )
        for _ in range(5):
            engine.tick(_time.time())
        uploaded = [j for j in engine.ctx.state.jobs.values() if any(c.upload != "none" for c in j.chunks.values())]
        assert len(uploaded) == 1 and emu.batches_created() == 1, "both jobs passed the daily token check"
        (waiting,) = [j for j in engine.ctx.state.jobs.values() if j not in uploaded]
        assert waiting.held and "daily_token_limit" in waiting.held["reason"]


# --- item 8: cancel while a chunk waits on the queue limit ----------------------------------------


def test_cancel_while_a_chunk_waits_on_the_queue_limit_ends_the_job_cancelled(home):
    from batchgrader.store.eventstore import NewEvent

    write_rows(home.inbox / "a.csv", 10)
    cfg = EmulatorConfig(api_key=TEST_KEY, token_limits={"gpt-5.4-mini": 300}, in_progress_s=3.0)
    with Emulator(cfg) as emu, EventStore(home.db) as store:
        engine = make_engine(home, emu, store, "split_row_limit: 5\nmax_simultaneous_batches: 2\n")
        # refused, and waiting for room (its file uploaded ahead of it, or not yet)
        run_until(
            engine,
            lambda: any(
                (c.failure and c.failure.get("code") == "token_limit_exceeded") or c.staged
                for j in engine.ctx.state.jobs.values()
                for c in j.chunks.values()
            ),
        )
        (job,) = engine.ctx.state.jobs.values()
        assert any(e.payload.get("code") == "token_limit_exceeded" for e in store.read() if e.type == "ChunkFailed")
        engine.ctx.emit(job.job_id, NewEvent("CancelRequested", {"reason": "test"}))
        run_until(engine, lambda: all_ended(engine), timeout=40, started=True)
    (job,) = engine.ctx.state.jobs.values()
    assert job.ended == "cancelled"
    rows = result_rows(home.outbox / "a_results.csv")
    assert len(rows) == 10 and any("cancel" in r["error"] for r in rows)


# --- item 11: the watchdog heartbeat comes from the working thread during long steps ---------------


def test_a_long_prepare_and_a_long_listing_keep_the_heartbeat_going(home):
    import time as _time

    write_rows(home.inbox / "big.csv", 9000)  # three blocks of prepare's work
    beats: list[float] = []
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu, EventStore(home.db) as store:
        engine = make_engine(home, None, store, "stable_seconds: 0\n")
        engine.ctx.on_progress = lambda: beats.append(_time.monotonic())
        engine.startup(_time.time())
        per_tick = []
        for _ in range(50):
            before = len(beats)
            engine.tick(_time.time())
            per_tick.append(len(beats) - before)
            if any(j.prepared for j in engine.ctx.state.jobs.values()):
                break
            _time.sleep(0.01)
        assert any(j.prepared for j in engine.ctx.state.jobs.values())
        assert per_tick[-1] >= 3, f"one heartbeat per tick only, whatever the prepare's length: {per_tick}"
        provider_engine = make_engine(home, emu, store)
        provider = provider_engine.ctx.providers.get("openai")
        provider.list_page_size = 2  # type: ignore[attr-defined]
        for i in range(5):
            emu.store.files.create_file(f"f{i}.jsonl", b"{}", "batch", {})
        beats.clear()
        provider_engine.ctx.on_progress = lambda: beats.append(_time.monotonic())
        provider.find_files("nothing.jsonl")
        provider.find_batches(metadata={"bg_key": "x"})
        assert len(beats) >= 2, "a listing of many pages gave no sign of life"

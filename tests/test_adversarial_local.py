"""Issue 10, local side: moves that never clobber, the API key's forms, the log's schema,
bad control files and bad inbox entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchgrader import fsio


def test_move_no_clobber_never_overwrites_a_file_that_appears_after_the_check(tmp_path, monkeypatch):
    """Another process creates the chosen name between the free-name check and the move."""
    folder = tmp_path / "failed"
    folder.mkdir()
    src = tmp_path / "in.csv"
    src.write_text("mine")
    real_free_path = fsio.free_path
    raced: list[Path] = []

    def racing_free_path(f: Path, name: str, stamp: str) -> Path:
        p = real_free_path(f, name, stamp)
        if not raced:  # the race: somebody else's file lands on the name we just chose
            p.write_text("theirs")
            raced.append(p)
        return p

    monkeypatch.setattr(fsio, "free_path", racing_free_path)
    dest = fsio.move_no_clobber(src, folder, "in.csv", "20260101T000000Z")
    assert raced and raced[0].read_text() == "theirs", "the other file was overwritten"
    assert dest != raced[0] and dest.read_text() == "mine" and not src.exists()


def test_move_no_clobber_moves_and_picks_a_free_name(tmp_path):
    folder = tmp_path / "archive"
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("1")
    b.write_text("2")
    first = fsio.move_no_clobber(a, folder, "x.csv", "S")
    second = fsio.move_no_clobber(b, folder, "x.csv", "S")
    assert (first.name, first.read_text()) == ("x.csv", "1")
    assert (second.name, second.read_text()) == ("x_S.csv", "2")
    assert not a.exists() and not b.exists()


@pytest.mark.skipif(not fsio.sys.platform.startswith("linux"), reason="renameat2 is Linux only")
def test_rename_noreplace_refuses_an_existing_name(tmp_path):
    src, dest = tmp_path / "s", tmp_path / "d"
    src.write_text("s")
    dest.write_text("d")
    with pytest.raises(FileExistsError):
        fsio._rename_noreplace(src, dest)
    assert dest.read_text() == "d" and src.exists()


# --- item 15: the key ---------------------------------------------------------------------------


def test_key_with_surrounding_whitespace_or_crlf_is_stripped(home):
    from batchgrader.core.configuration.config import load_config

    for raw in ("  sk-proj-abcdefgh12345678\r\n", "\tsk-proj-abcdefgh12345678\n", "sk-proj-abcdefgh12345678\r"):
        assert load_config(home, environ={"OPENAI_API_KEY": raw}).api_key == "sk-proj-abcdefgh12345678"


def test_key_with_other_control_characters_is_refused_without_quoting_it(home):
    from batchgrader.core.configuration.config import ConfigError, load_config

    secret = "proj-abc\x00defgh12345678"
    with pytest.raises(ConfigError) as info:
        load_config(home, environ={"OPENAI_API_KEY": secret})
    msg = str(info.value)
    assert "control characters" in msg and "abc" not in msg and "12345678" not in msg


def test_every_key_form_is_masked_in_log_lines_and_exceptions():
    import logging

    from batchgrader.core.host.secrets import MaskSecrets

    key = "AbCdEf/gh+ij=KLmn0987"  # not sk- shaped, with characters that get escaped
    mask = MaskSecrets([key])
    lines = [
        f"key {key}",
        "json " + '"AbCdEf/gh+ij=KLmn0987"'.replace("/", "\\/"),
        "url AbCdEf%2Fgh%2Bij%3DKLmn0987",
        "header b'Authorization: Bearer unknown-shape-token-123456'",
        "sdk sk-live-0123456789abcdef",
    ]
    for line in lines:
        rec = logging.LogRecord("t", logging.ERROR, __file__, 1, line, (), None)
        mask.filter(rec)
        out = rec.getMessage()
        for leak in (key, "AbCdEf%2Fgh", "unknown-shape-token-123456", "0123456789abcdef", "KLmn0987"):
            assert leak not in out, (line, out)
    try:
        raise RuntimeError(f"Illegal header value b'Bearer {key}\\r\\n'")
    except RuntimeError:
        import sys

        rec = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    mask.filter(rec)
    assert key not in (rec.exc_text or "") and "KLmn0987" not in (rec.exc_text or "")


def test_doctor_scrubs_escaped_forms_of_the_key():
    from batchgrader.ops.doctor import _scrubber

    key = "AbCdEf/gh+ij=KLmn0987"
    scrub = _scrubber([key])
    for text in (key, "AbCdEf%2Fgh%2Bij%3DKLmn0987", repr(key.encode())):
        assert "KLmn0987" not in scrub(f"error: {text}")


# --- item 14: the log -----------------------------------------------------------------------------


def _golden_job(store, name: str, job_id: str) -> None:
    import json as _json

    from batchgrader.store.eventstore import NewEvent

    path = Path(__file__).parent / "golden" / f"{name}.jsonl"
    evs = [_json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    store.append(job_id, [NewEvent(e["type"], e["payload"]) for e in evs], expected_version=0)


def _raw_insert(db: Path, job_id: str, type_: str, payload: str) -> None:
    """A row as another (newer, or broken) writer left it: no validation on the way in."""
    import sqlite3

    conn = sqlite3.connect(db)
    (seq,) = conn.execute("SELECT COALESCE(MAX(job_seq), 0) + 1 FROM events WHERE job_id = ?", (job_id,)).fetchone()
    conn.execute(
        "INSERT INTO events (job_id, job_seq, type, version, ts, payload) VALUES (?, ?, ?, 1, '2026-01-01T00:00:00+00:00', ?)",
        (job_id, seq, type_, payload),
    )
    conn.commit()
    conn.close()


def test_unknown_event_or_bad_payload_sets_only_that_job_aside_with_the_reason(home):
    from batchgrader.core.log.state import fold
    from batchgrader.store import queries
    from batchgrader.store.eventstore import EventStore
    from batchgrader.store.readmodels import projectors

    with EventStore(home.db, projectors=projectors()) as store:
        _golden_job(store, "v1_happy_multichunk", "good")
        _golden_job(store, "v1_held", "future")
        _golden_job(store, "v1_held", "garbled")
    _raw_insert(home.db, "future", "SomethingFromTheFuture", '{"x": 1}')
    _raw_insert(home.db, "garbled", "JobReleased", "{not json")  # a torn or hand-edited row
    with EventStore(home.db, projectors=projectors()) as store:
        st = fold(store.read())  # never raises
    assert st.jobs["good"].corrupt is None and st.jobs["good"].ended == "completed"
    assert "unknown event type 'SomethingFromTheFuture'" in (st.jobs["future"].corrupt or "")
    assert "not valid JSON" in (st.jobs["garbled"].corrupt or "")
    assert {j.job_id for j in st.active_jobs()} == set()  # set aside: nothing acts on them
    rows = {r["job_id"]: r for r in queries.status(home)}
    assert rows["future"]["state"] == "corrupt" and "SomethingFromTheFuture" in rows["future"]["last_error"]
    assert rows["good"]["state"] == "completed"


def test_engine_goes_on_with_the_other_jobs_when_one_is_corrupt(home):
    from adversarial_engine import make_engine
    from batchgrader.store.eventstore import EventStore

    with EventStore(home.db) as store:
        _golden_job(store, "v1_held", "future")
    _raw_insert(home.db, "future", "SomethingFromTheFuture", "{}")
    with EventStore(home.db) as store:
        engine = make_engine(home, None, store)
        (home.inbox / "b.csv").write_text("response\nx\n")
        engine.startup(1_000.0)
        engine.tick(1_001.0)
        engine.tick(1_002.0)
        assert engine.ctx.state.jobs["future"].state == "corrupt"
        assert any(j.file == "b.csv" for j in engine.ctx.state.jobs.values())


def test_a_database_from_a_newer_schema_is_refused_and_left_untouched(home):
    import sqlite3

    from batchgrader.store.eventstore import EventStore, SchemaTooNew

    with EventStore(home.db):
        pass
    conn = sqlite3.connect(home.db)
    conn.execute("PRAGMA user_version=99")
    conn.commit()
    conn.close()
    before = home.db.read_bytes()
    with pytest.raises(SchemaTooNew, match="newer BatchGrader"):
        EventStore(home.db)
    with pytest.raises(SchemaTooNew):
        EventStore(home.db, readonly=True)
    assert home.db.read_bytes() == before


@pytest.mark.slow
def test_daemon_refuses_to_start_on_a_newer_database(home):
    import sqlite3

    from harness import bgctl

    conn = sqlite3.connect(home.db)
    conn.execute("PRAGMA user_version=7")
    conn.commit()
    conn.close()
    res = bgctl(home.root, "daemon", "--once", "--sandbox", timeout=60)
    assert res.returncode != 0 and "newer BatchGrader" in res.stderr
    assert "Traceback" not in res.stderr


# --- item 13: control files ---------------------------------------------------------------------


def test_control_requests_that_cannot_be_applied_are_reasons_not_crashes(home):
    from adversarial_engine import make_engine
    from batchgrader.daemon.control import apply_control
    from batchgrader.store.eventstore import EventStore

    with EventStore(home.db) as store:
        _golden_job(store, "v1_rejected_file", "rej")
        _golden_job(store, "v1_held", "held")
        engine = make_engine(home, None, store)
        assert "not a JSON object" in (apply_control(engine, [1, 2]) or "")
        assert "not a JSON object" in (apply_control(engine, "cancel") or "")
        assert "unknown job" in (apply_control(engine, {"action": "cancel", "job_id": "nope"}) or "")
        assert "unknown job" in (apply_control(engine, {"action": "cancel", "job_id": ["x"]}) or "")
        assert "cannot be retried" in (apply_control(engine, {"action": "retry", "job_id": "rej"}) or "")
        assert "unknown action" in (apply_control(engine, {"action": "explode", "job_id": "held"}) or "")
        assert apply_control(engine, {"action": "cancel", "job_id": "held"}) is None
        assert engine.ctx.state.jobs["held"].cancel_requested


@pytest.mark.slow
def test_bad_control_files_are_set_aside_and_start_up_goes_on(home):
    import json as _json

    from harness import bgctl

    folder = home.root / "control"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "1-list.json").write_text("[1, 2]")
    (folder / "2-unknown.json").write_text(_json.dumps({"action": "cancel", "job_id": "nope"}))
    (folder / "3-broken.json").write_text("{")
    (home.inbox / "notes.txt").write_text("not a table")
    res = bgctl(home.root, "daemon", "--once", "--sandbox", timeout=120)
    assert res.returncode == 4, res.stderr[-2000:]  # notes.txt ended rejected: `--once` says a job failed
    assert not list(folder.glob("*.json"))
    assert sorted(p.name for p in (folder / "rejected").iterdir()) == ["1-list.json", "2-unknown.json", "3-broken.json"]
    log_text = (home.logs / "daemon.log").read_text()
    assert "set aside (not a JSON object" in log_text and "unknown job 'nope'" in log_text
    status = _json.loads(bgctl(home.root, "status", "--json").stdout)
    (rej,) = [r for r in status if r["file"] == "notes.txt"]
    res = bgctl(home.root, "retry", rej["job_id"])
    assert res.returncode != 0 and "cannot be retried" in (res.stderr + res.stdout)
    assert not list(folder.glob("*.json"))  # nothing queued for the daemon


# --- item 2: the database replaced or deleted while running ------------------------------------


def test_appending_to_a_database_that_was_replaced_or_deleted_stops_with_a_clear_error(home):
    import shutil

    from batchgrader.store.eventstore import DatabaseMoved, EventStore, NewEvent

    with EventStore(home.db) as store:
        store.append("a", [NewEvent("CancelRequested", {"reason": "x"})])
        backup = home.root / "old-copy.db"
        shutil.copy(home.db, backup)
        os_replace = __import__("os").replace
        os_replace(backup, home.db)  # restored from an old copy under the running daemon
        with pytest.raises(DatabaseMoved, match="replaced"):
            store.append("a", [NewEvent("CancelRequested", {"reason": "y"})])
    with EventStore(home.db) as store:
        home.db.unlink()
        with pytest.raises(DatabaseMoved, match="deleted"):
            store.append("b", [NewEvent("CancelRequested", {"reason": "z"})])


@pytest.mark.slow
def test_daemon_stops_when_its_database_is_deleted(home):
    import subprocess

    from harness import start_daemon, wait_for

    proc = start_daemon(home.root, None, "--sandbox")
    try:
        wait_for(lambda: (home.logs / "daemon.log").exists() and "daemon ready" in (home.logs / "daemon.log").read_text())
        wait_for(lambda: home.db.exists())
        for p in home.root.glob(home.db.name + "*"):
            p.unlink()
        (home.inbox / "a.csv").write_text("response\nx\n")  # work for it to (not) record
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 1 and "was deleted while the daemon was running" in err


# --- item 12: inbox entries that cannot be taken ----------------------------------------------------


def test_a_file_name_that_is_not_utf8_gets_a_report_and_the_scan_goes_on(home):
    import os

    from adversarial_engine import make_engine
    from batchgrader.store.eventstore import EventStore

    bad = os.path.join(os.fsencode(home.inbox), b"caf\xe9.csv")
    with open(bad, "wb") as f:
        f.write(b"response\nx\n")
    (home.inbox / "good.csv").write_text("response\ny\n")
    with EventStore(home.db) as store:
        engine = make_engine(home, None, store, "stable_seconds: 0\n")
        engine.startup(1_000.0)
        for t in range(1, 5):
            engine.tick(1_000.0 + t)
        files = sorted(j.file for j in engine.ctx.state.jobs.values())
        types = [e.type for e in store.read()]
    assert files == ["caf\ufffd.csv", "good.csv"] and types.count("FileRejected") == 1
    assert not os.path.exists(bad) and (home.failed / "caf\ufffd.csv").read_text() == "response\nx\n"
    assert any("not valid UTF-8" in p.read_text() for p in home.outbox.glob("*error*"))
    assert all(any(d.iterdir()) for d in home.work.iterdir())  # no empty work folders


@pytest.mark.skipif(
    not Path("/dev/shm").is_dir() or Path("/dev/shm").stat().st_dev == Path("/tmp").stat().st_dev,
    reason="needs a second file system",
)
def test_an_inbox_on_another_file_system_gets_a_report_not_a_stuck_daemon(home, tmp_path):
    import shutil
    import tempfile

    from adversarial_engine import make_engine
    from batchgrader.store.eventstore import EventStore

    other = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        shutil.rmtree(home.inbox)
        home.inbox.symlink_to(other)
        (other / "far.csv").write_text("response\nx\n")
        with EventStore(home.db) as store:
            engine = make_engine(home, None, store, "stable_seconds: 0\n")
            engine.startup(1_000.0)
            for t in range(1, 6):
                engine.tick(1_000.0 + t)
            types = [e.type for e in store.read()]
        assert types.count("FileRejected") == 1 and "JobAccepted" not in types
        assert (other / "far.csv").exists()  # left where it is
        assert any("another file system" in p.read_text() for p in home.outbox.glob("*error*"))
        assert not list(home.work.iterdir())  # no empty work folders piled up
    finally:
        shutil.rmtree(other, ignore_errors=True)


# --- issue 32: names derived from a long file name fit the file system -----------------------------


def test_fit_name_cuts_the_stem_deterministically_to_255_utf8_bytes():
    assert fsio.fit_name("answers", "_results.csv") == "answers_results.csv"  # a name that fits is kept
    long_a, long_b = "é" * 124 + "a", "é" * 124 + "b"  # 249 bytes each, the same up to the end
    a, b = fsio.fit_name(long_a, "_results.csv"), fsio.fit_name(long_b, "_results.csv")
    assert len(a.encode()) <= 255 and len(b.encode()) <= 255 and a != b
    assert a.endswith("_results.csv") and a.startswith("é" * 100) and a == fsio.fit_name(long_a, "_results.csv")
    assert len(fsio.fit_name("x", "." + "y" * 300).encode()) <= 255  # an ending too long is cut too


def test_a_file_name_of_250_bytes_gets_its_result_and_its_error_report_and_the_daemon_goes_on(home, tmp_path):
    """Every name derived from an inbox file's name fits in 255 bytes: the result and the
    archived copy of a 250-byte name (twice, so the second gets a time-stamped name), the error
    report of a rejected one; the daemon goes on with the other files, tick after tick."""
    from batchgrader.pipeline.inbox import submit_file
    from ticks import Rig

    long_csv = "é" * 123 + ".csv"  # 250 bytes
    long_txt = "x" * 246 + ".txt"  # 250 bytes, an unsupported type: rejected with an error report
    assert len(long_csv.encode()) == len(long_txt.encode()) == 250
    rig = Rig(home)
    try:
        for round_ in (1, 2):
            src = tmp_path / str(round_) / long_csv
            src.parent.mkdir()
            src.write_text("id,response\n1,long\n", encoding="utf-8")
            submit_file(home, src, fresh=True)  # its marker's name is derived too
            (home.inbox / f"ok{round_}.csv").write_text("id,response\n1,fine\n")
            if round_ == 1:
                (home.inbox / long_txt).write_text("hello")
            rig.engine.scan_requested = True  # what the inbox watcher does
            for _ in range(3):
                rig.tick()
            rig.provider.finish_all()
            for _ in range(3):
                rig.tick(5)
        accepted = sorted(e["file"] for e in rig.events("JobAccepted"))
        assert accepted == sorted([long_csv, long_csv, "ok1.csv", "ok2.csv"]) and len(rig.events("JobCompleted")) == 4
        assert len(rig.events("FreshAnswersRequested")) == 2
        assert [e["file"] for e in rig.events("FileRejected")] == [long_txt]
        names = [p.name for folder in (home.outbox, home.archive, home.failed) for p in folder.iterdir()]
        assert all(len(n.encode()) <= 255 for n in names)
        results = sorted(p.name for p in home.outbox.iterdir() if p.name.startswith("é"))
        assert len(results) == 2 and results[0].endswith("_results.csv") and results[1].endswith("Z.csv")
        assert results[1].startswith(results[0].removesuffix(".csv") + "_")  # the same name, time-stamped
        assert all((home.outbox / n).read_text().count("long") == 1 for n in results)
        (report,) = [p for p in home.outbox.iterdir() if p.name.startswith("x") and p.name.endswith("_error.txt")]
        assert "unsupported file type" in report.read_text()
        assert len([p for p in home.archive.iterdir() if p.name.startswith("é")]) == 2
        assert not list(home.inbox.iterdir())  # every file taken, every marker removed
    finally:
        rig.close()


def test_control_characters_in_file_names_are_escaped_wherever_a_name_is_shown(home):
    """A newline, ESC or bidi override in an inbox file's name never splits a status line, fakes
    another one or drives the terminal: shown escaped (``\\n``, ``\\x1b``, ``\\u202e``) in the
    job list, the job's detail, the inbox listing, the events, the rejection reason and the error
    report; the job itself is graded as usual and --json keeps the real name."""
    from cli_fixtures import run
    from ticks import Rig

    graded = "evil\nJOB 1 completed\x1b[31m.csv"
    rejected = "bad\u202e\r\n.txt"
    rig = Rig(home)
    try:
        (home.inbox / graded).write_text("id,response\n1,a\n")
        (home.inbox / rejected).write_text("x")
        for _ in range(3):
            rig.tick()
        rig.provider.finish_all()
        for _ in range(3):
            rig.tick(5)
        (home.inbox / "wait\nme.csv").write_text("id,response\n1,a\n")
        (job,) = [j for j in rig.engine.ctx.state.jobs.values() if not j.rejected]
        assert job.ended == "completed" and job.file == graded
        (reason,) = [e["reason"] for e in rig.events("FileRejected")]
        assert reason.startswith("bad\\u202e\\r\\n.txt: unsupported file type")
        report = next(p for p in home.outbox.iterdir() if p.name.endswith("_error.txt")).read_text()
        assert report.startswith("BatchGrader could not process bad\\u202e\\r\\n.txt\n")
    finally:
        rig.close()
    shown = [run("status", "--all", columns=200), run("status", job.job_id, columns=200), run("events", columns=200)]
    assert all(r.exit_code == 0 for r in shown), [r.output for r in shown]
    listing, detail, events = (r.output for r in shown)
    assert "evil\\nJOB 1 completed\\x1b[31m.csv" in listing and "wait\\nme.csv" in listing
    assert "evil\\nJOB 1 completed\\x1b[31m.csv" in detail
    assert "bad\\u202e\\r\\n.txt" in listing and "bad\\u202e\\r\\n.txt" in events
    for out in (listing, detail, events):
        assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
        assert not any(line.lstrip().startswith(("JOB 1", "me.csv", ".txt")) for line in out.splitlines())
    as_json = json.loads(run("status", "--json").output)
    assert graded in {r.get("file") for r in as_json}

"""The inbox: stability, ignored names, rejects, periodic rescan without file events, atomic submit."""

from __future__ import annotations

import os

from batchgrader.core.configuration.config import load_config
from batchgrader.daemon.engine import Engine
from batchgrader.pipeline.inbox import InboxScanner, submit_file
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.store.eventstore import EventStore


def test_file_is_taken_only_when_unchanged_across_two_looks(home):
    scanner = InboxScanner(home, set(), stable_seconds=1.0)
    f = home.inbox / "a.csv"
    f.write_text("response\nx\n")
    first = os.stat(f)
    assert scanner.scan(now=0.0) == ([], []) and scanner.pending()
    with open(f, "a") as fh:
        fh.write("y\n")  # still being written
    os.utime(f, ns=(first.st_atime_ns, first.st_mtime_ns + 1))  # a new mtime even within the same clock tick
    assert scanner.scan(now=5.0)[0] == []  # changed since the first look: look again
    assert scanner.scan(now=5.5)[0] == []  # unchanged, but not for stable_seconds yet
    ready, _ = scanner.scan(now=6.0)
    assert [c.path.name for c in ready] == ["a.csv"] and ready[0].profile == "default"


def test_a_file_moved_in_settled_is_taken_at_its_first_look(home, tmp_path):
    """Issue 38: a file whose content had not changed for ``stable_seconds`` when it was moved into
    the inbox (its mtime that much older than its ctime, both the file system's stamps) is taken at
    its first look; one written in place waits for the two looks, and a file of a folder that
    names no profile is still rejected only once stable (a profile written just after it is known
    by then)."""
    scanner = InboxScanner(home, set(), stable_seconds=5.0)
    outside = tmp_path / "done.csv"
    outside.write_text("response\nx\n")
    old = os.stat(outside).st_mtime_ns - 60 * 10**9
    os.utime(outside, ns=(old, old))  # finished a minute ago
    os.rename(outside, home.inbox / "done.csv")
    (home.inbox / "writing.csv").write_text("response\ny\n")  # written in place just now
    (home.inbox / "nosuch").mkdir()
    (home.inbox / "nosuch" / "later.csv").write_text("response\nz\n")
    os.utime(home.inbox / "nosuch" / "later.csv", ns=(old, old))
    ready, rejected = scanner.scan(now=0.0)
    assert [c.path.name for c in ready] == ["done.csv"] and rejected == []
    assert scanner.pending()  # the other two wait for their second look
    scanner.forget(home.inbox / "done.csv")
    os.rename(home.inbox / "done.csv", tmp_path / "claimed.csv")  # as its claim does
    ready, rejected = scanner.scan(now=5.0)
    assert [c.path.name for c in ready] == ["writing.csv"] and [r.path.name for r in rejected] == ["later.csv"]
    assert not InboxScanner(home, set(), stable_seconds=0.0).scan(now=0.0)[0]  # 0: always the two looks


def test_ignored_names_and_rejections(home, tmp_path):
    scanner = InboxScanner(home, {"scored"}, stable_seconds=0.0)
    for name in (".hidden.csv", "upload.csv.part", "x.tmp", "~lock.csv"):
        (home.inbox / name).write_text("response\nx\n")
    (home.inbox / "notes.txt").write_text("hi")
    os.mkfifo(home.inbox / "pipe.csv")
    (home.inbox / "link.csv").symlink_to(tmp_path)
    (tmp_path / "outside.csv").write_text("response\nsecret\n")
    os.link(tmp_path / "outside.csv", home.inbox / "hard.csv")
    (home.inbox / "unknownprofile").mkdir()
    (home.inbox / "unknownprofile" / "f.csv").write_text("response\nx\n")
    (home.inbox / "scored").mkdir()
    (home.inbox / "scored" / "ok.csv").write_text("response\nx\n")
    scanner.scan(now=0.0)
    ready, rejected = scanner.scan(now=1.0)
    assert [(c.path.name, c.profile) for c in ready] == [("ok.csv", "scored")]
    codes = sorted((r.path.name, r.code, r.movable) for r in rejected)
    assert codes == [
        ("f.csv", "unknown_profile", False),
        ("hard.csv", "not_regular_file", False),
        ("link.csv", "not_regular_file", False),
        ("notes.txt", "unsupported_format", True),
        ("pipe.csv", "not_regular_file", False),
    ]


def test_periodic_rescan_finds_files_without_any_file_event(home):
    home.config_file.write_text("stable_seconds: 0\nrescan_interval_seconds: 10\n")
    cfg = load_config(home, environ={})
    with EventStore(home.db) as store:
        engine = Engine(home, cfg, store, providers=None, prices=load_pricing())
        engine.tick(now=100.0)  # start-up scan: nothing there
        engine.scan_requested = False  # no watcher event will come
        (home.inbox / "late.csv").write_text("response\nx\n")
        engine.tick(now=105.0)
        assert not engine.ctx.state.jobs  # not due yet, and nobody woke us
        engine.tick(now=110.0)  # the periodic rescan sees it (first look)
        engine.tick(now=110.1)  # second look: stable -> taken
        (job,) = engine.ctx.state.jobs.values()
        assert job.file == "late.csv" and (home.job_dir(job.job_id) / "input.csv").exists()


def test_submit_copies_atomically_and_never_overwrites(home, tmp_path):
    src = tmp_path / "data.csv"
    src.write_text("response\nx\n")
    first = submit_file(home, src)
    second = submit_file(home, src, profile="scored")
    third = submit_file(home, src)
    assert first == home.inbox / "data.csv" and third == home.inbox / "data-1.csv"
    assert second == home.inbox / "scored" / "data.csv"
    assert not [p for p in home.inbox.rglob(".*")]
    assert src.read_text() == first.read_text()


def test_watchdogs_stop_race_line_does_not_reach_the_log(home, caplog):
    """Issue 27, item 11: watchdog's "InotifyEmitter.queue_events() called when the thread is
    inactive" (a harmless race when the watcher stops) no longer reaches stderr or the log."""
    import logging
    import threading

    from batchgrader.pipeline.inbox import InboxWatcher

    watcher = InboxWatcher(home, threading.Event())
    watcher.start()
    watcher.stop()
    noisy = logging.getLogger("watchdog.observers.inotify")
    with caplog.at_level(logging.ERROR):
        noisy.error("InotifyEmitter.queue_events() called when the thread is inactive")
        noisy.error("a real inotify problem")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["a real inotify problem"]


def test_a_hard_link_to_a_file_outside_the_home_is_refused_and_left_alone(home, tmp_path):
    """A hard link is refused as a symbolic link is: reported, never taken, never moved; the
    daemon goes on with the other files."""
    from ticks import Rig

    outside = tmp_path / "private.csv"
    outside.write_text("id,response\n1,secret\n")
    rig = Rig(home)
    try:
        os.link(outside, home.inbox / "hard.csv")
        (home.inbox / "a.csv").write_text("id,response\n1,fine\n")
        rig.tick()
        rig.tick()
        (rejected,) = rig.events("FileRejected")
        assert rejected["file"] == "hard.csv" and rejected["code"] == "not_regular_file"
        assert [e["file"] for e in rig.events("JobAccepted")] == ["a.csv"]
        report = (home.outbox / "hard_error.txt").read_text()
        assert "hard.csv is a hard link (one of 2 names of the same file" in report
        assert "Copy the real file (not a link or special file) into the inbox" in report
        assert (home.inbox / "hard.csv").exists() and os.stat(outside).st_nlink == 2  # left where it is
        assert all("hard" not in e["path"] for e in rig.events("InputArchived"))
    finally:
        rig.close()


def test_a_file_queued_in_a_profile_written_during_a_scan_is_taken_with_it_never_rejected(home):
    """The Python API writes a profile into config.yaml, then queues the file in its folder; a
    daemon ticking meanwhile may have checked config.yaml for edits just before the write and
    scan the inbox just after the file arrived.  That scan must not reject the file (the
    profile is unknown to it only for now): the next tick reloads the edited config.yaml before
    its scan, and the file is taken with its profile.  A folder no profile names is still
    rejected, at the second look, once, and then waits for nothing."""
    home.config_file.write_text("stable_seconds: 0\nrescan_interval_seconds: 10\n")
    with EventStore(home.db) as store:
        engine = Engine(home, load_config(home, environ={}), store, providers=None, prices=load_pricing())
        engine.tick(now=100.0)
        # the tick's edit check came before this; its scan comes after
        home.config_file.write_text("stable_seconds: 0\nrescan_interval_seconds: 10\nprofiles:\n  py-1:\n    temperature: 0\n")
        (home.inbox / "py-1").mkdir()
        (home.inbox / "py-1" / "frame.csv").write_text("response\nx\n")
        (home.inbox / "nowhere").mkdir()
        (home.inbox / "nowhere" / "lost.csv").write_text("response\nx\n")
        engine.scan_requested = True
        engine.tick(now=100.1)
        assert not engine.ctx.state.jobs  # neither is rejected at its first look
        engine.reload(load_config(home, environ={}), load_pricing())  # the next tick: config.yaml changed
        engine.tick(now=100.2)
        jobs = sorted(engine.ctx.state.jobs.values(), key=lambda j: j.file)
        assert [(j.file, j.profile, j.rejected) for j in jobs] == [("frame.csv", "py-1", False), ("lost.csv", "default", True)]
        for now in (100.3, 100.4, 111.0):
            engine.scan_requested = True
            engine.tick(now=now)
        assert [e.type for e in store.read() if e.type == "FileRejected"] == ["FileRejected"]  # once
        assert not engine.steps.intake.pending()  # a rejected file is not looked at again and again


def test_a_file_is_hashed_while_it_becomes_stable_and_again_at_its_claim_if_it_changed(home):
    """Issue 38: a file seen in the inbox is hashed in the background while it becomes stable, and
    its claim takes that hash if the file's size and mtime are still those it was first seen
    with; a file changed since is hashed again at its claim (its job names the content taken)."""
    import hashlib
    import threading

    from batchgrader.pipeline.inbox import HashAhead
    from batchgrader.pipeline.prepare import file_sha256
    from ticks import Rig

    rig = Rig(home)
    hashed: list[str] = []
    done = threading.Event()

    def counted(path):  # noqa: ANN001, ANN202
        sha = file_sha256(path)
        hashed.append(path.name)
        done.set()
        return sha

    intake = rig.engine.steps.intake
    intake.hashes = HashAhead(counted)
    first = "id,response\n0,first\n1,second\n"
    (home.inbox / "a.csv").write_text(first)
    assert rig.tick() == []  # seen, not yet stable ...
    assert done.wait(timeout=30) and hashed == ["a.csv"]  # ... and hashed meanwhile
    st = os.stat(home.inbox / "a.csv")
    (home.inbox / "a.csv").write_text(first.replace("first", "FIRST"))  # the same size ...
    os.utime(home.inbox / "a.csv", ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and mtime: unchanged, as the inbox sees files
    assert rig.tick()[:1] == ["JobAccepted"]
    assert rig.job().sha256 == hashlib.sha256(first.encode()).hexdigest()  # the claim took the hash made ahead

    (home.inbox / "b.csv").write_text("id,response\n0,third\n")
    intake.scan_requested = True  # as the inbox's watcher does at each change
    assert "JobAccepted" not in rig.tick()  # hashed ahead as it was then ...
    second = "id,response\n0,third\n1,fourth\n"
    (home.inbox / "b.csv").write_text(second)  # ... then changed
    intake.scan_requested = True
    assert "JobAccepted" not in rig.tick()  # changed since the last look: not stable yet
    assert "JobAccepted" in rig.tick()
    assert hashed == ["a.csv", "b.csv"]  # b.csv hashed ahead once, at its first look
    job = max(rig.engine.ctx.state.jobs.values(), key=lambda j: j.created_ts)
    assert job.file == "b.csv" and job.sha256 == hashlib.sha256(second.encode()).hexdigest()  # the content taken
    rig.close()


def test_a_tick_takes_a_file_moved_in_settled_at_once_and_waits_for_one_written_in_place(home, tmp_path):
    """The rule above through the engine's tick, with ``stable_seconds: 5`` and one tick a second:
    a file moved in settled is accepted in the tick that first sees it; one written in the inbox
    only in a tick at least 5 s after its first look."""
    from ticks import Rig

    rig = Rig(home)
    rig.reconfigure("stable_seconds: 5\n")
    assert rig.engine.ctx.settings.stable_seconds == 5
    outside = tmp_path / "moved.csv"
    outside.write_text("id,response\n0,first\n")
    old = os.stat(outside).st_mtime_ns - 60 * 10**9
    os.utime(outside, ns=(old, old))
    os.rename(outside, home.inbox / "moved.csv")
    rig.engine.steps.intake.scan_requested = True  # as the inbox's watcher does
    assert "JobAccepted" in rig.tick()
    (home.inbox / "written.csv").write_text("id,response\n0,second\n")
    rig.engine.steps.intake.scan_requested = True
    accepted = [("JobAccepted" in rig.tick()) for _ in range(7)]
    assert accepted.index(True) >= 4  # its first look, then 5 s
    rig.close()

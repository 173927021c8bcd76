"""A daemon on the PostgreSQL event store (``store_url``): a real `bgctl daemon` subprocess, the
sandbox emulator, a real PostgreSQL server (tests/pg_server.py).  The daemon runs under the
job's and the provider account's leases instead of the home's file lock, and its result equals
the SQLite daemon's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchgrader.core.host.home import Home
from harness import FAST_CONFIG, daemon_env

pytestmark = pytest.mark.slow

ROWS = "id,response\n" + "".join(f"{i:03d},text {i}\n" for i in range(7))
CONFIG = FAST_CONFIG + "split_row_limit: 3\n"  # three chunks: three batches at the emulator


def _run(root: Path, store_url: str | None, *args: str, timeout: float = 180):
    import subprocess

    from harness import BGCTL

    env = daemon_env(root, None, key=None)
    if store_url:
        env["BATCHGRADER_STORE_URL"] = store_url
    return subprocess.run([BGCTL, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _home(tmp_path: Path, name: str) -> Home:
    home = Home.resolve(tmp_path / name).ensure()
    home.config_file.write_text(CONFIG)
    (home.inbox / "reviews.csv").write_text(ROWS, encoding="utf-8")
    return home


def test_a_sandbox_daemon_on_postgresql_grades_a_file_as_the_sqlite_daemon_does(tmp_path: Path, pg_url: str):
    pg, lite = _home(tmp_path, "pg"), _home(tmp_path, "lite")

    res = _run(pg.root, pg_url, "daemon", "--sandbox", "--once")
    assert res.returncode == 0, res.stderr
    assert not pg.db.exists()  # the log is in PostgreSQL, not the home's file
    res = _run(lite.root, None, "daemon", "--sandbox", "--once")
    assert res.returncode == 0, res.stderr

    status = json.loads(_run(pg.root, pg_url, "status", "--json").stdout)
    jobs = [x for x in status if x["state"] != "lease"]
    assert [(j["file"], j["state"]) for j in jobs] == [("reviews.csv", "completed")]
    assert [j["state"] for j in json.loads(_run(lite.root, None, "status", "--json").stdout)] == ["completed"]
    # the daemon worked under the job's and the account's leases (no file lock), was live under
    # its own (daemon:<host:pid:id>), and released them all
    leases = [x for x in status if x["state"] == "lease"]
    assert [(x["name"].split(":")[0], x["holder"], x["fence"]) for x in leases] == [
        ("account", None, 1),
        ("daemon", None, 1),
        ("job", None, 1),
    ]
    assert [x["name"] for x in leases][::2] == ["account:openai:sandbox", f"job:{jobs[0]['job_id']}"]
    assert leases[1]["kind"] == "daemon" and leases[1]["name"].count(":") == 3
    assert not (pg.root / "daemon.lock").exists()

    pg_out = sorted((pg.outbox).iterdir())
    lite_out = sorted((lite.outbox).iterdir())
    assert [p.name for p in pg_out] == [p.name for p in lite_out] == ["reviews_results.csv"]
    assert pg_out[0].read_bytes() == lite_out[0].read_bytes()


def test_a_daemon_on_a_shared_log_folds_the_others_events_and_decides_again_on_a_conflict(home: Home, pg_url: str):
    """Tick level, two engines on one PostgreSQL log: each tick and each emit fold what the other
    appended; an emit decided on a job another daemon appended to meanwhile appends nothing,
    folds the other's event and raises ConcurrencyError, which the engine answers by deciding
    again (docs/scaling.md)."""
    from adversarial_engine import make_engine
    from batchgrader.core.log.events import NewEvent
    from batchgrader.store.eventstore import ConcurrencyError
    from batchgrader.store.pgstore import PostgresEventStore

    with PostgresEventStore(pg_url) as mine, PostgresEventStore(pg_url) as theirs:
        a, b = make_engine(home, None, mine), make_engine(home, None, theirs)
        a.ctx.follow()
        b.ctx.follow()
        b.ctx.emit("J", NewEvent("CancelRequested", {"reason": "by b"}))
        assert "J" not in a.ctx.state.jobs
        a.ctx.catch_up()
        assert a.ctx.state.jobs["J"].version == 1  # folded before a decides anything

        b.ctx.emit("J", NewEvent("CancelRequested", {"reason": "b again"}))  # a has not seen this one
        with pytest.raises(ConcurrencyError):
            a.ctx.emit("J", NewEvent("CancelRequested", {"reason": "a, decided on version 1"}))
        assert a.ctx.state.jobs["J"].version == 2  # b's event folded; a's stale decision not appended
        assert [e.payload["reason"] for e in mine.read(job_id="J")] == ["by b", "b again"]

        a.ctx.emit("J", NewEvent("CancelRequested", {"reason": "a, decided again"}))
        b.ctx.catch_up()
        assert [e.seq for e in mine.read()] == [e.seq for e in theirs.read()]
        assert a.ctx.state.jobs["J"].version == b.ctx.state.jobs["J"].version == 3

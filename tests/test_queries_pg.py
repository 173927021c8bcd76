"""`bgctl status`, `events` and `costs` on a shared PostgreSQL store (``store_url``): the golden
home's log copied into a real PostgreSQL server (bgctl store copy keeps positions and times), then
every query asked of both backends must answer the same; `bgctl status` also shows the leases."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchgrader.cli.commands import cli
from batchgrader.core.host.home import Home
from batchgrader.store import answers, costs, log_queries, queries
from batchgrader.store.copy import copy_log
from batchgrader.store.leases import Leases, account_lease, job_lease
from batchgrader.store.pgstore import PostgresEventStore
from cli_fixtures import golden_home

NOW = 1_795_000_000.0  # 2026-11-18


@pytest.fixture
def both(home: Home, pg_url: str, monkeypatch: pytest.MonkeyPatch):
    """The golden home, its log copied into PostgreSQL; ``ask(f)`` calls ``f(home)`` on the SQLite
    file and then with ``BATCHGRADER_STORE_URL`` set, and returns both answers."""
    golden_home(home)
    assert copy_log(home.db, pg_url).same_state

    def ask(f):
        monkeypatch.delenv("BATCHGRADER_STORE_URL", raising=False)
        assert queries.store_url(home) is None
        on_file = f(home)
        monkeypatch.setenv("BATCHGRADER_STORE_URL", pg_url)
        assert queries.store_url(home) == pg_url
        try:
            return on_file, f(home)
        finally:
            monkeypatch.delenv("BATCHGRADER_STORE_URL")

    return ask


def test_status_and_its_overview_read_the_same_read_models_on_both_backends(both):
    on_file, on_pg = both(lambda h: queries.status(h, now=NOW))
    assert on_pg == on_file and on_pg and all(r["source"] == "read_model" for r in on_pg)
    on_file, on_pg = both(lambda h: queries.status_overview(h, active_limit=2, finished_limit=2, now=NOW))
    assert on_pg == on_file and on_pg["total"] == len(on_file["jobs"]) + on_file["hidden_active"] + on_file["hidden_finished"]


def test_one_job_by_prefix_its_detail_and_completion_on_both_backends(both):
    jobs, _ = both(lambda h: queries.status(h, now=NOW))
    names = [r["job_id"] for r in jobs]
    first = next(r for r in jobs if sum(n.startswith(r["job_id"][:4]) for n in names) == 1)
    prefix = first["job_id"][:4]
    for f in (lambda h: queries.job_detail(h, "1943527", now=NOW), lambda h: queries.job_detail(h, "nope", now=NOW)):
        errors = []
        for _ in both(lambda h: errors.append(pytest.raises(queries.QueryError, f, h).value.__class__)):
            pass
        assert len(errors) == 2 and errors[0] == errors[1]
    on_file, on_pg = both(lambda h: queries.job_detail(h, prefix, now=NOW))
    assert on_pg == on_file and on_pg["job_id"] == first["job_id"] and on_pg["recent_events"]
    on_file, on_pg = both(lambda h: queries.job_ids(h, prefix))
    assert on_pg == on_file and on_pg


def test_events_and_their_last_ones_on_both_backends(both):
    on_file, on_pg = both(lambda h: log_queries.events(h))
    assert on_pg == on_file and len(on_pg) > 50
    on_file, on_pg = both(lambda h: log_queries.events(h, last=5))
    assert on_pg == on_file == on_file[-5:]
    job = on_file[0]["job_id"]
    on_file, on_pg = both(lambda h: list(log_queries.follow_events(h, job, poll=0.01, stop=lambda: True)))
    assert on_pg == on_file and {e["job_id"] for e in on_pg} == {job}


@pytest.mark.parametrize("by", ["day", "model", "job", "route"])
def test_costs_on_both_backends(both, by: str):
    on_file, on_pg = both(lambda h: costs.costs(h, by=by))
    assert on_pg == on_file and on_pg["source"] == "read_model" and on_pg["totals"]["cost_usd"] > 0


def test_a_read_model_behind_the_log_is_said_and_folded_around(both, pg_url: str):
    with PostgresEventStore(pg_url) as s, s.write() as conn:
        conn.execute("UPDATE projection_state SET last_seq = last_seq - 3")
    on_file, on_pg = both(lambda h: queries.status(h, now=NOW))
    assert on_pg[0]["source"] == "log" and "3 event(s) behind" in on_pg[0]["note"]
    assert [{k: v for k, v in r.items() if k not in ("source", "note")} for r in on_pg] == [
        {k: v for k, v in r.items() if k not in ("source", "note")} for r in on_file
    ]


def test_an_unreachable_store_is_a_clear_error(home: Home, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BATCHGRADER_STORE_URL", "postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(queries.QueryError, match="cannot reach the event store postgresql://nobody@127.0.0.1:1/none"):
        queries.status(home)


def test_cache_stats_and_clear_use_the_store(home: Home, pg_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BATCHGRADER_STORE_URL", pg_url)
    assert answers.home_stats(home)["answers"] == 0  # no log there yet
    with PostgresEventStore(pg_url) as s, s.write() as conn:
        s.answers.put(conn, [{"key": "k", "provider": "openai", "model": "m", "content": "x", "finish_reason": "stop",
                              "prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 1, "reasoning_tokens": 0,
                              "job_id": "j", "custom_id": "c", "batch_id": None}], now=NOW)  # fmt: skip
    assert answers.home_stats(home)["answers"] == 1 and not home.db.exists()
    assert answers.home_clear(home) == 1 and answers.home_stats(home)["answers"] == 0


def bgctl(home: Home, *args: str):
    return CliRunner().invoke(cli, ["--home", str(home.root), *args], catch_exceptions=False)


def test_status_shows_which_daemon_holds_which_lease(both, home: Home, pg_url: str, monkeypatch: pytest.MonkeyPatch):
    store = PostgresEventStore(pg_url)
    try:
        a, b = Leases(store, "daemon-a@host1"), Leases(store, "daemon-b@host2")
        a.acquire(account_lease("openai", "org-1:proj-1"), 600.0, now=NOW - 100)
        b.acquire(job_lease("abc123"), 600.0, now=NOW - 100)
        old = a.acquire(job_lease("old"), 60.0, now=NOW - 100)
        gone = b.acquire(job_lease("done"), 60.0, now=NOW - 100)
        b.release(gone)
    finally:
        store.close()
    monkeypatch.setenv("BATCHGRADER_STORE_URL", pg_url)
    monkeypatch.setenv("BGCTL_NOW", "2026-11-18T11:06:40")  # NOW
    got = queries.leases(home, now=NOW)
    assert got == [
        {"name": "account:openai:org-1:proj-1", "kind": "account", "holder": "daemon-a@host1", "fence": 1, "held": True,
         "expires_at": "2026-11-18T11:15:00+00:00", "seconds_left": 500.0},
        {"name": "job:abc123", "kind": "job", "holder": "daemon-b@host2", "fence": 1, "held": True,
         "expires_at": "2026-11-18T11:15:00+00:00", "seconds_left": 500.0},
        {"name": "job:done", "kind": "job", "holder": None, "fence": 1, "held": False, "expires_at": None, "seconds_left": None},
        {"name": "job:old", "kind": "job", "holder": "daemon-a@host1", "fence": old.fence, "held": False,
         "expires_at": "2026-11-18T11:06:00+00:00", "seconds_left": None},
    ]  # fmt: skip
    res = bgctl(home, "status", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r for r in rows if r["state"] == "lease"] == [{"job_id": None, "state": "lease", **x} for x in got]
    assert [r["job_id"] for r in rows if r["job_id"]] == [r["job_id"] for r in queries.status(home, now=NOW)]
    monkeypatch.setenv("COLUMNS", "160")
    res = bgctl(home, "status")
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "Leases" in out and "account:openai:org-1:proj-1 daemon-a@host1 1 2026-11-18 11:15:00 8m" in out
    assert "job:old daemon-a@host1 (lapsed)" in out and "job:done free" in out


def test_status_shows_which_daemon_holds_each_job(both, home: Home, pg_url: str, monkeypatch: pytest.MonkeyPatch):
    """On a shared store each job's row names the daemon holding its lease (None: no daemon holds
    it, or the lease has lapsed), in the list, the overview, one job's detail, `--json` and the
    tables; on the SQLite file no job has one."""
    jobs, _ = both(lambda h: queries.status(h, now=NOW))
    held, lapsed = jobs[0]["job_id"], jobs[1]["job_id"]
    store = PostgresEventStore(pg_url)
    try:
        Leases(store, "host1:101:aaaa").acquire(job_lease(held), 600.0, now=NOW - 100)
        Leases(store, "host2:202:bbbb").acquire(job_lease(lapsed), 60.0, now=NOW - 100)  # lapsed at NOW - 40
    finally:
        store.close()
    expected = {r["job_id"]: ("host1:101:aaaa" if r["job_id"] == held else None) for r in jobs}
    on_file, on_pg = both(lambda h: queries.status(h, now=NOW))
    assert {r["job_id"]: r["daemon"] for r in on_pg} == expected
    assert {r["daemon"] for r in on_file} == {None}
    _, overview = both(lambda h: queries.status_overview(h, now=NOW))
    assert {r["job_id"]: r["daemon"] for r in overview["jobs"]} == {r["job_id"]: expected[r["job_id"]] for r in overview["jobs"]}
    on_file, on_pg = both(lambda h: queries.job_detail(h, held, now=NOW))
    assert (on_file["daemon"], on_pg["daemon"]) == (None, "host1:101:aaaa")
    monkeypatch.setenv("BATCHGRADER_STORE_URL", pg_url)
    monkeypatch.setenv("BGCTL_NOW", "2026-11-18T11:06:40")  # NOW
    rows = json.loads(bgctl(home, "status", "--json").output)
    assert {r["job_id"]: r["daemon"] for r in rows if r["job_id"]} == expected
    monkeypatch.setenv("COLUMNS", "200")
    out = bgctl(home, "status", "--all").output
    header = next(line for line in out.splitlines() if "job / file" in line)
    assert header.split()[-1] == "daemon"
    (line,) = [line for line in out.splitlines() if line.split()[:1] == [held]]
    assert line.split()[-1] == "host1:101:aaaa"
    assert "host2:202:bbbb (lapsed)" in " ".join(out.split())  # in the leases' table, not as a job's daemon
    detail = " ".join(bgctl(home, "status", held).output.split())
    assert "daemon host1:101:aaaa" in detail
    assert "host2:202:bbbb" not in bgctl(home, "status", lapsed).output


def test_status_on_the_sqlite_file_has_no_leases(home: Home):
    golden_home(home)
    assert queries.leases(home) is None
    rows = json.loads(bgctl(home, "status", "--json").output)
    assert not [r for r in rows if r["state"] == "lease"]
    assert "Leases" not in bgctl(home, "status").output

"""`bgctl store copy --to postgresql://...` (store/copy.py): a home's SQLite log copied into a
real PostgreSQL server, positions kept, incrementally, verified by folding both."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from batchgrader.cli.commands import cli
from batchgrader.core.host.home import Home
from batchgrader.core.log.events import NewEvent
from batchgrader.core.log.state import fold
from batchgrader.store.copy import CopyRefused, copy_log
from batchgrader.store.eventstore import EventStore
from batchgrader.store.pgstore import PostgresEventStore
from batchgrader.store.readmodels import job_row
from cli_fixtures import golden_home


def bgctl(home: Home, *args: str):
    return CliRunner().invoke(cli, ["--home", str(home.root), *args], catch_exceptions=False)


def test_a_copy_keeps_every_event_and_folds_to_the_same_state(home: Home, pg_url: str):
    golden_home(home)
    res = bgctl(home, "store", "copy", "--to", pg_url, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    with EventStore(home.db, readonly=True) as src, PostgresEventStore(pg_url, readonly=True) as dst:
        ours, theirs = list(src.read()), list(dst.read())
        assert theirs == ours and len(ours) == out["copied"] > 0  # positions, times and payloads kept
        state = fold(theirs)
        assert {r["job_id"]: r for r in dst.read_model("job_status")} == {j: job_row(s) for j, s in state.jobs.items()}
        assert dst.read_model("usage") == src.read_model("usage")  # the costs, row for row
    assert out["same_state"] is True and out["already"] == 0 and out["jobs"] == len(state.jobs)
    assert out["target"] == pg_url

    with PostgresEventStore(pg_url) as dst:  # the copy's sequence goes on after the copied positions
        assert dst.append("new-job", [NewEvent("CancelRequested", {"reason": "r"})])[0].seq > ours[-1].seq


def test_a_second_copy_adds_only_what_was_appended_since(home: Home, pg_url: str):
    golden_home(home)
    first = copy_log(home.db, pg_url)
    with EventStore(home.db) as s:  # the daemon went on meanwhile
        s.append("later", [NewEvent("CancelRequested", {"reason": "r"})])
    second = copy_log(home.db, pg_url)
    assert (second.already, second.copied) == (first.copied, 1) and second.same_state
    res = bgctl(home, "store", "copy", "--to", pg_url)
    assert res.exit_code == 0 and "copied 0 event(s)" in res.output and "verified: both logs fold to the same state" in res.output


def test_a_target_holding_another_log_is_refused_untouched(home: Home, pg_url: str):
    golden_home(home)
    with PostgresEventStore(pg_url) as other:
        other.append("someone-else", [NewEvent("CancelRequested", {"reason": "x"})])
    with pytest.raises(CopyRefused, match="not this log's first ones"):
        copy_log(home.db, pg_url)
    res = bgctl(home, "store", "copy", "--to", pg_url)
    assert res.exit_code != 0 and "not this log's first ones" in res.output
    with PostgresEventStore(pg_url, readonly=True) as dst:
        assert [e.job_id for e in dst.read()] == ["someone-else"]


def test_copy_needs_a_postgresql_target(home: Home):
    golden_home(home)
    res = bgctl(home, "store", "copy")
    assert res.exit_code != 0 and "--to postgresql://" in res.output

"""What only the PostgreSQL event store has (store/pgstore.py), on a real server: gaps in the
positions, connections killed by the server (``pg_terminate_backend``) under a listener and under
an append, the schema version, and ``store_url`` choosing the backend."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.core.host.home import Home
from batchgrader.core.log.events import NewEvent
from batchgrader.store.backend import Follower, open_store
from batchgrader.store.eventstore import EventStore, SchemaTooNew
from batchgrader.store.pgstore import PostgresEventStore, redact


def ev(reason: str = "r") -> NewEvent:
    return NewEvent("CancelRequested", {"reason": reason})


@pytest.fixture
def store(pg_url: str):
    s = PostgresEventStore(pg_url)
    yield s
    s.close()


def terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0] is True


def test_positions_may_have_gaps_and_a_tailing_reader_tracks_the_last_seen(store: PostgresEventStore):
    first = store.append("A", [ev()])

    def fail(_conn: Any) -> None:
        raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        store.append("B", [ev(), ev()], also=fail)  # consumes two sequence values, commits nothing
    after = store.append("C", [ev()])
    assert after[0].seq > first[0].seq + 1  # a gap
    assert [e.job_id for e in store.read(after=first[0].seq)] == ["C"]


def test_a_listener_whose_connection_is_killed_reconnects_and_reports_a_wake_up(store: PostgresEventStore, pg_url: str):
    store.append("A", [ev()])
    last = store.last_seq()
    assert store.wait_for_append(last, timeout=0.1) is False
    terminate(pg_url, store.backend_pid())
    # the loss is reported as a wake-up: the caller re-reads from its last position (NOTIFY is not durable)
    assert store.wait_for_append(last, timeout=10) is True
    assert list(store.read(after=last)) == []
    old_pid = store.backend_pid()
    t = threading.Thread(target=lambda: PostgresEventStore(pg_url).append("B", [ev("b")]))
    t.start()
    assert store.wait_for_append(last, timeout=30) is True  # listening again on a new connection
    t.join(timeout=30)
    assert [e.job_id for e in store.read(after=last)] == ["B"]
    assert store.backend_pid() == old_pid


def test_appends_go_on_after_the_servers_connections_are_killed(store: PostgresEventStore, pg_url: str):
    store.append("A", [ev()])
    with psycopg.connect(pg_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]
    assert killed >= 1
    stored = store.append("A", [ev("after the kill")], expected_version=1)  # the pool lends a live connection
    assert stored[0].job_seq == 2
    assert [e.job_seq for e in store.read(job_id="A")] == [1, 2]


def test_an_append_whose_connection_dies_in_its_transaction_writes_nothing(store: PostgresEventStore, pg_url: str):
    store.append("A", [ev()])

    def killed(conn: Any) -> None:
        terminate(pg_url, conn.info.backend_pid)

    with pytest.raises(psycopg.OperationalError):
        store.append("A", [ev("lost")], expected_version=1, also=killed)
    assert [e.payload["reason"] for e in store.read(job_id="A")] == ["r"]
    assert store.append("A", [ev("again")], expected_version=1)[0].job_seq == 2


def test_a_database_written_by_a_newer_version_is_refused(store: PostgresEventStore, pg_url: str):
    with store.write() as conn:
        conn.execute("UPDATE bg_meta SET value = value + 1 WHERE name = 'schema_version'")
    with pytest.raises(SchemaTooNew, match="newer BatchGrader"):
        PostgresEventStore(pg_url)


def test_a_read_only_store_needs_an_existing_log(pg_url: str):
    with pytest.raises(FileNotFoundError, match="no event log"):
        PostgresEventStore(pg_url, readonly=True)


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(ConnectionError, match="cannot reach the event store postgresql://bg:\\*\\*\\*@127.0.0.1:1/x"):
        PostgresEventStore("postgresql://bg:secret@127.0.0.1:1/x", open_timeout=1)


def test_the_password_never_appears_in_what_is_shown():
    assert redact("postgresql://u:s3cret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"


def test_store_url_chooses_the_backend(home: Home, pg_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BATCHGRADER_STORE_URL", pg_url)
    url = load_config(home).store_url
    assert url == pg_url
    with open_store(home, url) as s:
        assert isinstance(s, PostgresEventStore)
        s.append("A", [ev()])
    assert not home.db.exists()  # the SQLite file was never made
    monkeypatch.delenv("BATCHGRADER_STORE_URL")
    with open_store(home, load_config(home).store_url) as s:
        assert isinstance(s, EventStore) and s.where == str(home.db) and s.last_seq() == 0
    monkeypatch.setenv("BATCHGRADER_STORE_URL", "mysql://h/db")
    with pytest.raises(ConfigError, match="postgresql://"):
        load_config(home)
    monkeypatch.setenv("BATCHGRADER_STORE_URL", "postgresql://bg:s3cret@db/batchgrader")
    with pytest.raises(ConfigError, match="pgpass") as err:
        load_config(home)
    assert "s3cret" not in str(err.value)


def test_a_follower_misses_nothing_across_a_killed_listener(store: PostgresEventStore, pg_url: str):
    """Events committed while the listening connection is gone (their NOTIFY lost) are read
    after the reconnect, from the last position seen."""
    writer = PostgresEventStore(pg_url)
    try:
        follower = Follower(store)
        writer.append("A", [ev("a")])
        assert [e.job_id for e in follower.poll(timeout=10)] == ["A"]
        assert follower.poll(timeout=0.1) == []  # listening now
        terminate(pg_url, store.backend_pid())
        writer.append("B", [ev("b")])  # its notification goes nowhere
        assert [e.job_id for e in follower.poll(timeout=10)] == ["B"]
    finally:
        writer.close()

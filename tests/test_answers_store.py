"""The answers store: content-addressed, append-only, retention, clear, and rebuild leaves it alone."""

from __future__ import annotations

import sqlite3
import time

import pytest

from batchgrader.store import answers
from batchgrader.store.eventstore import EventStore, NewEvent
from batchgrader.store.readmodels import projectors, rebuild

NOW = time.time()
DAY = 86400.0


def row(key: str, content: str = "yes", finish: str | None = "stop") -> dict:
    return {
        "key": key,
        "provider": "sandbox",
        "model": "gpt-5.4-mini",
        "content": content,
        "finish_reason": finish,
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "completion_tokens": 3,
        "reasoning_tokens": 0,
        "job_id": "j1",
        "custom_id": "c1",
        "batch_id": "b1",
    }


def test_answers_are_written_in_the_append_transaction(home):
    with EventStore(home.db, projectors=projectors()) as s:
        s.append("j1", [NewEvent("CancelRequested", {"reason": "x"})], also=lambda c: answers.put(c, [row("k1")], now=NOW))
        with pytest.raises(RuntimeError):

            def boom(c):  # noqa: ANN001
                answers.put(c, [row("k2")], now=NOW)
                raise RuntimeError("crash inside the transaction")

            s.append("j1", [NewEvent("CancelRequested", {"reason": "y"})], also=boom)
        found = answers.lookup(s.conn, ["k1", "k2"], now=NOW, keep_days=30)
        assert set(found) == {"k1"}  # k2 rolled back with its event
        assert [e.payload["reason"] for e in s.read()] == ["x"]


def test_first_answer_stays_and_rows_are_immutable(home):
    with EventStore(home.db) as s:
        with s.write() as c:
            answers.put(c, [row("k", "first")], now=NOW)
            answers.put(c, [row("k", "second")], now=NOW + 1)
        assert answers.lookup(s.conn, ["k"], now=NOW, keep_days=30)["k"].content == "first"
        with pytest.raises(sqlite3.DatabaseError, match="immutable"):
            s.conn.execute("UPDATE answers SET content = 'forged'")


def test_retention_truncation_and_clear(home):
    with EventStore(home.db) as s:
        with s.write() as c:
            answers.put(c, [row("old")], now=NOW - 40 * DAY)
            answers.put(c, [row("cut", finish="length"), row("new")], now=NOW - 1 * DAY)
        assert set(answers.lookup(s.conn, ["old", "cut", "new"], now=NOW, keep_days=30)) == {"new"}
        # reuse_truncated_answers has no effect: a truncated answer is a failed row, never reused
        assert set(answers.lookup(s.conn, ["old", "cut", "new"], now=NOW, keep_days=30, allow_truncated=True)) == {"new"}
        assert answers.lookup(s.conn, ["new"], now=NOW, keep_days=0) == {}
        assert answers.stats(s.conn)["answers"] == 3
        n_events = s.last_seq()
    assert answers.home_clear(home, older_than_days=30, now=NOW) == 1
    assert answers.home_stats(home)["answers"] == 2
    assert answers.home_clear(home) == 2
    assert answers.home_stats(home)["answers"] == 0
    with EventStore(home.db) as s:
        assert s.last_seq() == n_events


def test_a_write_drops_expired_answers_so_a_new_one_can_take_the_key(home):
    with EventStore(home.db) as s:
        with s.write() as c:
            answers.put(c, [row("k", "stale")], now=NOW - 40 * DAY)
        with s.write() as c:
            answers.put(c, [row("k", "fresh")], now=NOW, keep_days=30)
        assert answers.lookup(s.conn, ["k"], now=NOW, keep_days=30)["k"].content == "fresh"


def test_rebuild_of_the_read_models_leaves_the_answers(home):
    with EventStore(home.db, projectors=projectors()) as s:
        s.append("j1", [NewEvent("CancelRequested", {"reason": "x"})], also=lambda c: answers.put(c, [row("k1")], now=NOW))
    rebuild(home.db)
    assert answers.home_stats(home)["answers"] == 1

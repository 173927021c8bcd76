"""The answers store and the learned batch run times as the daemon asks its store for them
(``store.answers``, ``store.learned_run_times``): one suite over both backends, the SQLite file
and a PostgreSQL database on a real server (the ``backend`` fixture of tests/test_store_contract.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from batchgrader.core.log.events import NewEvent
from batchgrader.store.answers import StoredAnswer
from test_store_contract import Opener, backend, feed  # noqa: F401 - the parametrised fixture

NOW = time.time()
DAY = 86400.0


def row(key: str, content: str = "yes", finish: str | None = "stop", job: str = "j1", provider: str = "openai") -> dict:
    return {
        "key": key,
        "provider": provider,
        "model": "gpt-5.4-mini",
        "content": content,
        "finish_reason": finish,
        "prompt_tokens": 10,
        "cached_tokens": 1,
        "completion_tokens": 3,
        "reasoning_tokens": 2,
        "job_id": job,
        "custom_id": "c1",
        "batch_id": "b1",
    }


def ev(reason: str) -> NewEvent:
    return NewEvent("CancelRequested", {"reason": reason})


def test_answers_are_stored_with_their_event_and_rolled_back_with_it(backend: Opener):
    s = backend()
    s.answers.forget_simulated([])  # creates the table on the SQLite file, as the daemon does first
    s.append("j1", [ev("x")], also=lambda c: s.answers.put(c, [row("k1", "é 漢字 🙂")], now=NOW, keep_days=30))

    def boom(c: Any) -> None:
        s.answers.put(c, [row("k2")], now=NOW, keep_days=30)
        raise RuntimeError("crash inside the transaction")

    with pytest.raises(RuntimeError):
        s.append("j1", [ev("y")], expected_version=1, also=boom)
    other = backend()  # another daemon's connection sees what was committed
    found = other.answers.lookup(["k1", "k2", "k1"], now=NOW, keep_days=30)
    assert found == {
        "k1": StoredAnswer("k1", "é 漢字 🙂", "stop", 10, 1, 3, 2, "j1", "c1", found["k1"].ts),
    }
    assert found["k1"].ts.startswith(time.strftime("%Y-", time.gmtime(NOW)))


def test_the_first_answer_stays_expired_ones_make_room_and_truncated_ones_are_never_reused(backend: Opener):
    s = backend()
    s.answers.forget_simulated([])
    with s.write() as c:
        s.answers.put(c, [row("k", "first")], now=NOW)
        s.answers.put(c, [row("k", "second"), row("cut", finish="length")], now=NOW + 1)
        s.answers.put(c, [row("old", "stale")], now=NOW - 40 * DAY)
    assert {k: a.content for k, a in s.answers.lookup(["k", "cut", "old"], now=NOW, keep_days=30).items()} == {"k": "first"}
    assert s.answers.lookup(["k"], now=NOW, keep_days=0) == {}
    assert s.answers.lookup(["k"], now=NOW, keep_days=30, allow_truncated=True)["k"].content == "first"
    with s.write() as c:  # a write drops what is past the retention first: "old" can be answered again
        s.answers.put(c, [row("old", "fresh")], now=NOW, keep_days=30)
    assert s.answers.lookup(["old"], now=NOW, keep_days=30)["old"].content == "fresh"
    st = s.answers.stats()
    assert st["answers"] == 3 and st["content_bytes"] == len("first") + len("yes") + len("fresh")
    assert st["by_model"] == [{"provider": "openai", "model": "gpt-5.4-mini", "answers": 3}]
    assert st["oldest"] <= st["newest"]


def test_stored_answers_are_immutable(backend: Opener):
    s = backend()
    s.answers.forget_simulated([])
    with s.write() as c:
        s.answers.put(c, [row("k")], now=NOW)
    with pytest.raises(Exception, match="immutable"):
        with s.write() as c:
            c.execute("UPDATE answers SET content = 'forged'")
    assert s.answers.lookup(["k"], now=NOW, keep_days=30)["k"].content == "yes"


def test_clear_and_forget_simulated(backend: Opener):
    s = backend()
    s.answers.forget_simulated([])
    with s.write() as c:
        s.answers.put(c, [row("a", job="sb"), row("b", job="sb", provider="sandbox:openai"), row("c", job="real")], now=NOW)
        s.answers.put(c, [row("d", job="real")], now=NOW - 10 * DAY)
    assert s.answers.forget_simulated(["sb"]) == 1  # the sandbox job's answer under a real provider's key
    assert set(s.answers.lookup(["a", "b", "c", "d"], now=NOW, keep_days=30)) == {"b", "c", "d"}
    n_events = s.last_seq()
    assert s.answers.clear(now=NOW, older_than_days=5) == 1
    assert s.answers.clear(now=NOW) == 2
    assert s.answers.stats()["answers"] == 0 and s.last_seq() == n_events  # the log is never touched


def test_a_store_says_whether_it_holds_any_answer(backend: Opener):
    """What the intake reads to build a provider ahead: only while no row can be answered from the store."""
    s = backend()
    assert s.answers.empty()  # the SQLite file before its table exists too
    s.answers.forget_simulated([])
    assert s.answers.empty()
    s.append("j1", [ev("x")], also=lambda c: s.answers.put(c, [row("k1")], now=NOW))
    assert not s.answers.empty() and not backend().answers.empty()
    s.answers.clear(now=NOW)
    assert s.answers.empty()


def test_concurrent_daemons_storing_the_same_answer_keep_one(backend: Opener):
    stores = [backend() for _ in range(3)]
    stores[0].answers.forget_simulated([])
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def store_it(i: int) -> None:
        s = stores[i]
        barrier.wait(timeout=30)
        try:
            s.append(f"j{i}", [ev(str(i))], also=lambda c: s.answers.put(c, [row("same", f"from {i}")], now=NOW))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=store_it, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert stores[0].answers.stats()["answers"] == 1
    assert len(list(stores[1].read())) == 3


def test_learned_run_times_are_the_batch_runs_read_model_newest_first(backend: Opener):
    s = backend()
    feed(s)
    runs = s.read_model("batch_runs")
    assert runs, "the golden logs complete batches"
    models = {(r["model"], bool(r["sandbox"])) for r in runs}
    got = backend().learned_run_times([*models, ("no-such-model", False)])
    assert set(got) == models
    for m in models:
        mine = sorted((r for r in runs if (r["model"], bool(r["sandbox"])) == m), key=lambda r: r["ts"], reverse=True)
        assert len(got[m]) == min(20, len(mine))
        assert len(mine) <= 20, "more than LEARNED runs of one model: ties in ts would make the pick arbitrary"
        assert sorted(got[m]) == sorted(r["seconds"] for r in mine)
        assert got[m][0] in [r["seconds"] for r in mine if r["ts"] == mine[0]["ts"]]  # newest first
    assert s.learned_run_times([]) == {}

"""Reusing answers, tick by tick: the rules of issue 14 on a real Engine and EventStore with the
in-memory provider and a clock the test moves (no subprocess, no HTTP, no sleeps).  The
subprocess suite (test_reuse_flows.py) keeps what only a real process shows: the CLI, and a
kill between deciding and writing."""

from __future__ import annotations

import pytest

from batchgrader.core.log.state import JobState
from ticks import Rig

TEXTS = [f"essay number {i}" for i in range(12)]


@pytest.fixture
def rig(home):
    r = Rig(home)
    yield r
    r.close()


def sent(rig: Rig) -> int:
    """Requests sent to the provider, over every batch."""
    return sum(b.request_counts.total for b in rig.provider.batches.values())


def test_the_same_rows_again_cost_nothing(rig):
    first = rig.run_file("a.csv", TEXTS)
    assert first.ended == "completed" and sent(rig) == 12 and first.cost_usd > 0
    creates = rig.calls("create_batch")
    second = rig.run_file("b.csv", TEXTS)
    assert second.ended == "completed" and second.requests == 0 and second.cached_rows == 12
    assert rig.calls("create_batch") == creates and sent(rig) == 12  # no batch, no request
    assert second.cost_usd == 0 and second.saved_usd > 0
    assert [r["grade"] for r in rig.result_rows("b_results.csv")] == [r["grade"] for r in rig.result_rows("a_results.csv")]


def test_one_changed_row_is_the_only_request(rig):
    rig.run_file("a.csv", TEXTS)
    job = rig.run_file("b.csv", [*TEXTS[:5], "a corrected essay", *TEXTS[6:]])
    assert (job.requests, job.cached_rows, job.succeeded_rows, sent(rig)) == (1, 11, 12, 13)
    got = rig.result_rows("b_results.csv")
    assert [r["response"] for r in got] == [*TEXTS[:5], "a corrected essay", *TEXTS[6:]]
    assert all(r["grade"] and r["error"] == "" for r in got)


@pytest.mark.parametrize("change", ["system_prompt: Grade strictly.\n", "model: gpt-4.1-nano\n"])
def test_a_new_prompt_or_model_sends_every_row(rig, change):
    rig.run_file("a.csv", TEXTS)
    rig.reconfigure(change)
    job = rig.run_file("b.csv", TEXTS)
    assert job.cached_rows == 0 and job.requests == 12 and sent(rig) == 24


def test_sampling_turns_reuse_off_unless_the_profile_turns_it_on(rig):
    rig.run_file("a.csv", TEXTS[:4])
    rig.reconfigure("temperature: 0.8\n")
    assert rig.run_file("b.csv", TEXTS[:4]).cached_rows == 0 and sent(rig) == 8
    rig.reconfigure("temperature: 0.8\nreuse_answers: true\n")
    assert rig.run_file("c.csv", TEXTS[:4]).cached_rows == 4 and sent(rig) == 8
    rig.reconfigure("cache_days: 0\n")  # nothing stored is recent enough
    assert rig.run_file("d.csv", TEXTS[:4]).cached_rows == 0 and sent(rig) == 12


def test_identical_rows_in_one_file_are_sent_once(rig):
    rig.reconfigure("split_row_limit: 4\n")
    texts = [f"answer {i % 10}" if i % 3 else "I don't know" for i in range(50)]
    distinct = len(set(texts))
    job = rig.run_file("dups.csv", texts)
    assert sent(rig) == distinct and job.ended == "completed"
    assert job.succeeded_rows == 50 and job.duplicates_answered == 50 - distinct
    by_text: dict[str, set[tuple[str, str, str]]] = {}
    for r in rig.result_rows("dups_results.csv"):
        by_text.setdefault(r["response"], set()).add(r["grade"])
    assert all(len(v) == 1 for v in by_text.values())  # every copy carries its leader's answer


def _restart_after(rig: Rig, last: str) -> tuple[Rig, JobState]:
    """The state a kill -9 leaves right after the job's ``last`` event committed: a new log with
    the events up to it (and an empty answer store: nothing stored after it), the input back in
    work/, and a new engine on it."""
    from pathlib import Path

    from batchgrader.store.eventstore import EventStore, NewEvent

    job = rig.job()
    kept = []
    for e in rig.store.read():
        kept.append(e)
        if e.type == last:
            break
    rig.close()
    Path(job.archived_path or "").rename(job.input_path)
    for f in rig.home.outbox.glob("*.html"):
        f.unlink()
    rig.home.db.unlink()
    with EventStore(rig.home.db) as store:
        for e in kept:
            store.append(e.job_id, [NewEvent(e.type, e.payload)])
    again = Rig(rig.home)
    return again, again.job()


def test_answers_are_stored_after_the_result_and_again_after_a_kill_in_between(home):
    """The answers of a merged chunk are stored after the job's result file is written
    (``AnswersToStore`` with the merge, ``AnswersStored`` after ``ResultWritten``).  Killed in
    between, the restarted engine stores them, and the same rows again cost nothing."""
    rig = Rig(home)
    first = rig.run_file("a.csv", TEXTS)
    types = [e.type for e in rig.store.read(job_id=first.job_id)]
    assert types.index("AnswersToStore") < types.index("ResultWritten") < types.index("AnswersStored")
    rig, job = _restart_after(rig, "ResultWritten")
    assert not job.ended and [c.answers_due for c in job.chunks.values()] == [12]
    rig.tick()
    job = rig.job()
    assert job.ended == "completed" and [e["error"] for e in rig.events("AnswersStored")] == [None]
    creates = rig.calls("create_batch")
    second = rig.run_file("b.csv", TEXTS)
    assert second.cached_rows == 12 and rig.calls("create_batch") == creates
    rig.close()


def test_no_answers_are_stored_while_a_batch_is_in_flight(rig):
    """Storing a chunk's answers takes seconds per 50,000 rows with no poll meanwhile, so a
    merged chunk's answers wait while another batch runs (its end would be seen late): they are
    stored once no batch is in flight, here after the job's result."""
    rig.reconfigure("split_row_limit: 6\n")
    (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(TEXTS)))
    for _ in range(6):
        rig.tick()
    first, second = sorted(rig.provider.open_batches(), key=lambda b: b.created_at or 0)
    rig.provider.finish(first.id)
    for _ in range(6):
        rig.tick()
    job = rig.job()
    assert [c.answers_due for c in job.chunks.values()] == [6, None] and job.chunks[1].in_flight
    assert rig.events("AnswersStored") == []
    rig.provider.finish(second.id)
    for _ in range(6):
        rig.tick()
    types = [e.type for e in rig.store.read(job_id=job.job_id)]
    assert rig.job().ended == "completed" and types.count("AnswersStored") == 2
    assert types.index("ResultWritten") < types.index("AnswersStored")
    assert rig.run_file("b.csv", TEXTS).cached_rows == 12


def test_answers_that_cannot_be_read_are_not_stored_and_the_job_still_ends(home):
    from pathlib import Path

    rig = Rig(home)
    rig.run_file("a.csv", TEXTS)
    rig, job = _restart_after(rig, "ResultWritten")
    Path(job.chunks[0].results_path or "").unlink()  # gone before its answers were stored
    rig.tick()
    (stored,) = rig.events("AnswersStored")
    assert "could not be read" in stored["error"] and rig.job().ended == "completed"
    second = rig.run_file("b.csv", TEXTS)
    assert second.cached_rows == 0 and second.requests == 12  # nothing was stored: sent again
    rig.close()


def test_row_token_columns_sum_to_the_bill_and_say_how_each_row_was_answered(rig):
    """Issue 27, item 7: a duplicate or reused row carries no billed tokens (its answer was paid
    for once, by its leader or an earlier job), and ``answered_by`` says how it was answered."""
    texts = [f"answer {i % 4}" for i in range(10)]  # 4 distinct, 6 duplicates
    first = rig.run_file("a.csv", texts)
    rows = rig.result_rows("a_results.csv")
    assert [r["answered_by"] for r in rows] == ["batch"] * 4 + ["duplicate"] * 6
    assert all(r["input_tokens"] == "0" and r["output_tokens"] == "0" for r in rows[4:])
    assert sum(int(r["input_tokens"]) for r in rows) == first.prompt_tokens > 0
    assert sum(int(r["output_tokens"]) for r in rows) == first.completion_tokens > 0
    second = rig.run_file("b.csv", texts)  # every row answered from the stored answers: billed 0
    rows = rig.result_rows("b_results.csv")
    assert second.cost_usd == 0 and second.prompt_tokens == 0
    assert {r["answered_by"] for r in rows[:4]} == {"reused"} and all(r["grade"] for r in rows)
    assert sum(int(r["input_tokens"]) + int(r["output_tokens"]) for r in rows) == 0

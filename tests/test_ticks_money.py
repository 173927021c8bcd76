"""Tick-level (in-memory provider, fake clocks): refusals that teach nothing are bounded
(``queue_full``), a batch named ended by its create reply is read back before it is collected,
and every wait runs on the monotonic clock whatever the wall clock does (issue 23)."""

from __future__ import annotations

import dataclasses

from batchgrader.core.rules import queue
from batchgrader.core.rules.settle import ANSWERED_SETTLE, LOST_REPLY_SLACK, CreateSent, absent_after, duplicate_watch_ends
from ticks import Rig, refusal


def test_a_refusal_that_teaches_nothing_is_bounded_then_its_rows_fail_as_queue_full(home):
    """A chunk that fits the limit the refusal states is refused every time (a queue shared with
    other tools): it is sent again after longer and longer waits, the wait is said in the job's
    last error (``status``), and after QUEUE_FULL_ROUNDS refusals its rows fail as queue_full
    (not re-sent by themselves) and the job ends; `bgctl retry` sends them again."""
    rig = Rig(home)
    rig.drop(2)
    rig.tick()
    limit = rig.job().chunks[0].input_tokens + 1_000  # the chunk fits the stated limit
    for _ in range(3 * queue.QUEUE_FULL_ROUNDS):
        for b in rig.provider.open_batches():
            rig.provider.finish(b.id, "failed", errors=refusal(limit))
        rig.tick(queue.MAX_REFUSAL_WAIT)
        if rig.job().ended:
            break
        if len(rig.events("ChunkFailed")) >= 2:  # the first refusal taught the limit; later ones nothing
            assert "waiting for room in the provider's queue" in (rig.job().last_error or "")
    job = rig.job()
    assert job.ended == "failed", "refused batches were sent again without end"
    assert rig.calls("create_batch") == queue.QUEUE_FULL_ROUNDS
    assert rig.events("ChunkFailed")[-1]["code"] == "queue_full"
    assert {info["code"] for info in job.failed_rows.values()} == {"queue_full"}
    assert not rig.events("RetryPlanned")
    rig.control("RetryRequested")
    rig.tick()
    assert rig.events("RetryPlanned")  # sent again on request


def test_refusal_waits_double_each_round_up_to_a_cap():
    assert [queue.refusal_wait(4.0, r) for r in (1, 2, 3)] == [4.0, 8.0, 16.0]
    assert queue.refusal_wait(4.0, 20) == queue.MAX_REFUSAL_WAIT
    assert not queue.queue_full(queue.QUEUE_FULL_ROUNDS - 1) and queue.queue_full(queue.QUEUE_FULL_ROUNDS)


def test_a_create_reply_that_names_the_batch_ended_is_read_back_for_its_files(home):
    """The create reply already says ``completed`` (no result file named): the batch is
    retrieved before it is collected, and its rows are answered, never sent again."""
    rig = Rig(home)
    rig.drop(3)
    plain_create = rig.provider.create_batch

    def create_and_run(*args, **kwargs):
        b = plain_create(*args, **kwargs)
        (ended,) = [x for x in rig.provider.finish_all() if x.id == b.id]
        return dataclasses.replace(ended, output_file_id=None, error_file_id=None)

    rig.provider.create_batch = create_and_run  # a provider that runs a batch before its create reply
    types = rig.tick()
    assert rig.events("BatchCreated")[0]["status"] == "completed"
    assert "BatchStatusChanged" in types and rig.events("BatchStatusChanged")[0]["output_file_id"]
    for _ in range(3):
        if rig.job().ended:
            break
        rig.tick()
    job = rig.job()
    assert job.ended == "completed" and not job.failed_rows
    assert rig.calls("create_batch") == 1 and rig.calls("upload") == 1


def test_a_completed_batch_without_result_files_fails_its_rows_as_output_unavailable(home):
    """Read back and still no output or error file: its answers (paid) cannot be had.  The rows
    fail as output_unavailable and are not sent again by themselves (that would pay twice)."""
    rig = Rig(home, "max_row_retries: 3\n")
    rig.drop(2)
    rig.tick()
    (b,) = rig.provider.open_batches()
    (ended,) = rig.provider.finish_all()
    rig.provider.batches[b.id] = dataclasses.replace(ended, output_file_id=None, error_file_id=None)
    for _ in range(4):
        rig.tick()
    job = rig.job()
    assert job.ended == "failed" and {i["code"] for i in job.failed_rows.values()} == {"output_unavailable"}
    assert rig.calls("create_batch") == 1 and not rig.events("RetryPlanned")


def test_a_wall_clock_stepped_back_an_hour_moves_no_poll(home):
    """The wall clock steps back an hour right after the create: the batch, ended 3 s later, is
    still collected within 30 s (the polls, and the list round of two batches, run on the
    monotonic clock)."""
    rig = Rig(home, "split_row_limit: 1\n")
    rig.drop(2)
    wall, mono = rig.now, 5_000.0
    rig.engine.tick(wall, mono)
    assert rig.events("BatchCreated")
    wall -= 3600.0
    for step in range(30):
        wall, mono = wall + 1.0, mono + 1.0
        rig.provider.now = wall
        if step == 3:
            rig.provider.finish_all()
        rig.engine.tick(wall, mono)
        if rig.job().ended:
            break
    assert rig.job().ended == "completed", "the poll waited for the wall clock to come back"
    assert step < 30


def test_a_wall_clock_stepped_forward_purges_no_stored_answer(home):
    """Answers stored, then the wall clock jumps 400 days ahead (cache_days 30): a file asking the
    same is still answered from the store, nothing is sent, and no answer was dropped."""
    rig = Rig(home)
    rig.drop(2)
    wall, mono = rig.now, 5_000.0
    for _ in range(6):
        wall, mono = wall + 1.0, mono + 1.0
        rig.provider.now = wall
        rig.provider.finish_all()
        rig.engine.tick(wall, mono)
    assert rig.events("AnswersStored") and rig.calls("create_batch") == 1
    wall += 400 * 86400.0
    (home.inbox / "b.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(2)))
    for _ in range(6):
        wall, mono = wall + 1.0, mono + 1.0
        rig.provider.now = wall
        rig.engine.tick(wall, mono)
    assert rig.calls("create_batch") == 1, "the stored answers were taken for expired"
    assert rig.store.conn.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 2


def test_a_create_is_believed_absent_from_its_give_up_and_an_answered_error_at_once():
    lost = CreateSent(sent=100.0, gave_up=101.0)
    assert absent_after(lost, 1.0) == 101.0 + LOST_REPLY_SLACK
    slow_send = CreateSent(sent=100.0, gave_up=104.0)  # connecting and sending took 3 s more
    assert absent_after(slow_send, 1.0) == 104.0 + LOST_REPLY_SLACK
    answered = CreateSent(sent=100.0, gave_up=100.2, answered=True)
    assert absent_after(answered, 120.0) == 100.2 + ANSWERED_SETTLE
    after_restart = CreateSent(sent=100.0)  # only when it left is known
    assert absent_after(after_restart, 120.0) == 100.0 + 120.0 + LOST_REPLY_SLACK
    assert duplicate_watch_ends(200.0, 1.0) == 200.0 + 1.0 + LOST_REPLY_SLACK


def test_a_create_refused_at_once_for_the_queue_limit_is_bounded_too(home):
    """A provider that refuses the create itself (no batch) for the enqueued-token limit, each
    time with the same stated limit the chunk fits: waits that double, then queue_full."""
    rig = Rig(home)
    rig.drop(2)
    rig.provider.fail_next("create_batch", "refused", status_code=400, message=refusal(10_000)[0][1], code="token_limit_exceeded")
    rig.tick()
    for _ in range(3 * queue.QUEUE_FULL_ROUNDS):
        if rig.job().ended:
            break
        rig.provider.fail_next(
            "create_batch", "refused", status_code=400, message=refusal(10_000)[0][1], code="token_limit_exceeded"
        )
        rig.tick(queue.MAX_REFUSAL_WAIT)
    job = rig.job()
    assert job.ended == "failed" and {i["code"] for i in job.failed_rows.values()} == {"queue_full"}
    assert rig.calls("create_batch") == queue.QUEUE_FULL_ROUNDS + 1  # the first refusal taught the limit
    assert rig.calls("upload") == 1

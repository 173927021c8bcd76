"""Every engine rule, tick by tick: a real Engine and EventStore, the in-memory provider, a clock
the test moves.  Fast (no subprocess, no HTTP, no sleeps); the subprocess suites keep what only
a real process shows."""

from __future__ import annotations

import json

import pytest

from batchgrader.core.rules.decide import resubmit_delay
from batchgrader.provider.pool import Providers
from ticks import Rig, refusal


@pytest.fixture
def rig(home):
    r = Rig(home)
    yield r
    r.close()


def make(home, config: str) -> Rig:
    return Rig(home, config)


def test_happy_path_event_order_and_result(rig):
    job = rig.drop(3)
    assert rig.tick() == ["UploadStarted", "FileUploaded", "BatchCreateRequested", "BatchCreated"]
    assert rig.tick() == ["BatchStatusChanged"]  # the request counts are recorded
    assert rig.tick() == []  # still validating: polled, nothing changed
    rig.provider.finish_all()
    assert rig.tick() == [
        "BatchStatusChanged",
        "OutputDownloadStarted",
        "OutputDownloaded",
        "TokensUsed",
        "ChunkCompleted",
        "AnswersToStore",
        "OutboxWriteStarted",
        "ResultWritten",
        "AnswersStored",  # kept for reuse after the result is written: storing never delays it
        "InputArchived",
        "ProviderFileDeleteRequested",  # each delete's intent before it leaves: the input file ...
        "ProviderFileDeleteRequested",  # ... and the output file
        "ProviderFilesDeleted",
        "JobCompleted",
    ]
    rows = rig.result_rows()
    assert [r["id"] for r in rows] == ["0", "1", "2"]
    assert all(r["error"] == "" and "SIMULATED" in r["grade"] for r in rows)
    assert rig.engine.ctx.state.jobs[job.job_id].ended == "completed"
    assert not rig.provider.files  # uploaded input and the output deleted at the provider
    assert rig.engine.idle


def _poll_times(rig, seconds: float, step: float = 0.5) -> list[float]:
    """Tick every ``step`` s for ``seconds``; the clock times at which a retrieve was made."""
    times = []
    for _ in range(int(seconds / step)):
        before = rig.calls("retrieve")
        rig.tick(step)
        if rig.calls("retrieve") > before:
            times.append(rig.now)
    return times


def test_polling_waits_a_growing_fraction_of_the_batch_age(home):
    rig = make(home, "poll_interval_seconds: 30\n")
    rig.drop(2)
    rig.tick()  # uploaded and created
    created = rig.now
    times = _poll_times(rig, 300)
    assert times[0] - created <= 1.0  # the first poll comes at once
    for a, b in zip(times, times[1:]):
        # never later than 15 % of the age (and the tick), never more often than every 0.5 s
        assert 0.5 <= b - a <= max(0.5, 0.15 * (a - created)) + 0.5
    assert max(b - a for a, b in zip(times, times[1:])) == 30  # poll_interval_seconds caps the wait
    # a fixed 0.5 s backoff would be 600 polls, a fixed 30 s one 10 (and 30 s late at the start)
    assert len(times) < 45
    rig.provider.start(rig.provider.open_batches()[0].id)  # a change of status does not start over
    later = _poll_times(rig, 60)
    assert len(later) == 2
    rig.close()


def test_a_batch_like_the_last_one_is_collected_just_after_its_expected_end(home):
    rig = make(home, "poll_interval_seconds: 60\n")
    rig.provider.lifetime = lambda b: 200.0
    ends = []
    for name in ("a.csv", "b.csv"):
        (rig.home.inbox / name).write_text("id,response\n0,text of " + name + "\n")
        for _ in range(1000):
            rig.provider.advance(rig.now + 0.5)
            types = rig.tick(0.5)
            if rig.provider.ends:
                end = next(iter(rig.provider.ends.values()))
            if "ChunkCompleted" in types:
                ends.append(rig.now - end)
                break
        while rig.engine.busy():
            rig.tick(0.5)
    first, second = ends
    assert first <= 0.15 * 200 + 0.5  # at most 15 % of its age late
    assert second <= 1.0  # polled just after the time the first one took
    rig.close()


def _progressing_batch(home, finalizing: float) -> tuple[float | None, Rig]:
    """A lone batch of 500 requests done at an even pace over 100 s, then ``finalizing`` s of
    finalizing, then completed: how long after its create the daemon collected it, and the rig."""
    import dataclasses

    from batchgrader.provider.protocol import RequestCounts

    rig = make(home, "poll_interval_seconds: 60\n")
    rig.drop(500)
    rig.tick()  # uploaded and created
    created = rig.now
    (batch_id,) = [b.id for b in rig.provider.open_batches()]
    rig.provider.start(batch_id)
    for _ in range(400):
        age = rig.now + 0.5 - created
        b = rig.provider.batches[batch_id]
        if age >= 100 + finalizing:
            rig.provider.finish(batch_id)
        elif age >= 100:
            rig.provider.batches[batch_id] = dataclasses.replace(
                b, status="finalizing", request_counts=RequestCounts(500, 500, 0)
            )
        else:
            rig.provider.batches[batch_id] = dataclasses.replace(b, request_counts=RequestCounts(500, int(5 * age), 0))
        if "ChunkCompleted" in rig.tick(0.5):
            return rig.now - created, rig
    return None, rig


def test_a_batch_is_collected_just_after_the_end_its_progress_points_to(home):
    seen, rig = _progressing_batch(home, finalizing=0)
    assert seen is not None and seen - 100 <= 1.0  # the age rule alone would wait up to 15 s
    assert rig.calls("retrieve") < 40
    rig.close()


def test_a_finalizing_batch_is_polled_soon_and_seen_done_just_after_its_end(home):
    """The first batch of a model (no run time known): its progress points to the end of its
    requests; once they are all done (finalizing) the end is due, so it is polled every ~0.5 s
    at first instead of at 15 % of its age (which would see it up to ~15 s late here)."""
    seen, rig = _progressing_batch(home, finalizing=8)
    assert seen is not None and seen - 108 <= 2.0  # ~1.5 s: polls 0.5 s apart, then growing by half
    assert rig.calls("retrieve") < 45
    rig.close()


def test_status_calls_stay_under_30_per_batch_hour_with_many_batches_in_flight(home):
    """Fourteen batches (two files) running 12 minutes to 9 hours, on a fake clock that jumps over
    the stretches where nothing is due: status calls (retrieve and list pages) per batch-hour."""
    rig = make(home, "poll_interval_seconds: 60\nsplit_row_limit: 1\n")
    runs = iter([720, 1800, 3600, 5400, 7200, 14400, 32400, 900, 2700, 4000, 10800, 20000, 1500, 6000])
    rig.provider.lifetime = lambda b: float(next(runs))
    (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},first file row {i}\n" for i in range(7)))
    second_at = rig.now + 1800
    ends: dict[str, float] = {}
    seen: dict[str, float] = {}
    for _ in range(20_000):
        if second_at and rig.now >= second_at:
            (rig.home.inbox / "b.csv").write_text("id,response\n" + "".join(f"{i},second file row {i}\n" for i in range(7)))
            second_at = 0.0
        rig.provider.advance(rig.now)
        types = rig.tick(0.0)
        ends.update({k: v for k, v in rig.provider.ends.items() if k not in ends})
        for bid, (job_id, index) in rig.engine.ctx.state.batch_index.items():
            if bid not in seen and rig.engine.ctx.state.jobs[job_id].chunks[index].status == "completed":
                seen[bid] = rig.now
        jobs = [j for j in rig.engine.ctx.state.jobs.values() if not j.rejected]
        if not second_at and len(jobs) == 2 and all(j.terminal for j in jobs):
            break
        flying = {(j.job_id, c.index) for j in jobs for c in j.chunks.values() if c.in_flight}
        dues = [due for key, (due, _d) in rig.engine.ctx.timers().next_poll.items() if key in flying]
        dues += [t for t in (rig.provider.next_end(), second_at) if t]
        step = (
            0.5
            if types or rig.engine.inbox_pending()
            else max(0.5, min((d for d in dues if d > rig.now), default=rig.now + 0.5) - rig.now)
        )
        rig.now += step
    else:
        raise AssertionError("the jobs did not finish")
    assert len(ends) == len(seen) == 14
    batch_hours = sum(ends[b] - rig.provider.batches[b].created_at for b in ends) / 3600
    calls = rig.calls("retrieve") + rig.calls("list_batches")
    assert calls / batch_hours <= 30, (calls, batch_hours)
    for bid, end in ends.items():  # and each batch was collected soon after it ended
        run = end - rig.provider.batches[bid].created_at
        assert seen[bid] - end <= min(60.0, 0.15 * run) + 1.0, (run, seen[bid] - end)
    rig.close()


def test_budget_cap_holds_before_anything_is_sent_and_retry_releases(home):
    rig = make(home, "max_cost_per_job_usd: 0.0000001\n")
    rig.drop(3)
    assert rig.tick() == ["JobHeld"]
    assert rig.job().held["code"] == "max_cost_per_job_usd"
    assert rig.tick(3600) == [] and rig.provider.calls == []  # stays held, nothing sent
    assert not rig.engine.busy()
    rig.control("RetryRequested")  # `bgctl retry` on a held job: submit anyway
    assert rig.tick()[:1] == ["UploadStarted"]
    assert rig.calls("create_batch") == 1
    rig.close()


def test_daily_token_limit_holds_and_a_raised_limit_releases(home):
    rig = make(home, "daily_token_limit: 10\n")
    rig.drop(3)
    assert rig.tick() == ["JobHeld"] and "daily_token_limit" in rig.job().held["reason"]
    assert rig.tick() == []
    rig.reconfigure("daily_token_limit: 100000\n")
    types = rig.tick()
    assert types[0] == "JobReleased" and "UploadStarted" in types
    assert rig.events("JobReleased")[0]["override"] is False
    rig.close()


def test_capacity_limits_batches_in_flight_across_chunks(home):
    rig = make(home, "split_row_limit: 2\nmax_simultaneous_batches: 2\n")
    job = rig.drop(6)
    assert len(job.chunks) == 3
    rig.tick()
    assert rig.calls("create_batch") == 2  # the third chunk waits for room
    rig.tick()
    assert rig.calls("upload") == 2
    first = next(iter(rig.provider.open_batches()))
    rig.provider.finish(first.id)
    types = rig.tick()
    # the finished batch is collected and, in the same tick, the freed slot is used
    assert types.index("ChunkCompleted") < types.index("UploadStarted")
    assert rig.calls("create_batch") == 3
    rig.close()


def test_enqueued_token_limit_sends_one_chunk_at_a_time(home):
    rig = make(home, "split_row_limit: 2\nmax_simultaneous_batches: 5\n")
    job = rig.drop(4)
    per_chunk = max(c.input_tokens for c in job.chunks.values())
    rig.reconfigure(f"split_row_limit: 2\nmax_simultaneous_batches: 5\nenqueued_token_limit: {{gpt-5.4-mini: {per_chunk + 1}}}\n")
    rig.tick()
    assert rig.calls("create_batch") == 1
    rig.provider.finish_all()
    rig.tick()
    assert rig.calls("create_batch") == 2
    rig.close()


def test_halt_on_chunk_failure_stops_the_rest(home):
    rig = make(home, "split_row_limit: 2\nmax_simultaneous_batches: 1\nhalt_on_chunk_failure: true\n")
    rig.drop(6)
    rig.provider.fail_next("create_batch", "refused", message="model not allowed for this project")
    types = rig.tick()
    assert types.count("ChunkFailed") == 3
    halted = [e for e in rig.events("ChunkFailed") if e["code"] == "halted"]
    assert len(halted) == 2 and "model not allowed" in halted[0]["error"]
    assert types[-1] == "JobFailed"
    assert rig.job().error["code"] == "halted"
    assert [r["error"].split(":")[0] for r in rig.result_rows()] == ["create_rejected"] * 2 + ["halted"] * 4
    assert rig.calls("upload") == 1
    rig.close()


def test_failed_rows_are_retried_up_to_the_limit(home):
    rig = make(home, "max_row_retries: 1\n")
    rig.drop(4)
    rig.tick()
    ids = rig.provider.requests_in(next(iter(rig.provider.files)))
    rig.provider.row_errors = {ids[1]["custom_id"]: ("server_error", "try again")}
    rig.provider.finish_all()
    types = rig.tick()
    assert "RowsFailed" in types and types[-1] == "RetryPlanned"
    retry = rig.events("RetryPlanned")[0]
    assert retry["custom_ids"] == [ids[1]["custom_id"]] and retry["manual"] is False
    assert rig.tick()[:1] == ["UploadStarted"]  # the retry chunk is sent in the next tick
    rig.provider.finish_all()  # fails again: the limit (1) is used up
    types = rig.tick()
    assert "RetryPlanned" not in types and types[-1] == "JobCompleted"
    assert rig.job().ended == "completed_with_errors"
    errors = [r["error"] for r in rig.result_rows()]
    assert errors.count("") == 3 and "server_error: try again" in errors
    rig.close()


def test_cancel_cancels_in_flight_batches_and_fails_unsent_chunks(home):
    rig = make(home, "split_row_limit: 2\nmax_simultaneous_batches: 1\n")
    rig.drop(6)
    rig.tick()
    (batch,) = rig.provider.open_batches()
    rig.control("CancelRequested")
    types = rig.tick()
    assert rig.calls("cancel") == 1 and rig.provider.batches[batch.id].status == "cancelling"
    assert [e["code"] for e in rig.events("ChunkFailed")] == ["cancelled", "cancelled"]
    assert "BatchStatusChanged" in types  # polled at once after the cancel
    assert rig.tick() == [] and rig.calls("cancel") == 1  # sent once
    rig.provider.finish(batch.id, "cancelled", answered=1)
    types = rig.tick()
    assert types[-1] == "JobCancelled" and "RetryPlanned" not in types
    errors = [r["error"] for r in rig.result_rows()]
    assert errors[0] == "" and all("cancel" in e for e in errors[1:])
    assert rig.calls("create_batch") == 1
    rig.close()


def test_expired_batch_keeps_partial_results_and_retries_the_rest(rig):
    rig.drop(6)
    rig.tick()
    (batch,) = rig.provider.open_batches()
    rig.provider.finish(batch.id, "expired", answered=2)
    types = rig.tick()
    assert types[-1] == "RetryPlanned"
    assert {r["code"] for r in rig.events("RowsFailed")[0]["rows"]} == {"batch_expired"}
    assert len(rig.events("RetryPlanned")[0]["custom_ids"]) == 4
    rig.tick()
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted"
    assert all(r["error"] == "" for r in rig.result_rows())


def test_token_limit_exceeded_without_a_figure_halves_the_limit_and_replans(rig):
    rig.drop(2)
    rig.tick()
    (batch,) = rig.provider.open_batches()
    tokens = rig.job().chunks[0].input_tokens
    rig.provider.finish(batch.id, "failed", errors=[("token_limit_exceeded", "Enqueued token limit reached")])
    types = rig.tick()
    failed = rig.events("ChunkFailed")
    assert failed[0]["code"] == "token_limit_exceeded" and failed[0]["retryable"] is True
    (learned,) = rig.events("QueueLimitLearned")
    assert (learned["limit"], learned["exact"], learned["source"]) == (tokens // 2, False, "halved")
    (replanned,) = rig.events("ChunkReplanned")
    assert [len(c["custom_ids"]) for c in replanned["chunks"]] == [1, 1]  # each row fits the estimate alone
    assert "RowsFailed" not in types and not rig.job().row_attempts  # the refusal used no retry
    assert batch.input_file_id not in rig.provider.files  # the refused batch's file is not leaked
    assert rig.calls("create_batch") == 2  # one of the two new chunks: the other waits for room
    rig.provider.finish_all()
    rig.tick()
    rig.provider.finish_all()
    types = rig.tick()
    assert types[-1] == "JobCompleted" and all(r["error"] == "" for r in rig.result_rows())


def test_token_limit_exceeded_with_a_figure_waits_for_room(rig):
    rig.reconfigure("split_row_limit: 2\n")
    rig.drop(4)
    rig.tick()
    first, second = rig.provider.open_batches()
    limit = rig.job().chunks[0].input_tokens + 5  # room for one chunk, not two
    rig.provider.finish(second.id, "failed", errors=refusal(limit))
    rig.tick()
    (learned,) = rig.events("QueueLimitLearned")
    assert (learned["limit"], learned["exact"]) == (limit, True)
    assert not rig.events("ChunkReplanned") and rig.calls("create_batch") == 2  # it fits, but not now
    rig.provider.finish(first.id)
    rig.tick()
    assert rig.calls("create_batch") == 3  # room again: sent at once, no fixed delay
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted"


def _two_chunks_in_flight_over_a_limit(rig) -> int:
    """Four rows in two chunks of two, both sent; a queue limit one row fits under and two do not."""
    rig.reconfigure("split_row_limit: 2\n")
    job = rig.drop(4)
    rig.tick()
    return max(c.input_tokens for c in job.chunks.values()) - 1


def test_a_second_refusal_that_teaches_nothing_new_is_replanned_at_once(rig):
    """Two chunks over the limit are in flight; the first refusal teaches the limit, the second
    (the same message) teaches nothing new.  The second chunk is still too large for the queue:
    it is re-planned and its rows sent at once, not after the wait before sending a refused
    chunk again (that wait, two poll intervals, is for a chunk that fits)."""
    limit = _two_chunks_in_flight_over_a_limit(rig)
    first, second = rig.provider.open_batches()
    rig.provider.finish(first.id, "failed", errors=refusal(limit))
    rig.tick()
    assert [r["chunk"] for r in rig.events("ChunkReplanned")] == [0]
    rig.provider.finish(second.id, "failed", errors=refusal(limit))
    rig.tick()  # 1 s later: well inside the resend wait
    assert 1.0 < resubmit_delay(2.0)
    assert len(rig.events("QueueLimitLearned")) == 1  # nothing new was learned from the second
    assert [r["chunk"] for r in rig.events("ChunkReplanned")] == [0, 1]
    for _ in range(4):  # one row in flight at a time
        rig.provider.finish_all()
        rig.tick()
    assert rig.events("JobCompleted") and all(r["error"] == "" for r in rig.result_rows())


def test_a_chunk_that_fits_is_sent_before_the_next_refused_chunk_is_replanned(rig):
    """Two chunks refused in one poll: the first is re-planned, one of its new chunks is sent at
    once, and only then is the second re-planned (a re-plan reads and writes the chunk's rows:
    the queue's room does not wait for it)."""
    limit = _two_chunks_in_flight_over_a_limit(rig)
    rig.provider.finish_all("failed", errors=refusal(limit))
    types = rig.tick()
    first_replan = types.index("ChunkReplanned")
    second_replan = types.index("ChunkReplanned", first_replan + 1)
    assert first_replan < types.index("BatchCreateRequested", first_replan) < second_replan


def test_a_batch_still_validating_that_alone_exceeds_a_stated_limit_holds_no_room(rig):
    """The first refusal states the limit; the other batch in flight is still validating and is
    larger than that limit on its own, so the provider will refuse it whatever else is queued.
    The first chunk's re-planned rows are sent at once instead of waiting for that refusal (a
    provider may validate batches one after the other); every row is still answered once."""
    limit = _two_chunks_in_flight_over_a_limit(rig)
    first, second = rig.provider.open_batches()
    rig.provider.finish(first.id, "failed", errors=refusal(limit))
    assert rig.provider.batches[second.id].status == "validating"
    rig.tick()
    assert rig.calls("create_batch") == 3  # a re-planned row is sent beside the doomed batch
    assert rig.job().chunks[1].in_flight  # which is still waited for, not given up
    rig.provider.finish(second.id, "failed", errors=refusal(limit))
    for _ in range(6):
        rig.provider.finish_all()
        rig.tick()
    assert rig.events("JobCompleted") and all(r["error"] == "" for r in rig.result_rows())
    answered = [b for b in rig.provider.batches.values() if b.status == "completed"]
    assert sorted(b.request_counts.total for b in answered) == [1, 1, 1, 1]  # each row answered once


def test_the_largest_waiting_chunk_that_fits_is_sent_first(home):
    """First-fit decreasing: chunks of (about) 3, 3, 7 and 7 units under a limit of 10 go in two
    rounds (7+3, 7+3).  In chunk order they would take three (3+3, then 7, then 7)."""
    rig = make(home, "split_row_limit: 1\n")
    small, big = "good " * 30, "good " * 120
    (rig.home.inbox / "a.csv").write_text(
        "id,response\n" + "".join(f"{i},{t}{i}\n" for i, t in enumerate([small, small, big, big]))
    )
    rig.tick()
    rig.tick()
    job = rig.job()
    sizes = [job.chunks[i].input_tokens for i in range(4)]
    limit = sizes[2] + sizes[0] + 2  # a big and a small chunk fit together, two bigs do not
    assert sizes[0] + sizes[1] + sizes[2] > limit
    rig.reconfigure(f"split_row_limit: 1\nenqueued_token_limit: {{gpt-5.4-mini: {limit}}}\n")
    rounds: list[set[int]] = []
    while not rig.events("JobCompleted") and len(rounds) < 5:
        rig.tick()
        sent = {int(b.metadata["bg_chunk"]) for b in rig.provider.open_batches()}
        if sent:
            rounds.append(sent)
        rig.provider.finish_all()
    assert rounds == [{2, 0}, {3, 1}]  # the largest first, then the largest that still fits
    assert rig.events("JobCompleted")


def test_create_refused_for_a_rate_limit_waits_then_creates_with_the_same_file(rig):
    rig.drop(2)
    rig.provider.fail_next("create_batch", "refused", status_code=429, message="Rate limit reached", code="rate_limit_exceeded")
    assert rig.tick()[-1] == "BatchCreateFailed"
    assert rig.tick(0.5) == []  # waits resubmit_delay
    assert rig.tick(resubmit_delay(2.0))[-2:] == ["BatchCreateRequested", "BatchCreated"]
    assert rig.calls("upload") == 1 and rig.calls("create_batch") == 2


@pytest.mark.parametrize("kind", ["lost", "dropped"])
def test_unknown_create_is_reconciled_before_anything_is_sent_again(rig, kind):
    rig.drop(2)
    rig.provider.fail_next("create_batch", kind)
    types = rig.tick()
    if kind == "lost":  # it took effect: the listing finds it and the batch is adopted
        assert types[-2:] == ["BatchCreated", "BatchStatusChanged"]  # adopted, and where it is recorded
        assert rig.events("BatchCreated")[0]["reconciled"] is True and rig.calls("create_batch") == 1
    else:  # absent, but a late create may still land: unknown until a listing after the request timeout
        assert types[-1] == "BatchCreateRequested" and rig.job().chunks[0].open_intent == "create"
        types = rig.tick(200)  # request_timeout_seconds (120) + 3 s later: provably absent, created again
        assert "BatchCreateFailed" in types and "absent" in rig.events("BatchCreateFailed")[0]["error"]
        assert types[-1] == "BatchCreated" and rig.calls("create_batch") == 2
    assert len(rig.provider.batches) == 1 and rig.calls("upload") == 1
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted"


@pytest.mark.parametrize("kind", ["lost", "dropped"])
def test_unknown_upload_is_reconciled_and_never_duplicated(rig, kind):
    rig.drop(2)
    rig.provider.fail_next("upload", kind)
    rig.tick()
    uploaded = rig.events("FileUploaded")
    assert len(uploaded) == 1 and uploaded[0]["reconciled"] is (kind == "lost")
    assert rig.calls("upload") == (1 if kind == "lost" else 2)
    assert len([f for f in rig.provider.files.values() if f.info.purpose == "batch"]) == 1


def test_open_intent_is_reconciled_on_a_later_tick_when_the_listing_failed(rig):
    rig.drop(2)
    rig.provider.fail_next("create_batch", "lost")
    rig.provider.fail_next("find_batches", "unavailable")
    assert rig.tick()[-1] == "BatchCreateRequested"  # outcome unknown: the intent stays open
    assert rig.job().chunks[0].open_intent == "create"
    types = rig.tick()
    assert types[0] == "BatchCreated" and rig.events("BatchCreated")[0]["reconciled"] is True
    assert rig.calls("create_batch") == 1 and len(rig.provider.batches) == 1


def test_a_restarted_engine_reconciles_an_open_upload(home):
    rig = make(home, "")
    rig.drop(2)
    rig.provider.fail_next("upload", "lost")
    rig.provider.fail_next("find_files", "unavailable")
    rig.tick()
    assert rig.job().chunks[0].open_intent == "upload"
    provider = rig.provider
    rig.close()
    again = make(home, "")  # a new process: state folded from the log, timers fresh
    again.provider = provider
    again.engine.ctx.providers = Providers.of(provider)
    assert again.tick()[:2] == ["FileUploaded", "BatchCreateRequested"]
    assert provider.calls.count(("upload", provider.calls[0][1])) == 1
    again.close()


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("ragged.csv", b"a,response\n1,x\n2,y,z\n", "line 3"),
        ("empty.csv", b"", "empty"),
        ("header.csv", b"a,response\n", "no data rows"),
        ("nocol.csv", b"a,b\n1,2\n", "response"),
        ("latin1.csv", "response\ncaf\xe9\n".encode("latin-1"), "UTF-8"),
        ("notlist.json", b'{"response": "x"}', "array"),
        ("badline.jsonl", b'{"response": "x"}\n{"response": \n', "line 2"),
        ("notes.txt", b"hello", "unsupported"),
    ],
)
def test_bad_input_fails_clearly_keeps_the_original_and_others_go_on(rig, name, content, needle):
    (rig.home.inbox / name).write_bytes(content)
    (rig.home.inbox / "good.csv").write_text("response\nfine\n")
    rig.tick()
    rig.tick()
    rig.tick()
    rig.provider.finish_all()
    rig.tick()
    report = (rig.home.outbox / f"{name.rsplit('.', 1)[0]}_error.txt").read_text()
    assert needle in report and name in report and "What to do" in report
    assert (rig.home.failed / name).read_bytes() == content  # the original is kept, byte for byte
    jobs = {j.file: j for j in rig.engine.ctx.state.jobs.values()}
    assert jobs["good.csv"].ended == "completed" and (rig.home.outbox / "good_results.csv").exists()
    bad = jobs[name]
    assert (bad.ended == "failed" and needle in bad.error["error"]) or (bad.rejected and name == "notes.txt")
    assert rig.calls("upload") == 1  # only the good file


def test_symlink_is_rejected_and_left_alone(rig, tmp_path):
    target = tmp_path / "secret.csv"
    target.write_text("response\nprivate\n")
    (rig.home.inbox / "link.csv").symlink_to(target)
    rig.tick()
    rig.tick()
    assert (rig.home.inbox / "link.csv").is_symlink()
    assert "symbolic link" in (rig.home.outbox / "link_error.txt").read_text()
    assert rig.provider.calls == []  # nothing was sent


def test_missing_pricing_fails_before_anything_is_sent(home):
    rig = make(home, "model: acme-unpriced-1\n")
    (home.inbox / "a.csv").write_text("response\nx\n")
    rig.tick()
    types = rig.tick()  # the error report and the move first, the final event last (issue 10, item 6)
    assert types == ["JobAccepted", "PrepareFailed", "OutboxWriteStarted", "ResultWritten", "InputArchived", "JobFailed"]
    assert "acme-unpriced-1" in (home.outbox / "a_error.txt").read_text()
    assert rig.provider.calls == [] and not rig.engine.busy()
    rig.close()


def test_a_job_that_cannot_be_prepared_is_ended_by_the_rules_after_a_restart(home):
    """A job ends one way (issue 36): its failure to prepare is a fact (``PrepareFailed``); its
    ending (the error report, the move to failed/, ``JobFailed``) is what the rules decide, so a
    daemon that stopped in between (here: the outbox could not be written) ends it when it
    starts again, with no step of its own for it."""
    from batchgrader.core.host.home import Home
    from batchgrader.core.rules.actions import Archive, Finish, WriteErrorReport
    from batchgrader.core.rules.decide import decide_job
    from batchgrader.daemon.engine import Engine

    rig = make(home, "model: acme-unpriced-1\n")
    (home.inbox / "a.csv").write_text("response\nx\n")
    rig.tick()
    home.outbox.rmdir()
    home.outbox.symlink_to("/sys")  # nobody may write there, root included
    # the report could not be written: the tick stops there
    assert rig.tick() == ["JobAccepted", "PrepareFailed", "OutboxWriteStarted"]
    job = rig.job()
    assert not job.ended and job.start_failure is not None and job.start_failure["code"] == "missing_pricing"
    actions = decide_job(rig.engine.ctx.state, job.job_id, rig.engine.ctx.config, rig.now)
    assert [type(a) for a in actions] == [WriteErrorReport, Archive, Finish] and actions[-1].event == "JobFailed"
    home.outbox.unlink()
    home.outbox.mkdir()
    again = Engine(Home(home.root), rig.engine.ctx.config, rig.store, rig.provider, rig.engine.ctx.prices)  # a restart
    again.tick(rig.now + 1)
    job = again.ctx.state.jobs[job.job_id]
    assert job.ended == "failed" and job.error is not None and job.error["code"] == "missing_pricing"
    assert [e.type for e in rig.store.read(job_id=job.job_id)][-3:] == ["ResultWritten", "InputArchived", "JobFailed"]
    assert "acme-unpriced-1" in (home.outbox / "a_error.txt").read_text() and rig.provider.calls == []
    rig.close()


def test_several_files_profiles_chunks_and_structured_output(home):
    rig = make(
        home,
        """split_row_limit: 4
profiles:
  scored:
    output_column: verdict
    response_format:
      type: object
      properties: {score: {type: integer}, reason: {type: string}}
      required: [score, reason]
      additionalProperties: false
""",
    )
    rig.provider.answer = lambda cid, body: (
        json.dumps({"score": 7, "reason": "ok"}) if "response_format" in body else f"SIMULATED {cid}"
    )
    (home.inbox / "reviews.csv").write_text("id,response\n" + "".join(f"{i:03d},text {i} NA\n" for i in range(10)))
    (home.inbox / "scored").mkdir()
    (home.inbox / "scored" / "answers.jsonl").write_text(
        "".join(json.dumps({"n": i, "response": f"a {i}"}) + "\n" for i in range(5))
    )
    (home.inbox / "list.json").write_text(json.dumps([{"response": "x", "keep": 1.50}, {"response": "y", "keep": None}]))
    rig.tick()
    rig.tick()  # accepted and prepared, oldest first
    for _ in range(4):  # max_simultaneous_batches (2) at a time
        rig.tick()
        rig.provider.finish_all()
        rig.tick()
    jobs = {j.file: j for j in rig.engine.ctx.state.jobs.values()}
    assert {f: j.ended for f, j in jobs.items()} == {f: "completed" for f in ("reviews.csv", "answers.jsonl", "list.json")}
    assert jobs["reviews.csv"].chunks_total == 3 and jobs["answers.jsonl"].profile == "scored"
    assert len(rig.provider.batches) == 6  # exactly one batch per chunk
    rows = rig.result_rows("reviews_results.csv")
    assert [r["id"] for r in rows] == [f"{i:03d}" for i in range(10)]  # order and leading zeros kept
    scored = [json.loads(x) for x in (home.outbox / "answers_results.jsonl").read_text().splitlines()]
    assert [r["n"] for r in scored] == list(range(5)) and all(r["score"] == 7 and r["reason"] == "ok" for r in scored)
    lst = json.loads((home.outbox / "list_results.json").read_text())
    assert [r["keep"] for r in lst] == [1.50, None] and lst[0]["error"] is None
    assert sorted(p.name for p in home.archive.iterdir()) == ["answers.jsonl", "list.json", "reviews.csv"]
    rig.close()


def test_bgctl_retry_reopens_a_finished_job_and_writes_a_new_result(home):
    rig = make(home, "max_row_retries: 0\n")
    rig.drop(4)
    rig.tick()
    first = rig.provider.requests_in(next(iter(rig.provider.files)))[0]["custom_id"]
    rig.provider.row_errors = {first: ("server_error", "try again")}
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted" and rig.job().ended == "completed_with_errors"
    assert (home.archive / "a.csv").exists()
    rig.provider.row_errors = {}
    rig.control("RetryRequested")
    types = rig.tick()
    assert types[:2] == ["InputRestored", "RetryPlanned"] and rig.events("RetryPlanned")[0]["manual"] is True
    assert rig.events("RetryPlanned")[0]["custom_ids"] == [first]
    rig.tick()
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted" and rig.job().ended == "completed"
    results = sorted(home.outbox.glob("a_results*.csv"))
    assert len(results) == 2  # never overwritten: the new one has a timestamp suffix
    newest = next(p for p in results if p.name != "a_results.csv")
    assert all(r["error"] == "" for r in rig.result_rows(newest.name))
    assert (home.archive / "a.csv").exists()
    rig.close()


def test_a_halt_also_fails_the_retry_chunks_waiting_to_be_sent(home):
    """Rows planned for an automatic retry when another chunk fails for good are failed as
    halted with the rest: the job ends instead of waiting for chunks it will never send."""
    rig = make(home, "split_row_limit: 2\nmax_simultaneous_batches: 1\nhalt_on_chunk_failure: true\nmax_row_retries: 1\n")
    rig.drop(4)
    rig.tick()
    ids = rig.provider.requests_in(next(iter(rig.provider.files)))
    rig.provider.row_errors = {ids[1]["custom_id"]: ("server_error", "try again")}
    rig.provider.finish_all()
    rig.tick()  # chunk 0 merged (a row to retry), chunk 1 sent
    (batch,) = rig.provider.open_batches()
    rig.provider.finish(batch.id, "failed", errors=[("invalid_request", "model not allowed for this project")])
    rig.tick()
    types = rig.tick()
    assert types[-1] == "JobFailed" and rig.job().error["code"] == "halted"
    retry_chunks = [c for c in rig.job().chunks.values() if c.custom_ids]
    assert retry_chunks and all(c.done and (c.failure or {}).get("code") == "halted" for c in retry_chunks)
    assert rig.calls("create_batch") == 2  # nothing was sent after the failure
    errors = [r["error"] for r in rig.result_rows()]
    assert errors[0] == "" and errors[1] == "server_error: try again"  # the row to retry keeps its own error
    assert all(e.startswith("halted: ") and "model not allowed" in e for e in errors[2:])
    rig.close()


def test_a_tick_that_prepares_a_job_asks_for_the_next_at_once(home):
    """``Prepare`` ends the job's tick with its uploads due now: the engine says so (``again``),
    and the daemon ticks again at once instead of a tick interval later; a tick that only waits
    on the provider does not ask."""
    rig = Rig(home)
    (rig.home.inbox / "a.csv").write_text("id,response\n1,an essay\n2,another essay\n")
    rig.tick()  # first look at the inbox
    assert rig.tick()[:2] == ["JobAccepted", "JobPrepared"] and rig.engine.again
    assert "BatchCreated" in rig.tick() and not rig.engine.again
    rig.tick()  # a poll
    assert not rig.engine.again
    rig.close()


def test_a_refused_chunk_of_a_job_with_reused_rows_is_replanned_with_every_row_it_held(home):
    """With rows answered at prepare (here the preflight's, as stored answers are), a chunk's range
    counts only the rows sent, so its rows sit later in the requests file than its range says.
    Re-planning it after a refusal must still take every one of them: none is left unanswered."""
    rig = Rig(home, "preflight_rows: 2\n")
    try:
        (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(6)))
        for _ in range(5):
            rig.tick()
            if rig.provider.open_batches():
                break
        (batch,) = rig.provider.open_batches()
        assert rig.job().chunks[0].requests == 4  # rows 3-6: the first two were answered by the preflight
        rig.provider.finish(batch.id, "failed", errors=[("token_limit_exceeded", "Enqueued token limit reached")])
        rig.tick()
        (replanned,) = rig.events("ChunkReplanned")
        assert sum(len(c["custom_ids"]) for c in replanned["chunks"]) == 4
        for _ in range(10):
            rig.provider.finish_all()
            rig.tick()
            if rig.job().ended:
                break
        assert rig.job().ended == "completed"
        rows = rig.result_rows()
        assert len(rows) == 6 and all(r["error"] == "" for r in rows)
        assert sorted(r["answered_by"] for r in rows) == ["batch"] * 4 + ["preflight"] * 2
    finally:
        rig.close()


def test_a_job_stopped_between_its_archive_and_its_end_ends_without_bringing_its_input_back(home):
    """An archived input comes back only for a job reopened by `bgctl retry`: a job whose end was
    interrupted after the archive (a step that raised, a crash, on a shared store the account's
    lease held elsewhere) carries on with its end, its input left in the archive."""
    rig = make(home, "")
    rig.drop(2)
    rig.tick()
    rig.provider.finish_all()
    rig.provider.fail_next("delete_file", "broken")  # the delete step raises what no rule foresaw
    types = rig.tick()
    assert "InputArchived" in types and "JobCompleted" not in types and (home.archive / "a.csv").exists()
    types = rig.tick()
    assert "InputRestored" not in types and types.count("InputArchived") == 0 and types[-1] == "JobCompleted"
    assert (home.archive / "a.csv").exists() and rig.job().ended == "completed"
    rig.close()

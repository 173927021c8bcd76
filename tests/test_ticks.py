"""Every engine rule, tick by tick: a real Engine and EventStore, the in-memory provider, a clock
the test moves.  Fast (no subprocess, no HTTP, no sleeps); the subprocess suites keep what only
a real process shows."""

from __future__ import annotations

import pytest

from batchgrader.core.decide import resubmit_delay
from ticks import Rig


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
        "OutboxWriteStarted",
        "ResultWritten",
        "InputArchived",
        "ProviderFilesDeleted",
        "JobCompleted",
    ]
    rows = rig.result_rows()
    assert [r["id"] for r in rows] == ["0", "1", "2"]
    assert all(r["error"] == "" and "SIMULATED" in r["grade"] for r in rows)
    assert rig.engine.state.jobs[job.job_id].ended == "completed"
    assert not rig.provider.files  # uploaded input and the output deleted at the provider
    assert rig.engine.idle


def test_polling_backs_off_while_nothing_changes(rig):
    rig.drop(2)
    rig.tick()
    polls = []
    for _ in range(8):
        rig.tick(0.5)
        polls.append(rig.calls("retrieve"))
    # first poll after 0.5 s, then ever longer waits (1.6x) up to poll_interval_seconds (2 s)
    assert polls[0] == 1 and polls[-1] < 8
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    assert 0 in gaps


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
    rig.reconfigure(f"split_row_limit: 2\nmax_simultaneous_batches: 5\nenqueued_token_limit: {{gpt-4o-mini: {per_chunk + 1}}}\n")
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
    ids = rig.provider._requests(next(iter(rig.provider.files)))
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


def test_token_limit_exceeded_batch_is_sent_again_after_a_delay(rig):
    rig.drop(2)
    rig.tick()
    (batch,) = rig.provider.open_batches()
    rig.provider.finish(batch.id, "failed", errors=[("token_limit_exceeded", "Enqueued token limit reached")])
    types = rig.tick()
    failed = rig.events("ChunkFailed")
    assert failed[0]["code"] == "token_limit_exceeded" and failed[0]["retryable"] is True
    assert "RowsFailed" not in types and "UploadStarted" not in types
    delay = resubmit_delay(2.0)
    rig.tick(delay / 2)
    assert rig.calls("upload") == 1  # not yet
    types = rig.tick(delay)
    assert types[:1] == ["UploadStarted"] and rig.events("UploadStarted")[-1]["attempt"] == 2
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted"


def test_create_refused_for_the_token_limit_waits_then_creates_with_the_same_file(rig):
    rig.drop(2)
    rig.provider.fail_next("create_batch", "refused", status_code=400, message="token_limit reached", code="token_limit_exceeded")
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
    else:  # provably absent: recorded as not created; the next tick creates with the same file
        assert types[-1] == "BatchCreateFailed" and "absent" in rig.events("BatchCreateFailed")[0]["error"]
        assert rig.tick()[-1] == "BatchCreated"
        assert rig.calls("create_batch") == 2
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
    again.engine.provider = provider
    assert again.tick()[:2] == ["FileUploaded", "BatchCreateRequested"]
    assert provider.calls.count(("upload", provider.calls[0][1])) == 1
    again.close()

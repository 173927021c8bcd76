"""The outcome rules (core/rules/outcomes.py) and the schedule (core/rules/schedule.py) by themselves: pure
functions of (outcome, schedule counts, settings, now) — no engine, no provider, no clock."""

from __future__ import annotations

import pytest

from batchgrader.core.rules import queue
from batchgrader.core.rules.actions import OUTBOX_TIMER
from batchgrader.core.rules.decide import resubmit_delay
from batchgrader.core.rules.outcomes import (
    MAX_DOWNLOAD_ATTEMPTS,
    MAX_MALFORMED_DOWNLOADS,
    OUTBOX_RETRY_FIRST,
    OUTBOX_RETRY_MAX,
    Absent,
    DownloadGiveUp,
    DownloadRetry,
    ListAgain,
    create_not_listed,
    create_refused,
    download_failed,
    download_may_start,
    duplicate_watch_next,
    malformed_download_again,
    merge_in_worker,
    outbox_retry_at,
    queue_full_error,
)
from batchgrader.core.rules.schedule import Schedule
from batchgrader.core.rules.settle import ANSWERED_SETTLE, DUPLICATE_CHECK_EVERY, LOST_REPLY_SLACK, CreateSent

TOKEN_LIMIT = "Enqueued token limit reached for gpt-5.4-mini in organization org-x. Limit: 90,000 enqueued tokens."


# --- downloads ------------------------------------------------------------------------------------


def test_a_failed_download_waits_twice_as_long_each_time_then_gives_up():
    now, tries, waits = 100.0, 0, []
    for _ in range(MAX_DOWNLOAD_ATTEMPTS - 1):
        got = download_failed(tries, definite=False, now=now)
        assert isinstance(got, DownloadRetry)
        waits.append(got.at - now)
        tries = got.tries
    assert waits == [2.0, 4.0, 8.0]
    assert download_failed(tries, definite=False, now=now) == DownloadGiveUp(MAX_DOWNLOAD_ATTEMPTS)


def test_a_definite_refusal_gives_the_file_up_at_once():
    assert download_failed(0, definite=True, now=5.0) == DownloadGiveUp(1)


def test_a_download_waits_for_its_pause():
    assert download_may_start(None, 10.0)
    assert not download_may_start((1, 12.0), 10.0)
    assert download_may_start((1, 12.0), 12.0)


def test_a_malformed_file_is_downloaded_again_a_bounded_number_of_times():
    assert [malformed_download_again(n) for n in range(MAX_MALFORMED_DOWNLOADS + 1)] == [True] * MAX_MALFORMED_DOWNLOADS + [False]


# --- refused creates ------------------------------------------------------------------------------


def test_a_refusal_that_is_not_about_capacity_fails_the_chunk():
    got = create_refused(400, "invalid_request", "bad metadata", None, 0, 2.0, 100.0)
    assert got.kind == "rejected"


def test_a_refusal_naming_the_token_limit_is_about_capacity_whatever_its_status():
    got = create_refused(400, None, f"token_limit_exceeded: {TOKEN_LIMIT}", None, 0, 2.0, 100.0)
    assert got.kind == "wait" and got.rounds == 1


def test_a_rate_limit_waits_without_counting_a_round():
    got = create_refused(429, "rate_limit_exceeded", "too many requests", None, 3, 2.0, 100.0)
    assert got.kind == "wait" and got.not_before == 100.0 + resubmit_delay(2.0) and got.rounds == 0


def test_a_queue_refusal_that_teaches_the_limit_is_learned():
    learned = queue.Learned(limit=90_000, exact=True, source="refusal")
    got = create_refused(429, queue.TOKEN_LIMIT_CODE, TOKEN_LIMIT, learned, 0, 2.0, 100.0)
    assert got.kind == "learn" and got.learned == learned and got.not_before is None


def test_queue_refusals_that_teach_nothing_wait_doubling_then_end_queue_full():
    rounds, waits = 0, []
    while True:
        got = create_refused(429, queue.TOKEN_LIMIT_CODE, TOKEN_LIMIT, None, rounds, 2.0, 1000.0)
        if got.kind == "queue_full":
            break
        assert got.kind == "wait" and got.not_before is not None
        waits.append(got.not_before - 1000.0)
        rounds = got.rounds
    assert got.rounds == queue.QUEUE_FULL_ROUNDS
    base = resubmit_delay(2.0)
    assert waits == [base * 2**k for k in range(queue.QUEUE_FULL_ROUNDS - 1)]
    assert "6 times" in queue_full_error(got.rounds, "last") and queue_full_error(6, "last").endswith("last")


def test_the_wait_after_a_queue_refusal_is_capped():
    got = create_refused(429, queue.TOKEN_LIMIT_CODE, TOKEN_LIMIT, None, 1, 500.0, 0.0)
    assert got.kind == "wait" and got.not_before == queue.MAX_REFUSAL_WAIT


# --- the outbox -----------------------------------------------------------------------------------


def test_an_unwritten_result_is_tried_again_after_a_doubling_back_off():
    waits = [outbox_retry_at(n, 50.0) - 50.0 for n in range(1, 10)]
    assert waits[:4] == [OUTBOX_RETRY_FIRST, 2 * OUTBOX_RETRY_FIRST, 4 * OUTBOX_RETRY_FIRST, 8 * OUTBOX_RETRY_FIRST]
    assert max(waits) == OUTBOX_RETRY_MAX


# --- merging --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requests", "at_least", "workers", "failed", "expected"),
    [
        (100, 50, True, False, True),
        (49, 50, True, False, False),  # a small chunk is merged in the daemon
        (100, None, True, False, False),  # workers off
        (100, 50, False, False, False),  # no workers in this process
        (100, 50, True, True, False),  # the fallback: its worker failed once, merged here from now on
    ],
)
def test_where_a_chunk_is_merged(requests, at_least, workers, failed, expected):
    assert merge_in_worker(requests, at_least, workers, failed) is expected


# --- listings -------------------------------------------------------------------------------------


def test_a_create_without_a_reply_is_listed_again_until_believed_absent():
    request = CreateSent(sent=100.0, gave_up=130.0)
    got = create_not_listed(request, 30.0, 131.0)
    assert isinstance(got, ListAgain) and 0 < got.seconds <= 130.0 + LOST_REPLY_SLACK - 131.0
    assert create_not_listed(request, 30.0, 130.0 + LOST_REPLY_SLACK) == Absent()


def test_a_create_answered_with_an_error_is_absent_soon_after_the_answer():
    request = CreateSent(sent=100.0, gave_up=101.0, answered=True)
    assert isinstance(create_not_listed(request, 30.0, 101.5), ListAgain)
    assert create_not_listed(request, 30.0, 101.0 + ANSWERED_SETTLE) == Absent()


def test_the_duplicate_watch_lists_every_few_seconds_and_ends_once_nothing_waits():
    assert duplicate_watch_next(10.0, 40.0, batch_ended=False, pending=0) == DUPLICATE_CHECK_EVERY
    assert duplicate_watch_next(39.5, 40.0, batch_ended=False, pending=0) == 0.5  # once more at its end
    assert duplicate_watch_next(40.0, 40.0, batch_ended=False, pending=0) is None
    assert duplicate_watch_next(10.0, 40.0, batch_ended=True, pending=0) is None  # forced before collecting
    assert duplicate_watch_next(40.0, 40.0, batch_ended=False, pending=1) is not None  # a cancel still to send


# --- the schedule ---------------------------------------------------------------------------------


def test_the_schedule_is_what_decide_reads_live():
    s = Schedule()
    timers = s.timers(mono=7.0)
    s.next_poll[("j", 0)] = (9.0, 1.0)
    s.not_before[("j", OUTBOX_TIMER)] = 12.0
    assert timers.next_poll[("j", 0)] == (9.0, 1.0) and timers.clock(100.0) == 7.0
    s.outbox_failures["j"] = 2
    s.outbox_written("j")
    assert ("j", OUTBOX_TIMER) not in timers.not_before and "j" not in s.outbox_failures


def test_the_schedule_forgets_a_create_once_its_batch_is_recorded():
    s = Schedule()
    key = ("j", 1)
    s.create_sent[key] = CreateSent(1.0)
    s.next_listing[key] = 5.0
    s.dup_next[key] = 6.0
    assert not s.listing_due(key, 4.0) and s.listing_due(key, 5.0)
    s.batch_created(key, 8.0, (8.5, 0.5))
    assert key not in s.create_sent and key not in s.next_listing and key not in s.dup_next
    assert s.created_at[key] == 8.0 and s.next_poll[key] == (8.5, 0.5) and s.listing_due(key, 0.0)
    s.dup_cancelled[key] = {"b"}
    s.dup_next[key] = 9.0
    s.duplicates_checked(key)
    assert key not in s.dup_cancelled and key not in s.dup_next

"""The preflight row by row (issue 32), tick by tick with the in-memory provider and the rig's
clock: it sends only requests that will actually be sent (stored answers, in-file duplicates and
rows too large for prepare taken out) and stores its answers; what each call paid is recorded when
it returns and never paid again; only transient errors are retried (after the provider's
Retry-After, a bounded number of times); input and header problems fail the job before anything
is paid; a cancel stops it.  Its rows go out together: every intent, then the calls at once, then the
outcomes in row order."""

from __future__ import annotations

import threading

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.preflight_rules import PREFLIGHT_MAX_ATTEMPTS, preflight_delay
from batchgrader.daemon.engine import Engine
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.memory import default_answer
from batchgrader.store.eventstore import NewEvent
from ticks import Rig

TEXTS = [f"essay number {i}" for i in range(12)]


@pytest.fixture
def rig(home):
    r = Rig(home, "preflight_rows: 3\n")
    yield r
    r.close()


def write(rig: Rig, name: str, texts: list[str]) -> None:
    (rig.home.inbox / name).write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))


def job_of(rig: Rig, name: str) -> JobState:
    (job,) = [j for j in rig.engine.ctx.state.jobs.values() if j.file == name]
    return job


def completes(rig: Rig) -> list[str]:
    """The custom_ids sent through the synchronous API, sorted (a preflight sends its rows
    together, in no set order)."""
    return sorted(cid for op, cid in rig.provider.calls if op == "complete")


def batch_rows(rig: Rig) -> int:
    return sum(b.request_counts.total for b in rig.provider.batches.values())


def _cid(rig: Rig, n: int) -> str:
    """The custom_id of data row ``n`` (1-based) of the job's file."""
    from batchgrader.pipeline.requests import default_custom_id

    return default_custom_id(rig.job().sha256, n)


# --- 1. the preflight composes with reuse --------------------------------------------------------------


def test_a_resubmitted_fully_answered_file_sends_nothing_and_costs_nothing(rig):
    first = rig.run_file("a.csv", TEXTS)
    assert first.ended == "completed" and len(completes(rig)) == 3 and batch_rows(rig) == 9
    creates = rig.calls("create_batch")
    second = rig.run_file("b.csv", TEXTS)
    assert second.ended == "completed" and second.cached_rows == 12
    assert len(completes(rig)) == 3 and rig.calls("create_batch") == creates  # no preflight, no batch
    assert second.cost_usd == 0 and second.preflight is None


def test_the_preflights_answers_are_stored_for_later_jobs(rig):
    first = rig.run_file("a.csv", TEXTS[:3])  # every row answered by the preflight: no batch
    assert first.ended == "completed" and len(completes(rig)) == 3 and rig.calls("create_batch") == 0
    second = rig.run_file("b.csv", TEXTS[:3])
    assert second.ended == "completed" and second.cached_rows == 3 and second.cost_usd == 0
    assert len(completes(rig)) == 3  # nothing sent again


def test_one_changed_row_is_the_only_request_and_the_preflight_sends_it(rig):
    rig.run_file("a.csv", TEXTS)
    calls, creates = len(completes(rig)), rig.calls("create_batch")
    changed = [*TEXTS[:7], "a corrected essay", *TEXTS[8:]]
    job = rig.run_file("b.csv", changed)
    assert len(completes(rig)) == calls + 1 and rig.calls("create_batch") == creates  # one request, no batch
    assert job.ended == "completed" and job.succeeded_rows == 12 and job.saved_usd > 0
    rows = rig.result_rows("b_results.csv")
    assert [r["answered_by"] for r in rows].count("preflight") == 1 and all(r["grade"] for r in rows)
    assert job.cost_usd > 0


def test_identical_rows_are_sent_once_by_the_preflight(rig):
    job = rig.run_file("a.csv", ["same", "same", "same", "other"])
    assert len(completes(rig)) == 2 and rig.calls("create_batch") == 0
    assert job.ended == "completed" and job.succeeded_rows == 4


# --- 2. what a preflight call paid is kept --------------------------------------------------------------


def test_a_429_on_the_second_row_keeps_the_others_and_waits_for_retry_after(rig):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.fail_next("complete", "refused", status_code=429, message="slow down", retry_after=40.0, match="-2")
    types = rig.tick()
    answered = ["PreflightRowAnswered", "TokensUsed"]
    assert types[-8:] == [*["PreflightRequested"] * 3, *answered, *answered, "PreflightUnreachable"]
    job = rig.job()
    assert job.preflight_retry_at == pytest.approx(rig.now + 40.0)  # the provider's Retry-After, not the 5 s backoff
    assert [a["custom_id"] for a in job.preflight_answers] == [_cid(rig, 1), _cid(rig, 3)]  # in row order
    assert job.cost_usd > 0  # the answered rows count in the job's totals
    assert "slow down" in (job.last_error or "")
    assert rig.tick(20) == []  # before the Retry-After: nothing leaves
    assert rig.tick(21)[:2] == ["PreflightRequested", "PreflightRowAnswered"]  # row 2 alone
    assert completes(rig) == [_cid(rig, 1), _cid(rig, 2), _cid(rig, 2), _cid(rig, 3)]  # rows 1 and 3 never paid again
    assert rig.job().preflight == "passed"
    used = [u for u in rig.events("TokensUsed") if u["chunk"] == -1]
    assert len(used) == 3 and rig.job().cost_usd == pytest.approx(sum(u["cost_usd"] for u in used))
    assert sum(u["cost_usd"] for u in used) == pytest.approx(rig.events("PreflightPassed")[0]["cost_usd"])


@pytest.mark.parametrize("kind", ["lost", "unavailable"])
def test_a_lost_reply_on_the_third_row_resends_only_that_row_after_the_backoff(rig, kind):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.fail_next("complete", kind, match="-3")
    assert rig.tick()[-1] == "PreflightUnreachable"
    assert len(rig.job().preflight_answers) == 2
    assert rig.tick(preflight_delay(1) / 2) == []
    rig.tick(preflight_delay(1))
    assert completes(rig) == [_cid(rig, 1), _cid(rig, 2), _cid(rig, 3), _cid(rig, 3)]
    assert rig.job().preflight == "passed"
    assert len([u for u in rig.events("TokensUsed") if u["chunk"] == -1]) == 3


def test_a_crash_between_intent_and_outcome_resends_only_that_row_at_most_once(rig):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.fail_next("complete", "unavailable", match="-2")
    rig.tick()
    row2 = _cid(rig, 2)
    job_id = rig.job().job_id
    rig.engine.ctx.emit(job_id, NewEvent("PreflightRequested", {"rows": [row2], "attempt": 2}))  # the crash's open intent
    rig.tick(preflight_delay(1))
    assert completes(rig) == [_cid(rig, 1), row2, row2, _cid(rig, 3)]  # row 2 once more, row 1 not again
    assert rig.job().preflight == "passed"


def test_a_row_left_open_by_two_crashes_is_not_sent_a_third_time(rig):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.fail_next("complete", "unavailable", match="-1")
    rig.tick()
    row1 = _cid(rig, 1)
    job_id = rig.job().job_id
    rig.engine.ctx.emit(job_id, NewEvent("PreflightRequested", {"rows": [row1], "attempt": 2}))  # sent, crash
    rig.engine.ctx.emit(job_id, NewEvent("PreflightRequested", {"rows": [row1], "attempt": 3}))  # sent again, crash again
    rig.tick(preflight_delay(3))
    assert completes(rig).count(row1) == 1  # the scripted failure only: not sent by the preflight again
    assert rig.job().preflight == "passed" and row1 not in {a["custom_id"] for a in rig.job().preflight_answers}
    rig.tick()
    rig.tick()
    rig.provider.finish_all()
    rig.tick()
    assert rig.job().ended == "completed"  # the row went in the batch


# --- 3. a preflight ends --------------------------------------------------------------------------------


def test_an_empty_id_fails_the_job_before_anything_is_paid(home):
    rig = Rig(home, "preflight_rows: 3\nid_column: id\n")
    (rig.home.inbox / "a.csv").write_text("id,response\nr1,a\n,b\nr3,c\n")
    for _ in range(4):
        rig.tick()
    job = rig.job()
    assert job.ended == "failed" and job.error is not None and job.error["code"] == "bad_input"
    assert "is empty" in job.error["error"] and rig.calls("complete") == 0
    rig.close()


def test_a_request_the_client_refuses_to_send_fails_the_job_at_once(rig):
    def refuse(cid, body):
        raise TypeError("Completions.create() got an unexpected keyword argument 'reasoning_effort'")

    rig.provider.answer = refuse
    write(rig, "a.csv", TEXTS[:5])
    rig.tick()
    rig.tick()
    job = rig.job()
    assert job.ended == "failed" and job.error is not None and job.error["code"] == "preflight_failed"
    assert "unexpected keyword argument" in job.error["error"] and "config.yaml" in job.error["hint"]
    assert rig.calls("complete") == 3  # the rows' requests went out together, each tried once
    assert rig.events("PreflightFailed")[0]["custom_id"] == _cid(rig, 1)  # the first in row order is named
    for _ in range(3):
        rig.tick(60)
    assert rig.calls("complete") == 3


def test_transient_errors_are_retried_a_bounded_number_of_times_with_the_reason_shown(rig):
    from batchgrader.store import queries

    for _ in range(PREFLIGHT_MAX_ATTEMPTS + 2):
        rig.provider.fail_next("complete", "refused", status_code=503, message="overloaded", match="-1")
    write(rig, "a.csv", TEXTS[:5])
    rig.tick()
    rig.tick()
    (row,) = queries.status(rig.home)
    shown = row.get("last_error") or row.get("error") or ""
    assert "overloaded" in shown and "try 1" in shown  # the reason, and how many tries so far
    for attempt in range(1, PREFLIGHT_MAX_ATTEMPTS + 1):
        rig.tick(preflight_delay(attempt))
    job = rig.job()
    assert completes(rig).count(_cid(rig, 1)) == PREFLIGHT_MAX_ATTEMPTS and rig.calls("complete") == PREFLIGHT_MAX_ATTEMPTS + 2
    assert job.ended == "failed" and job.error is not None and job.error["code"] == "preflight_failed"
    assert "overloaded" in job.error["error"] and str(PREFLIGHT_MAX_ATTEMPTS) in job.error["error"]
    rig.tick(600)
    assert rig.calls("complete") == PREFLIGHT_MAX_ATTEMPTS + 2


# --- 4. checks before paying ----------------------------------------------------------------------------


def test_a_label_column_typo_fails_the_job_before_any_request(home):
    rig = Rig(home, "preflight_rows: 3\nreference_column: lable\n")
    (rig.home.inbox / "a.csv").write_text("id,response,label\n" + "".join(f"{i},text {i},good\n" for i in range(5)))
    for _ in range(3):
        rig.tick()
    job = rig.job()
    assert job.ended == "failed" and job.error is not None and "lable" in job.error["error"]
    assert rig.calls("complete") == 0


def test_a_row_too_large_for_prepare_is_not_sent_by_the_preflight(home):
    rig = Rig(home, "preflight_rows: 3\ncontext_window: 2000\n")
    big = " ".join(f"word{i}" for i in range(5000))
    (rig.home.inbox / "a.csv").write_text("id,response\n0,short a\n1," + big + "\n2,short b\n3,short c\n4,short d\n")
    rig.tick()
    rig.tick()
    assert _cid(rig, 2) not in completes(rig) and len(completes(rig)) == 3
    for _ in range(3):
        rig.tick()
        rig.provider.finish_all()
    job = rig.job()
    assert job.ended == "completed_with_errors"
    assert [info["code"] for info in job.row_errors.values()] == ["request_too_large"]
    rig.close()


# --- 5. cancel ------------------------------------------------------------------------------------------


def test_a_cancel_while_the_preflight_waits_sends_nothing_more(rig):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.fail_next("complete", "refused", status_code=429, message="slow down", match="-2")
    rig.tick()
    rig.control("CancelRequested")
    for _ in range(4):
        rig.tick(preflight_delay(5))
    job = rig.job()
    assert job.ended == "cancelled" and completes(rig) == [_cid(rig, 1), _cid(rig, 2), _cid(rig, 3)]
    assert rig.calls("create_batch") == 0 and rig.calls("upload") == 0
    assert job.succeeded_rows == 2  # the answers paid for before the cancel are kept


def test_a_cancel_with_the_preflights_intent_open_sends_nothing(rig):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.fail_next("complete", "unavailable")
    rig.tick()
    job_id = rig.job().job_id
    rig.engine.ctx.emit(job_id, NewEvent("PreflightRequested", {"rows": [_cid(rig, 1)], "attempt": 2}))  # then a crash
    rig.control("CancelRequested")
    before = rig.calls("complete")
    for _ in range(4):
        rig.tick(preflight_delay(5))
    assert rig.job().ended == "cancelled" and rig.calls("complete") == before
    assert rig.calls("create_batch") == 0


def test_the_preflights_rows_are_not_sent_again_in_the_batch(rig):
    job = rig.run_file("a.csv", TEXTS[:5])
    assert len(job.preflight_answers) == 3 and batch_rows(rig) == 2
    by = [r["answered_by"] for r in rig.result_rows()]
    assert by.count("preflight") == 3 and by.count("batch") == 2


def test_a_row_identical_to_a_preflight_row_is_a_duplicate_not_billed_twice(rig):
    rig.run_file("a.csv", ["same", "same", "other", "same"])
    job = rig.job()
    rows = rig.result_rows()
    assert [r["answered_by"] for r in rows] == ["preflight", "duplicate", "preflight", "duplicate"]
    assert sum(int(r["input_tokens"]) for r in rows) == job.prompt_tokens > 0  # the result's tokens are what was billed
    assert job.saved_usd > 0


def test_a_truncated_answer_on_the_second_row_fails_the_job_with_every_row_paid_recorded(rig):
    rig.provider.finish_reason = lambda cid, body: "length" if cid.endswith("-2") else "stop"
    write(rig, "a.csv", TEXTS[:5])
    rig.tick()
    rig.tick()
    job = rig.job()
    assert job.ended == "failed" and rig.events("PreflightFailed")[0]["row_code"] == "truncated"
    used = [u for u in rig.events("TokensUsed") if u["chunk"] == -1]
    assert len(used) == 3 and job.cost_usd == pytest.approx(sum(u["cost_usd"] for u in used)) and job.cost_usd > 0
    assert [a["custom_id"] for a in job.preflight_answers] == [_cid(rig, 1), _cid(rig, 3)]  # the truncated one is not kept


def test_a_config_edit_after_the_preflight_never_sends_its_rows_again(rig):
    """Issue 32 item 5 ("a settings change applies to requests not yet sent and never re-sends
    answered ones"): editing the system prompt after the preflight had paid for its 3 rows sent
    them again in the batch, each paid twice."""
    write(rig, "a.csv", TEXTS[:5])
    rig.tick()
    rig.tick()
    assert len(rig.job().preflight_answers) == 3
    rig.reconfigure("preflight_rows: 3\nsystem_prompt: Grade it strictly.\n")
    for _ in range(10):
        rig.tick()
        rig.provider.finish_all()
        if rig.job().ended:
            break
    paid = [cid for _job, cid, _body in rig.provider.billed]
    assert rig.job().ended == "completed" and len(paid) == len(set(paid)) == 5
    assert [r["answered_by"] for r in rig.result_rows()] == ["preflight"] * 3 + ["batch"] * 2


# --- 6. the rows go out together ------------------------------------------------------------------------


class Killed(BaseException):
    """Stands in for kill -9 while the preflight's requests are in flight: no ``Exception``, so
    nothing in the daemon records an outcome for it."""


def killed(cid: str, body: object) -> str:
    raise Killed(cid)


def restart(rig: Rig) -> None:
    """A new engine over the same event log, as a daemon started again."""
    rig.engine = Engine(rig.home, load_config(rig.home, environ={}), rig.store, rig.provider, load_pricing())
    rig.engine.startup(rig.now)


def test_the_rows_requests_are_in_flight_together_and_their_outcomes_come_in_row_order(rig):
    gate = rig.provider.complete_gate = threading.Barrier(3)  # each call held until all three are in flight
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    types = rig.tick()
    assert not gate.broken and rig.provider.most_in_flight == 3
    answered = ["PreflightRowAnswered", "TokensUsed"]
    passed = ["PreflightPassed", "JobPrepared", "RequestsReused"]  # prepared in the same tick
    assert types == ["JobAccepted", *["PreflightRequested"] * 3, *answered * 3, *passed]
    rows = [_cid(rig, n) for n in (1, 2, 3)]
    assert [e["rows"] for e in rig.events("PreflightRequested")] == [[r] for r in rows]
    assert [e["custom_id"] for e in rig.events("PreflightRowAnswered")] == rows
    assert {e["attempt"] for e in rig.events("PreflightRequested")} == {1}


@pytest.mark.parametrize("transient_row,refused_row", [(1, 2), (2, 1)])
def test_a_definite_refusal_wins_over_a_transient_error_on_another_row(rig, transient_row, refused_row):
    """Sent one at a time, the transient row was sent again after the backoff and the refused row
    then refused: the same end, one backoff sooner."""
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.fail_next("complete", "unavailable", match=f"-{transient_row}")
    rig.provider.fail_next(
        "complete", "refused", status_code=400, message="bad value", code="invalid_value", match=f"-{refused_row}"
    )
    types = rig.tick()
    job = rig.job()
    (failed,) = rig.events("PreflightFailed")
    assert failed["custom_id"] == _cid(rig, refused_row) and failed["row_code"] == "invalid_value"
    assert "PreflightUnreachable" not in types and job.ended == "failed" and job.error is not None
    assert [a["custom_id"] for a in job.preflight_answers] == [_cid(rig, 3)]  # row 3 was answered and paid: kept
    assert types.index("PreflightRowAnswered") < types.index("PreflightFailed")


@pytest.mark.parametrize("retry_after,wait", [(40.0, 40.0), (2.0, preflight_delay(1))])
def test_two_transient_rows_wait_for_the_longer_of_their_waits(rig, retry_after, wait):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.fail_next("complete", "refused", status_code=429, message="slow down", retry_after=retry_after, match="-1")
    rig.provider.fail_next("complete", "unavailable", match="-3")  # no Retry-After: the backoff
    assert rig.tick()[-1] == "PreflightUnreachable"
    job = rig.job()
    assert job.preflight_retry_at == pytest.approx(rig.now + wait) and "slow down" in (job.last_error or "")
    assert [a["custom_id"] for a in job.preflight_answers] == [_cid(rig, 2)]
    assert rig.tick(wait - 1) == []
    rig.tick(1)
    assert rig.job().preflight == "passed" and completes(rig).count(_cid(rig, 2)) == 1


def test_a_daemon_killed_after_the_intents_sends_those_rows_again_once(rig):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.answer = killed
    with pytest.raises(Killed):
        rig.tick()
    rows = [_cid(rig, n) for n in (1, 2, 3)]
    assert [e["rows"] for e in rig.events("PreflightRequested")] == [[r] for r in rows]  # every intent, no outcome
    assert rig.job().preflight_open == set(rows) and not rig.events("PreflightRowAnswered")
    rig.provider.answer = default_answer
    restart(rig)
    answered = ["PreflightRowAnswered", "TokensUsed"]
    assert rig.tick() == [*["PreflightRequested"] * 3, *answered * 3, "PreflightPassed", "JobPrepared", "RequestsReused"]
    assert completes(rig) == sorted(rows * 2)  # each row sent once more
    assert rig.job().preflight_resent == set(rows)
    assert len([u for u in rig.events("TokensUsed") if u["chunk"] == -1]) == 3


def test_rows_left_open_by_two_kills_go_in_the_batch(rig):
    write(rig, "a.csv", TEXTS[:6])
    rig.tick()
    rig.provider.answer = killed
    for _ in range(2):
        with pytest.raises(Killed):
            rig.tick()
        restart(rig)
    rig.provider.answer = default_answer
    assert rig.tick() == ["PreflightPassed", "JobPrepared"]  # nothing sent a third time; all 6 rows prepared for the batch
    assert rig.calls("complete") == 6 and rig.job().preflight_answers == []
    for _ in range(4):
        rig.tick()
        rig.provider.finish_all()
    job = rig.job()
    assert job.ended == "completed" and batch_rows(rig) == 6 and rig.calls("complete") == 6
    assert {r["answered_by"] for r in rig.result_rows()} == {"batch"}

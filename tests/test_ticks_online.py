"""The synchronous routes tick by tick (issue 32): a config edit never re-sends a row answered
online, every sample goes by the chosen route, a cancel stops the sending at once, and a
definite refusal fails its row at its first request.  In-memory provider, fake clock."""

from __future__ import annotations

import json

import pytest

from batchgrader.core.host.control_files import pending_controls, request_control
from batchgrader.daemon.control import apply_control
from batchgrader.pipeline.pricing import load_pricing, standard_price
from ticks import Rig

ONLINE = "route: online\nmodel: gpt-5.4-mini\nonline_concurrency: 1\n"


def drop(rig: Rig, rows: int, name: str = "a.csv") -> None:
    (rig.home.inbox / name).write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(rows)))


def controls(rig: Rig) -> None:
    """What the daemon does between ticks: apply the control requests ``bgctl`` queued."""
    for path in pending_controls(rig.home):
        assert apply_control(rig.engine, json.loads(path.read_text())) is None
        path.unlink()


def run_until_ended(rig: Rig, seconds: float = 1.0, ticks: int = 80) -> None:
    for _ in range(ticks):
        controls(rig)
        rig.tick(seconds)
        rig.provider.finish_all()
        if rig.engine.ctx.state.jobs and rig.job().ended:
            return
    raise AssertionError("the job did not end")


def billed_requests(rig: Rig) -> int:
    """Requests the provider answered and billed: synchronous ones, and the rows of batches."""
    batch_rows = sum(b.request_counts.completed for b in rig.provider.batches.values() if b.request_counts)
    return sum(1 for e in rig.events("OnlineRequestAnswered")) + batch_rows


@pytest.mark.parametrize("edit", ["system_prompt: Be strict.\n", "max_completion_tokens: 60\n", "model: gpt-4.1-nano\n"])
def test_a_config_edit_while_online_rows_are_sent_never_sends_an_answered_row_again(home, edit):
    rig = Rig(home, ONLINE)
    try:
        drop(rig, 20)
        # the provider asks to wait after the 10th request: the job is half sent when the edit comes
        rig.provider.fail_next("complete", "refused", status_code=429, message="slow down", retry_after=30.0, match="-11")
        rig.tick()
        rig.tick()
        assert len(rig.events("OnlineRequestAnswered")) == 10 and not rig.job().online.done
        rig.reconfigure(ONLINE + edit)
        run_until_ended(rig, seconds=5.0)
        job = rig.job()
        assert job.ended == "completed" and len(rig.result_rows()) == 20
        sent = [cid for cid, _ in rig.provider.complete_times]
        assert len(sent) == 21 and len(set(sent)) == 20  # each row once; one request refused (429)
        assert rig.calls("upload") == 0 and rig.calls("create_batch") == 0
        assert billed_requests(rig) == 20
        assert [r["answered_by"] for r in rig.result_rows()] == ["online"] * 20
    finally:
        rig.close()


def test_every_sample_of_every_row_goes_online_and_the_estimate_covers_them_all(home):
    rig = Rig(home, ONLINE + "samples: 3\nmax_completion_tokens: 1000\n")
    rig.provider.answer = lambda cid, body: "4"  # samples that agree: each row's vote has a majority
    try:
        drop(rig, 4)
        run_until_ended(rig)
        job = rig.job()
        assert job.ended == "completed"
        sent = sorted(cid for cid, _ in rig.provider.complete_times)
        assert len(sent) == len(set(sent)) == 12  # 4 rows x 3 samples, each once
        assert rig.calls("upload") == 0 and rig.calls("create_batch") == 0
        (chosen,) = rig.events("RouteChosen")
        price = standard_price(load_pricing().get("gpt-5.4-mini"))
        assert chosen["estimate_usd"]["max_output"] == pytest.approx(12 * 1000 * float(price.output_per_1m) / 1e6)
        rows = rig.result_rows()
        assert len(rows) == 4 and {r["answered_by"] for r in rows} == {"online"}
    finally:
        rig.close()


def test_a_cancel_while_online_rows_are_sent_stops_the_sending_and_nothing_is_paid_after_it(home):
    rig = Rig(home, ONLINE)
    answered: list[str] = []

    def answer(cid: str, body: dict) -> str:
        answered.append(cid)
        if len(answered) == 3:  # `bgctl cancel` while the step is sending
            request_control(rig.home, "cancel", rig.job().job_id, "stop")
        return f"SIMULATED {cid}"

    rig.provider.answer = answer
    try:
        drop(rig, 20)
        rig.tick()
        rig.tick()
        assert len(rig.provider.complete_times) == 3  # the step stopped at the cancel
        paid = billed_requests(rig)
        run_until_ended(rig)
        assert rig.job().ended == "cancelled"
        assert len(rig.provider.complete_times) == 3 and billed_requests(rig) == paid == 3
        assert rig.calls("upload") == 0 and rig.calls("create_batch") == 0
    finally:
        rig.close()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_a_definite_refusal_fails_its_row_at_the_first_request_with_its_message(home, status):
    """Not tried again, online or in a batch: the row fails at once, its message in the result."""
    from batchgrader.cli.render_status import rows_cell
    from batchgrader.store import queries

    rig = Rig(home, ONLINE)
    try:
        drop(rig, 3)
        rig.provider.fail_next("complete", "refused", status_code=status, message="the request is wrong", match="-2")
        run_until_ended(rig)
        tries = [cid for cid, _ in rig.provider.complete_times if cid.endswith("-2")]
        assert len(tries) == 1 and len(rig.provider.complete_times) == 3
        assert rig.calls("upload") == 0 and rig.calls("create_batch") == 0
        (failed,) = rig.events("OnlineRequestFailed")
        assert failed["final"] and failed["status_code"] == status and "the request is wrong" in failed["error"]
        assert failed["retry_at"] is None
        assert rig.job().ended == "completed_with_errors"
        (ended,) = rig.events("JobCompleted")
        assert (ended["succeeded"], ended["failed"]) == (2, 1)  # the refused row is failed, not answered too
        rows = rig.result_rows()
        assert [r["answered_by"] for r in rows] == ["online"] * 3
        assert "the request is wrong" in rows[1]["error"] and rows[1]["output_tokens"] in ("", "0")
        assert rig.events("OnlineRowsDone")[0]["to_batch"] == 0
        (row,) = queries.status(home)
        assert "reused" not in rows_cell(row) and row["failed"] == 1
    finally:
        rig.close()


def test_a_job_whose_every_row_the_provider_refused_fails(home):
    """Rows refused for good are failed rows, never answered ones: a job with nothing else ends
    ``failed`` (``all_rows_failed``), not ``completed_with_errors``."""
    rig = Rig(home, ONLINE)
    try:
        drop(rig, 2)
        for cid in ("-1", "-2"):
            rig.provider.fail_next("complete", "refused", status_code=400, message="the request is wrong", match=cid)
        run_until_ended(rig)
        job = rig.job()
        assert job.ended == "failed" and job.succeeded_rows == 0
        (failed,) = rig.events("JobFailed")
        assert failed["code"] == "all_rows_failed" and "the request is wrong" in failed["error"]
        assert rig.calls("upload") == 0 and rig.calls("create_batch") == 0
    finally:
        rig.close()


@pytest.mark.parametrize(
    ("kind", "details"),
    [("unavailable", {}), ("refused", {"status_code": 429, "retry_after": 2.0}), ("refused", {"status_code": 408})],
)
def test_a_transient_failure_is_tried_again_up_to_max_attempts(home, kind, details):
    from batchgrader.core.log.route_state import MAX_ATTEMPTS

    rig = Rig(home, ONLINE)
    try:
        drop(rig, 2)
        for _ in range(MAX_ATTEMPTS + 2):
            rig.provider.fail_next("complete", kind, match="-1", **details)
        for _ in range(60):
            rig.tick(5.0)
            if rig.engine.ctx.state.jobs and rig.job().online.done:
                break
        tries = [cid for cid, _ in rig.provider.complete_times if cid.endswith("-1")]
        assert len(tries) == MAX_ATTEMPTS
        fails = rig.events("OnlineRequestFailed")
        assert [f["final"] for f in fails] == [False] * (MAX_ATTEMPTS - 1) + [True]
    finally:
        rig.close()


@pytest.mark.parametrize("how", ["refused", "truncated"])
def test_bgctl_retry_sends_a_row_the_online_route_failed_in_a_batch(home, how):
    """``bgctl retry JOB`` (no new output bound) of a row failed on the route: its request, never
    planned into a batch at prepare, is planned now (it was refused at every tick before)."""
    rig = Rig(home, ONLINE)
    if how == "refused":
        rig.provider.fail_next("complete", "refused", status_code=400, message="the request is wrong", match="-2")
    else:
        rig.provider.finish_reason = lambda cid, body: "length" if cid.endswith("-2") else "stop"
    try:
        drop(rig, 3)
        run_until_ended(rig)
        job = rig.job()
        assert job.ended == "completed_with_errors" and rig.calls("create_batch") == 0
        rig.provider.finish_reason = lambda cid, body: "stop"
        request_control(rig.home, "retry", job.job_id, "fixed")
        for _ in range(20):
            controls(rig)
            rig.tick()
            rig.provider.finish_all()
            if rig.job().ended == "completed":
                break
        (retry,) = rig.events("RetryPlanned")
        assert retry["custom_ids"] == [f"bg-{job.sha256[:16]}-2"] and rig.job().ended == "completed"
        assert rig.calls("create_batch") == 1
    finally:
        rig.close()

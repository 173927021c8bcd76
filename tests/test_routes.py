"""The flex and online routes (issue 26, items 2, 3 and 5): the route keys checked at load, the
choice ``route: auto`` makes, and the synchronous route tick by tick with the in-memory provider
and a fake clock: rows answered once, Retry-After respected, a crash's request sent again once."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.core.configuration.routes import choose_route, deadline_at, deadline_problem, parse_deadline
from batchgrader.pipeline.catalogue import load_checked
from batchgrader.pipeline.pricing import billed_cost, load_pricing, standard_price
from batchgrader.store.eventstore import NewEvent
from ticks import Rig

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC).timestamp()


# --- the pure rules ---------------------------------------------------------------------------------
def test_a_deadline_is_a_duration_from_arrival_or_a_time_with_its_offset():
    assert deadline_at("90m", NOW) == NOW + 5400
    assert deadline_at("2h", NOW) == deadline_at("7200", NOW) == NOW + 7200
    assert deadline_at("2026-11-26T13:00:00Z", 0.0) == NOW + 3600
    assert deadline_at("2026-11-26T14:00:00+01:00", 0.0) == NOW + 3600
    assert deadline_at(None, NOW) is None
    for bad in ("soon", "2026-11-26T13:00:00", "-5m", True):
        with pytest.raises(ValueError):
            parse_deadline(bad)
    assert deadline_problem("2026-11-26T11:00:00Z", NOW) is not None  # past
    assert deadline_problem("2026-11-26T13:00:00Z", NOW) is None
    assert deadline_problem("1m", NOW) is None  # a duration is never past


def test_auto_goes_online_for_a_deadline_sooner_than_a_batch_and_flex_for_a_small_file():
    assert choose_route(40, 100, deadline=None, now=NOW, flex=True)[0] == "flex"
    assert choose_route(40, 100, deadline=None, now=NOW, flex=False)[0] == "online"
    assert choose_route(5000, 100, deadline=None, now=NOW, flex=True)[0] == "batch"
    assert choose_route(5000, 100, deadline=NOW + 3600, now=NOW, flex=True, batch_seconds=7200)[0] == "online"
    assert choose_route(5000, 100, deadline=NOW + 3 * 3600, now=NOW, flex=True, batch_seconds=7200)[0] == "batch"


# --- checked at load ---------------------------------------------------------------------------------
def _load(home, text: str):
    home.config_file.write_text(text)
    return load_checked(load_config(home, environ={}, now=NOW))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("profiles:\n  fast:\n    route: quick\n", ["profiles.fast", "'route'", "'online'"]),
        ("profiles:\n  f:\n    route: flex\n    model: gpt-4.1-nano\n", ["'f'", "'route'", "'gpt-4.1-nano' has no flex tier"]),
        (
            "profiles:\n  f:\n    route: flex\n    provider: anthropic\n    model: claude-haiku-4-5\n",
            ["'f'", "'route'", "provider 'anthropic' offers no flex tier"],
        ),
        ("profiles:\n  late:\n    deadline: '2026-11-26T11:00:00Z'\n", ["profiles.late", "'deadline'", "already past"]),
        ("profiles:\n  late:\n    deadline: tomorrow\n", ["profiles.late", "'deadline'", "duration"]),
    ],
)
def test_a_route_the_profile_cannot_take_is_refused_at_load_naming_profile_and_key(home, text, says):
    with pytest.raises(ConfigError) as err:
        _load(home, text)
    assert all(s in str(err.value) for s in says), str(err.value)


def test_flex_on_a_model_with_a_flex_tier_loads(home):
    config, _ = _load(home, "profiles:\n  f:\n    route: flex\n    model: o4-mini\n    deadline: 2h\n")
    assert config.profile("f").route == "flex" and config.profile("f").deadline == "2h"


# --- tick by tick ---------------------------------------------------------------------------------
def online_rig(home, route: str = "online", model: str = "gpt-5.4-mini", extra: str = "") -> Rig:
    return Rig(home, f"route: {route}\nmodel: {model}\nonline_concurrency: 1\n{extra}")


def drop(rig: Rig, rows: int) -> None:
    (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(rows)))


def run_until_ended(rig: Rig, seconds: float = 1.0, ticks: int = 60) -> None:
    for _ in range(ticks):
        rig.tick(seconds)
        if rig.engine.ctx.state.jobs and rig.job().ended:
            return
    raise AssertionError("the job did not end")


def test_online_rows_are_answered_once_each_at_the_standard_price_and_no_batch_is_sent(home):
    rig = online_rig(home)
    try:
        drop(rig, 5)
        run_until_ended(rig)
        assert rig.job().ended == "completed" and rig.calls("upload") == 0 and rig.calls("create_batch") == 0
        sent = [cid for cid, _ in rig.provider.complete_times]
        assert len(sent) == len(set(sent)) == 5
        assert rig.events("RouteChosen")[0]["route"] == "online"
        rows = rig.result_rows()
        assert [r["answered_by"] for r in rows] == ["online"] * 5 and all("SIMULATED" in r["grade"] for r in rows)
        price = standard_price(load_pricing().get("gpt-5.4-mini"))
        one = billed_cost(price, rig.provider.prompt_tokens, 0, rig.provider.completion_tokens)
        assert rig.job().cost_usd == pytest.approx(5 * one) and one > 0
        done = rig.events("OnlineRowsDone")[0]
        assert done == {"answered": 5, "to_batch": 0, "resent_after_crash": 0, "cost_usd": pytest.approx(5 * one)}
    finally:
        rig.close()


def test_flex_sends_service_tier_flex_and_costs_the_batch_price(home):
    bodies: list[dict] = []
    rig = online_rig(home, "flex", "o4-mini", "max_completion_tokens: 2000\n")
    rig.provider.answer = lambda cid, body: bodies.append(dict(body)) or f"SIMULATED {cid}"
    try:
        drop(rig, 3)
        run_until_ended(rig)
        assert [b.get("service_tier") for b in bodies] == ["flex"] * 3
        one = billed_cost(load_pricing().get("o4-mini"), rig.provider.prompt_tokens, 0, rig.provider.completion_tokens)
        assert rig.job().cost_usd == pytest.approx(3 * one)
        assert [r["answered_by"] for r in rig.result_rows()] == ["flex"] * 3
    finally:
        rig.close()


def test_a_429_with_retry_after_holds_every_request_until_it_has_passed(home):
    rig = online_rig(home)
    try:
        drop(rig, 4)
        rig.provider.fail_next("complete", "refused", status_code=429, message="Rate limit reached", retry_after=30.0)
        run_until_ended(rig, seconds=1.0)
        times = rig.provider.complete_times
        refused_at = times[0][1]
        assert all(t >= refused_at + 30.0 for _, t in times[1:])  # none before Retry-After allowed
        assert times[1][0] == times[0][0]  # the refused row is sent again first
        sent = [cid for cid, _ in times]
        assert len(sent) == 5 and len(set(sent)) == 4  # each row answered once; one request refused
        failed = rig.events("OnlineRequestFailed")[0]
        assert failed["code"] == "rate_limited" and failed["status_code"] == 429 and not failed["final"]
        assert failed["retry_at"] >= refused_at + 30.0 - 1.0
        assert rig.job().ended == "completed"
    finally:
        rig.close()


def test_a_row_whose_requests_keep_being_refused_is_sent_in_the_batch_after_the_last_attempt(home):
    rig = online_rig(home)
    try:
        drop(rig, 2)
        for _ in range(4):
            rig.provider.fail_next("complete", "refused", status_code=429, message="slow down", retry_after=5.0, match="-1")
        for _ in range(30):
            rig.tick(6.0)
            if rig.calls("upload"):
                break
        fails = [f for f in rig.events("OnlineRequestFailed")]
        assert len(fails) == 4 and fails[-1]["final"] and not any(f["final"] for f in fails[:-1])
        assert rig.events("OnlineRowsDone")[0]["to_batch"] == 1
        rig.tick()
        rig.provider.finish_all()
        run_until_ended(rig)
        by = sorted(r["answered_by"] for r in rig.result_rows())
        assert by == ["batch", "online"]
    finally:
        rig.close()


def _stopped_after_the_first_request(rig: Rig, rows: int) -> str:
    """Drop a file; its first request finds the provider unavailable (the step stops there).
    Returns the custom id of its second row."""
    drop(rig, rows)
    rig.provider.fail_next("complete", "unavailable")
    rig.tick()  # first look
    rig.tick()
    assert [e["code"] for e in rig.events("OnlineRequestFailed")] == ["outcome_unknown"]
    return f"bg-{rig.job().sha256[:16]}-2"


def _open_intent(rig: Rig, cid: str, attempt: int, resent: bool) -> None:
    """The intent a daemon killed while the request was out leaves without an outcome."""
    payload = {"custom_id": cid, "tier": "online", "attempt": attempt, "resent_after_crash": resent}
    rig.engine.ctx.emit(rig.job().job_id, NewEvent("OnlineRequestSent", payload))


def test_a_request_a_crash_left_without_outcome_is_sent_again_once_and_counted(home):
    rig = online_rig(home)
    try:
        cid = _stopped_after_the_first_request(rig, 3)
        _open_intent(rig, cid, 1, False)
        before = len(rig.provider.complete_times)
        run_until_ended(rig)
        sent = [c for c, _ in rig.provider.complete_times[before:]]
        assert sent.count(cid) == 1 and len(sent) == 3  # the uncertain one once more, the others once
        resent = [e for e in rig.events("OnlineRequestSent") if e["resent_after_crash"]]
        assert [(e["custom_id"], e["attempt"]) for e in resent] == [(cid, 2)]
        assert rig.events("OnlineRowsDone")[0]["resent_after_crash"] == 1
        assert rig.job().ended == "completed" and len(rig.result_rows()) == 3
    finally:
        rig.close()


def test_a_request_left_uncertain_by_two_crashes_is_not_sent_a_third_time(home):
    rig = online_rig(home)
    try:
        cid = _stopped_after_the_first_request(rig, 3)
        _open_intent(rig, cid, 1, False)
        _open_intent(rig, cid, 2, True)
        before = len(rig.provider.complete_times)
        rig.provider.finish_all()
        for _ in range(20):
            rig.tick(2.0)
            if rig.calls("upload"):
                break
        assert cid not in [c for c, _ in rig.provider.complete_times[before:]]
        failed = [f for f in rig.events("OnlineRequestFailed") if f["custom_id"] == cid]
        assert failed[0]["code"] == "outcome_unknown" and failed[0]["final"]
        assert rig.events("OnlineRowsDone")[0]["to_batch"] == 1
    finally:
        rig.close()


# --- the decide rule -----------------------------------------------------------------------------
def _accepted(rig: Rig) -> str:
    (rig.home.inbox / "a.csv").write_text("id,response\n1,x\n2,y\n")
    rig.tick()
    rig.engine.intake(rig.now + 1)  # accepted, not yet prepared
    (job,) = rig.engine.ctx.state.jobs.values()
    return job.job_id


@pytest.mark.parametrize("route", ["online", "auto"])
def test_a_sync_or_auto_job_sends_online_before_it_is_prepared_and_waits_for_retry_after(home, route):
    from batchgrader.core.rules.actions import ONLINE_TIMER
    from batchgrader.core.rules.decide import Prepare, SendOnline, Timers, decide

    rig = Rig(home, f"route: {route}\npreflight_rows: 3\n")
    try:
        j = _accepted(rig)
        state, cfg = rig.engine.ctx.state, rig.engine.ctx.config
        assert decide(state, cfg, rig.now) == [SendOnline(j)] and SendOnline.ends_step
        # the provider's Retry-After, on the monotonic clock: nothing until it has passed
        assert decide(state, cfg, rig.now, Timers(not_before={(j, ONLINE_TIMER): rig.now + 5})) == []
        assert decide(state, cfg, rig.now + 6, Timers(not_before={(j, ONLINE_TIMER): rig.now + 5})) == [SendOnline(j)]
        # after a restart (no timer): the wall-clock retry_at its event recorded
        fail = {"custom_id": "c", "code": "rate_limited", "error": "x", "status_code": 429, "final": False}
        rig.engine.ctx.emit(j, NewEvent("OnlineRequestFailed", {**fail, "retry_at": rig.now + 5}))
        assert decide(rig.engine.ctx.state, cfg, rig.now) == []
        assert decide(rig.engine.ctx.state, cfg, rig.now + 6) == [SendOnline(j)]
        # done: prepared, without a preflight (every row went through the synchronous API)
        rig.engine.ctx.emit(j, NewEvent("RouteChosen", {"route": "online", "reason": "test", "rows": 2}))
        rig.engine.ctx.emit(
            j, NewEvent("OnlineRowsDone", {"answered": 2, "to_batch": 0, "resent_after_crash": 0, "cost_usd": 0.0})
        )
        assert decide(rig.engine.ctx.state, cfg, rig.now + 6) == [Prepare(j)]
    finally:
        rig.close()


def test_auto_choosing_batch_leaves_the_job_to_the_preflight_and_prepare(home):
    from batchgrader.core.rules.decide import Preflight, decide

    rig = Rig(home, "route: auto\npreflight_rows: 3\n")
    try:
        j = _accepted(rig)
        rig.engine.ctx.emit(j, NewEvent("RouteChosen", {"route": "batch", "reason": "test", "rows": 2}))
        assert decide(rig.engine.ctx.state, rig.engine.ctx.config, rig.now) == [Preflight(j)]
    finally:
        rig.close()


# --- visible route and price -----------------------------------------------------------------------
def test_status_costs_and_the_report_show_rows_and_cost_by_route(home):
    from rich.console import Console

    from batchgrader.cli.render_job import render_job
    from batchgrader.reports.report import load_report
    from batchgrader.reports.report_text import render_text
    from batchgrader.store import costs as costs_mod
    from batchgrader.store import queries

    rig = online_rig(home)
    try:
        drop(rig, 3)
        for _ in range(4):  # a row the provider keeps failing to answer (5xx) goes in the batch after its last attempt
            rig.provider.fail_next("complete", "unavailable", match="-3")
        for _ in range(30):
            rig.tick(5.0)
            if rig.calls("create_batch"):
                break
        rig.provider.finish_all()
        run_until_ended(rig)
        job = rig.job()
        online_cost = sum(e["cost_usd"] for e in rig.events("OnlineRequestAnswered"))
        detail = queries.job_detail(home, job.job_id)
        route = detail["route_summary"]
        assert route["route"] == "online" and route["rows"] == {"batch": 1, "flex": 0, "online": 2}
        assert route["cost_usd"]["online"] == pytest.approx(online_cost) and route["to_batch"] == 1
        console = Console(record=True, width=160)
        render_job(detail, console)
        shown = console.export_text()
        assert "online 2 rows" in shown and "batch 1 rows" in shown
        assert "reused answers" not in shown  # the route's answers were sent and billed, not reused
        by_route = {r["key"]: r for r in costs_mod.costs(home, by="route")["rows"]}
        assert set(by_route) == {"online", "batch"} and by_route["online"]["batches"] == 0
        assert by_route["online"]["requests"] == 2 and by_route["batch"]["batches"] == 1
        assert by_route["online"]["simulated_usd"] + by_route["online"]["cost_usd"] == pytest.approx(online_cost)
        report = load_report(home, job.job_id)
        assert report["route"] == route and "route     online: online 2 rows" in render_text(report)
    finally:
        rig.close()


def test_online_answers_are_stored_for_reuse_and_a_second_file_sends_none_of_them(home):
    rig = online_rig(home)
    try:
        body = "id,response\n" + "".join(f"{i},review {i}\n" for i in range(3))
        (rig.home.inbox / "a.csv").write_text(body)
        run_until_ended(rig)
        assert len(rig.provider.complete_times) == 3
        (rig.home.inbox / "b.csv").write_text(body + "3,review 3\n")  # three rows answered before, one new
        for _ in range(30):
            rig.tick(5.0)  # the inbox is scanned again every few seconds
            second = [j for j in rig.engine.ctx.state.jobs.values() if j.file == "b.csv"]
            if second and second[0].ended:
                break
        assert second[0].ended == "completed"
        assert len(rig.provider.complete_times) == 4  # only the new row was sent
        rows = rig.result_rows("b_results.csv")
        assert sorted(r["answered_by"] for r in rows) == ["online", "reused", "reused", "reused"]
    finally:
        rig.close()


@pytest.mark.parametrize(
    ("rows", "extra", "route"),
    [
        (3, "model: gpt-4.1-nano\n", "online"),  # a model without a flex tier
        (3, "", "flex"),  # the default model has one: the same rows go flex, at the batch price
        (8, "", "batch"),
        (8, "model: gpt-4.1-nano\ndeadline: 30m\n", "online"),
        (3, "model: o4-mini\nmax_completion_tokens: 2000\n", "flex"),
    ],
)
def test_auto_chooses_by_rows_and_deadline_and_records_why(home, rows, extra, route):
    rig = Rig(home, "route: auto\nonline_max_rows: 5\nonline_concurrency: 2\n" + extra)
    try:
        drop(rig, rows)
        rig.tick()
        rig.tick()
        (chosen,) = rig.events("RouteChosen")
        assert chosen["route"] == route and chosen["rows"] == rows and chosen["reason"]
        assert (rig.calls("complete") == rows) == (route != "batch")
    finally:
        rig.close()


def test_the_job_list_shows_the_rows_each_route_answered(home):
    from batchgrader.cli.render_status import rows_cell
    from batchgrader.store import queries

    rig = online_rig(home)
    try:
        drop(rig, 3)
        run_until_ended(rig)
        (row,) = queries.status(home)
        assert row["route_summary"]["route"] == "online" and row["route_summary"]["rows"]["online"] == 3
        assert rows_cell(row).splitlines() == ["3 ok/3", "3 online"]  # not "reused": they were sent and billed
    finally:
        rig.close()


def _retry(rig: Rig, job_id: str) -> None:
    rig.engine.ctx.emit(job_id, NewEvent("RetryRequested", {"reason": "test"}))  # `bgctl retry`: send anyway


def test_a_sync_route_job_over_max_cost_per_job_is_held_before_any_request_leaves(home):
    """The synchronous route skips prepare (where a batch job's estimate is made): its rows are
    priced at the route's price when it is chosen, and the budget weighs that first."""
    rig = online_rig(home, extra="max_cost_per_job_usd: 0.001\nmax_completion_tokens: 1000\n")
    try:
        drop(rig, 5)  # 5 rows x 1,000 output tokens at gpt-5.4-mini's standard $4.50/1M: over $0.02
        for _ in range(5):
            rig.tick()
        job = rig.job()
        assert rig.provider.complete_times == [] and job.held and job.held["code"] == "max_cost_per_job_usd"
        (chosen,) = rig.events("RouteChosen")
        assert chosen["route"] == "online" and chosen["estimate_usd"]["max_output"] == pytest.approx(5 * 1000 * 4.50 / 1e6)
        assert chosen["estimate_usd"]["input"] > 0
        _retry(rig, job.job_id)
        run_until_ended(rig)
        assert len(rig.provider.complete_times) == 5 and rig.job().ended == "completed"
    finally:
        rig.close()


def test_a_sync_route_job_within_its_budget_sends_in_the_tick_that_chose_its_route(home):
    rig = online_rig(home, extra="max_cost_per_job_usd: 1.0\n")
    try:
        drop(rig, 2)
        rig.tick()
        rig.tick()
        assert rig.events("RouteChosen") and len(rig.provider.complete_times) >= 1 and not rig.job().held
    finally:
        rig.close()


def test_two_sync_jobs_together_over_the_daily_limit_do_not_both_send(home):
    """A job sending on its synchronous route has committed its estimate: a second job whose own
    estimate would fit today's limit, but not on top of the first's, is held until it has sent."""
    rig = online_rig(home, extra="daily_cost_limit_usd: 0.002\nmax_completion_tokens: 1000\n")  # 2 rows: ~$0.0012 each job
    try:
        drop(rig, 2)
        rig.provider.fail_next("complete", "refused", status_code=429, message="Rate limit reached", retry_after=600.0)
        rig.tick()
        rig.tick()
        first = rig.job()
        assert first.online.route == "online" and not first.online.done and not first.held
        (rig.home.inbox / "b.csv").write_text("id,response\n7,other text\n8,more text\n")
        for _ in range(12):
            rig.tick(5.0)
        (second,) = [j for j in rig.engine.ctx.state.jobs.values() if j.file == "b.csv"]
        assert second.held and second.held["code"] == "daily_cost_limit_usd"
        assert {cid for cid, _ in rig.provider.complete_times} <= set(first.online.attempts)  # none of the second's rows sent
    finally:
        rig.close()


def test_a_sync_route_job_waits_while_todays_spend_is_over_the_daily_limit(home):
    rig = online_rig(home, extra="daily_cost_limit_usd: 0.0000001\n")
    try:
        drop(rig, 2)
        for _ in range(3):
            rig.tick()
        assert rig.job().held and rig.job().held["code"] == "daily_cost_limit_usd"  # its estimate alone is over
        assert rig.provider.complete_times == []
        _retry(rig, rig.job().job_id)
        run_until_ended(rig)
        assert len(rig.provider.complete_times) == 2
        (rig.home.inbox / "b.csv").write_text("id,response\n7,other text\n")
        for _ in range(12):
            rig.tick(5.0)
        (second,) = [j for j in rig.engine.ctx.state.jobs.values() if j.file == "b.csv"]
        assert second.held and second.held["code"] == "daily_cost_limit_usd"
        assert len(rig.provider.complete_times) == 2  # nothing sent while held
        _retry(rig, second.job_id)
        for _ in range(5):
            rig.tick()
        assert len(rig.provider.complete_times) == 3 and rig.engine.ctx.state.jobs[second.job_id].ended == "completed"
    finally:
        rig.close()


def test_a_truncated_sync_answer_is_billed_and_fails_its_row_without_being_sent_again_in_a_batch(home):
    """A sync answer cut off by the output bound is paid for; sending it again in a batch with the
    same bound would pay again for the same cut (a batch never resends a truncated row by itself)."""
    rig = online_rig(home)
    rig.provider.finish_reason = lambda cid, body: "length" if cid.endswith("-2") else "stop"
    try:
        drop(rig, 4)
        run_until_ended(rig)
        job = rig.job()
        assert rig.calls("upload") == 0 and rig.calls("create_batch") == 0  # nothing paid twice
        assert [cid for cid, _ in rig.provider.complete_times] == sorted({cid for cid, _ in rig.provider.complete_times})
        assert len(rig.provider.complete_times) == 4
        assert job.ended == "completed_with_errors"
        ((truncated_cid, failed),) = job.failed_rows.items()
        assert failed["code"] == "truncated"
        price = standard_price(load_pricing().get("gpt-5.4-mini"))
        one = billed_cost(price, rig.provider.prompt_tokens, 0, rig.provider.completion_tokens)
        assert job.cost_usd == pytest.approx(4 * one)  # the truncated answer's tokens are on the bill
        rows = rig.result_rows()
        assert [r["error"].split(":")[0] for r in rows] == ["", "truncated", "", ""]  # data row 2
        assert rows[1]["answered_by"] == "online" and int(rows[1]["output_tokens"]) > 0
        assert not rig.events("AnswersStored") or all(
            "-2" not in str(e) for e in rig.events("AnswersStored")
        )  # never kept for reuse
        from batchgrader.core.host.control_files import request_control
        from batchgrader.daemon.control import apply_control

        path = request_control(rig.home, "retry", job.job_id, "raise the bound", max_completion_tokens=800)  # bgctl retry
        assert apply_control(rig.engine, json.loads(path.read_text())) is None
        rig.provider.finish_reason = lambda cid, body: "stop"
        for _ in range(30):
            rig.tick(1.0)
            rig.provider.finish_all()
            if rig.job().ended:
                break
        (retry,) = rig.events("RetryPlanned")
        assert retry["custom_ids"] == [truncated_cid] and rig.job().ended == "completed"
        (second,) = [p.name for p in rig.home.outbox.glob("a_results*.csv") if p.name != "a_results.csv"]
        assert [r["error"] for r in rig.result_rows(second)] == [""] * 4
    finally:
        rig.close()

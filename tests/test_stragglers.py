"""Stragglers (issue 26, item 4): with a ``deadline``, a batch still running when the deadline
nears is cancelled, its partial output merged, and the rows it did not answer finished through the
synchronous route, tick by tick with the in-memory provider and a fake clock."""

from __future__ import annotations

import pytest

from batchgrader.cli.render_status import route_line
from batchgrader.core.log.route_state import route_summary
from batchgrader.core.rules.actions import CancelBatch, PlanStragglers, SendStragglers, Timers
from batchgrader.core.rules.decide import decide
from batchgrader.core.rules.stragglers import MAX_MARGIN_SECONDS, MIN_MARGIN_SECONDS, REQUEST_SECONDS, margin, past_cutoff
from batchgrader.pipeline.pricing import billed_cost, load_pricing, standard_price
from batchgrader.provider.pool import Providers
from batchgrader.store.eventstore import NewEvent
from ticks import Rig

HOUR = 3600.0


def deadline_config(model: str = "gpt-4.1-nano", extra: str = "") -> str:
    return f"deadline: 1h\nmodel: {model}\nonline_concurrency: 2\nmax_row_retries: 2\n{extra}"


def rig_with_deadline(home, model: str = "gpt-4.1-nano", extra: str = "") -> Rig:
    return Rig(home, deadline_config(model, extra))


def running(rig: Rig, rows: int) -> tuple[str, float]:
    """Drop a file and tick until its batch runs; (the batch id, when the job is due)."""
    job = rig.drop(rows)
    assert job.deadline_at == pytest.approx(rig.now + HOUR, abs=5.0)
    rig.tick()
    (c,) = rig.job().chunks.values()
    assert c.in_flight and c.batch_id
    return c.batch_id, float(rig.job().deadline_at or 0.0)


def tick_to(rig: Rig, when: float) -> list[str]:
    return rig.tick(when - rig.now)


def run_until_ended(rig: Rig, ticks: int = 60) -> None:
    for _ in range(ticks):
        rig.tick(1.0)
        if rig.job().ended:
            return
    raise AssertionError(f"the job did not end: {rig.job().state}")


# --- the pure rules ---------------------------------------------------------------------------------
def test_the_margin_is_the_synchronous_routes_time_for_the_rows_at_least_a_few_minutes():
    assert margin(6, 2) == MIN_MARGIN_SECONDS
    assert margin(400, 4) == 100 * REQUEST_SECONDS > MIN_MARGIN_SECONDS
    assert margin(0, 4) == MIN_MARGIN_SECONDS
    assert margin(50_000, 4) == MAX_MARGIN_SECONDS  # a large batch is given until an hour before


def test_a_running_batch_is_cancelled_only_once_the_deadline_is_within_the_margin(home):
    rig = rig_with_deadline(home)
    try:
        batch, due = running(rig, 6)
        j = rig.job().job_id
        state, cfg = rig.engine.ctx.state, rig.engine.ctx.config
        before = decide(state, cfg, due - MIN_MARGIN_SECONDS - 1.0)
        assert not [a for a in before if isinstance(a, CancelBatch)]
        (cancel,) = [a for a in decide(state, cfg, due - MIN_MARGIN_SECONDS) if isinstance(a, CancelBatch)]
        assert (cancel.job_id, cancel.chunk, cancel.batch_id) == (j, 0, batch)
        assert "deadline" in cancel.reason and "6 unanswered rows" in cancel.reason
        # once its cancel was sent (this process), not again
        assert not [a for a in decide(state, cfg, due, Timers(cancel_sent={batch})) if isinstance(a, CancelBatch)]
        assert not past_cutoff(rig.job(), due - MIN_MARGIN_SECONDS - 1.0) and past_cutoff(rig.job(), due)
    finally:
        rig.close()


def test_a_job_without_a_deadline_keeps_its_batch(home):
    rig = Rig(home, "model: gpt-5.4-mini\n")
    try:
        rig.drop(3)
        rig.tick()
        assert rig.job().deadline_at is None
        assert not [
            a for a in decide(rig.engine.ctx.state, rig.engine.ctx.config, rig.now + 30 * 86400) if isinstance(a, CancelBatch)
        ]
    finally:
        rig.close()


# --- tick by tick ---------------------------------------------------------------------------------
def test_deadline_nears_the_batch_is_cancelled_its_partial_output_merged_and_the_rest_answered_online(home):
    rig = rig_with_deadline(home)
    try:
        batch, due = running(rig, 6)
        rig.tick(HOUR - MIN_MARGIN_SECONDS - 60.0)
        assert rig.provider.batches[batch].status != "cancelling"
        types = tick_to(rig, due - MIN_MARGIN_SECONDS)
        assert "StragglerCancelRequested" in types
        assert rig.provider.batches[batch].status == "cancelling" and rig.calls("cancel") == 1
        (why,) = rig.events("StragglerCancelRequested")
        assert why["batch_id"] == batch and why["deadline_at"] == pytest.approx(due) and "deadline" in why["reason"]
        rig.provider.finish(batch, "cancelled", answered=2)  # the provider ended it with a partial output
        run_until_ended(rig)
        job = rig.job()
        assert job.ended == "completed" and job.succeeded_rows == 6
        (planned,) = rig.events("RetryPlanned")
        assert planned["route"] == "online" and len(planned["custom_ids"]) == 4
        sent = [cid for cid, _ in rig.provider.complete_times]
        assert len(sent) == len(set(sent)) == 4 and not set(sent) & set(_answered_in_batch(rig))
        assert rig.calls("create_batch") == 1  # the rest went synchronously, not in a new batch
        rows = rig.result_rows()
        assert sorted(r["answered_by"] for r in rows) == ["batch"] * 2 + ["online"] * 4
        assert all("SIMULATED" in r["grade"] for r in rows)
        price = load_pricing().get("gpt-4.1-nano")
        p, c = rig.provider.prompt_tokens, rig.provider.completion_tokens
        batch_cost = billed_cost(price, 2 * p, 0, 2 * c)
        online_cost = 4 * billed_cost(standard_price(price), p, 0, c)
        assert job.cost_usd == pytest.approx(batch_cost + online_cost)  # no row paid twice
        summary = route_summary(job)
        assert summary["rows"] == {"batch": 2, "flex": 0, "online": 4}
        assert summary["stragglers"] == 1 and summary["straggler_rows"] == 4
        assert summary["cost_usd"]["online"] == pytest.approx(online_cost)
        line = route_line(summary) or ""
        assert "online 4 rows" in line and "batch 2 rows" in line and "1 batch(es) cancelled as the deadline neared" in line
        from batchgrader.store.queries import status

        (listed,) = status(home)  # bgctl status: the read model's route column
        assert (listed.get("route_summary") or {}).get("stragglers") == 1
    finally:
        rig.close()


def _answered_in_batch(rig: Rig) -> list[str]:
    return [r["id"] for r in rig.result_rows() if r["answered_by"] == "batch"]


def test_on_a_model_with_a_flex_tier_the_rest_goes_flex_at_the_batch_price(home):
    bodies: list[dict] = []
    rig = rig_with_deadline(home, "o4-mini", "max_completion_tokens: 2000\n")
    rig.provider.answer = lambda cid, body: bodies.append(dict(body)) or f"SIMULATED {cid}"
    try:
        batch, due = running(rig, 4)
        tick_to(rig, due - MIN_MARGIN_SECONDS)
        rig.provider.finish(batch, "cancelled", answered=1)
        run_until_ended(rig)
        assert rig.events("RetryPlanned")[0]["route"] == "flex"
        assert [b.get("service_tier") for b in bodies[-3:]] == ["flex"] * 3
        assert sorted(r["answered_by"] for r in rig.result_rows()) == ["batch", "flex", "flex", "flex"]
        price = load_pricing().get("o4-mini")
        one = billed_cost(price, rig.provider.prompt_tokens, 0, rig.provider.completion_tokens)
        assert rig.job().cost_usd == pytest.approx(4 * one)  # flex at the Batch price, like the batch row
    finally:
        rig.close()


def test_a_cancel_that_could_not_be_sent_is_sent_again_and_its_reason_recorded_once(home):
    rig = rig_with_deadline(home)
    try:
        batch, due = running(rig, 3)
        rig.provider.fail_next("cancel", "unavailable")
        tick_to(rig, due - MIN_MARGIN_SECONDS)
        assert rig.provider.batches[batch].status != "cancelling"
        rig.tick()
        assert rig.provider.batches[batch].status == "cancelling"
        assert len(rig.events("StragglerCancelRequested")) == 1
    finally:
        rig.close()


def _restart(rig: Rig, home) -> Rig:
    """A new process over the same log and provider: state folded from the log, timers fresh."""
    provider, now = rig.provider, rig.now
    rig.close()
    again = Rig(home, deadline_config())
    again.provider = provider
    again.engine.ctx.providers = Providers.of(provider)
    again.now = now
    return again


def test_a_crash_between_the_cancel_and_the_synchronous_sends_sends_each_row_once_the_open_one_again_once(home):
    rig = rig_with_deadline(home)
    try:
        batch, due = running(rig, 4)
        tick_to(rig, due - MIN_MARGIN_SECONDS)
        rig.provider.finish(batch, "cancelled", answered=1)
        state, cfg = rig.engine.ctx.state, rig.engine.ctx.config
        for _ in range(10):  # collected and planned; stop before the first synchronous send
            if any(isinstance(a, SendStragglers) for a in decide(state, cfg, rig.now + 1.0)):
                break
            rig.tick()
        (planned,) = rig.events("RetryPlanned")
        assert not rig.provider.complete_times and not any(
            isinstance(a, PlanStragglers) for a in decide(state, cfg, rig.now + 1.0)
        )
        uncertain = planned["custom_ids"][0]
        # the daemon was killed with this request out: its intent has no outcome
        payload = {"custom_id": uncertain, "tier": "online", "attempt": 1, "resent_after_crash": False}
        rig.engine.ctx.emit(rig.job().job_id, NewEvent("OnlineRequestSent", payload))
        rig = _restart(rig, home)
        run_until_ended(rig)
        sent = [cid for cid, _ in rig.provider.complete_times]
        assert sorted(sent) == sorted(planned["custom_ids"])  # the uncertain one sent again once, each other once
        resent = [e for e in rig.events("OnlineRequestSent") if e["resent_after_crash"]]
        assert [(e["custom_id"], e["attempt"]) for e in resent] == [(uncertain, 2)]
        job = rig.job()
        assert job.ended == "completed" and route_summary(job)["resent_after_crash"] == 1
        assert sorted(r["answered_by"] for r in rig.result_rows()) == ["batch", "online", "online", "online"]
    finally:
        rig.close()


def test_past_the_deadline_a_row_the_synchronous_route_could_not_answer_fails_visibly_and_the_job_ends(home):
    rig = rig_with_deadline(home)
    try:
        batch, due = running(rig, 3)
        tick_to(rig, due - MIN_MARGIN_SECONDS)
        rig.provider.finish(batch, "cancelled", answered=1)
        stuck = f"bg-{rig.job().sha256[:16]}-3"
        for _ in range(4):
            rig.provider.fail_next("complete", "refused", status_code=429, message="slow down", retry_after=1.0, match=stuck)
        for _ in range(60):
            rig.tick(2.0)
            if rig.job().ended:
                break
        job = rig.job()
        assert job.ended == "completed_with_errors" and job.succeeded_rows == 2
        assert rig.calls("create_batch") == 1  # not sent again in a batch: past the cutoff
        assert job.failed_rows[stuck]["code"] == "rate_limited"
        (row,) = [r for r in rig.result_rows() if r["error"]]
        assert row["error"].startswith("rate_limited")
    finally:
        rig.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_against_the_emulator_a_straggler_is_cancelled_and_its_rest_answered_online(home):
    """``bgctl daemon --once`` over real HTTP: a batch running past ``deadline - margin`` (the
    deadline 310 s from arrival, the margin 300 s: ~10 s in, part of its rows answered) is
    cancelled, its partial output merged and the rest answered online; every row answered once."""
    import csv
    import io

    from batchgrader.core.log.state import fold
    from batchgrader.emulator import Emulator, EmulatorConfig
    from batchgrader.store.eventstore import EventStore
    from harness import FAST_CONFIG, TEST_KEY, bgctl

    home.config_file.write_text(FAST_CONFIG + "deadline: 310s\nonline_concurrency: 4\nmodel: gpt-4.1-nano\n")
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(10)))
    with Emulator(EmulatorConfig(api_key=TEST_KEY, validating_s=0.5, in_progress_s=20.0)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url, timeout=150).returncode == 0
        assert emu.batches_created() == 1
    with EventStore(home.db, readonly=True) as s:
        events = list(s.read())
    (job,) = fold(events).jobs.values()
    assert job.ended == "completed" and job.succeeded_rows == 10
    assert [e.type for e in events].count("StragglerCancelRequested") == 1
    answered = [e.payload["custom_id"] for e in events if e.type == "OnlineRequestAnswered"]
    assert len(answered) == len(set(answered)) >= 1
    cancelled = [e.payload for e in events if e.type == "ChunkCompleted" and e.payload["status"] == "cancelled"]
    assert len(cancelled) == 1 and cancelled[0]["succeeded"] >= 1  # its partial output merged
    rows = list(csv.DictReader(io.StringIO((home.outbox / "a_results.csv").read_text(encoding="utf-8"))))
    by = [r["answered_by"] for r in rows]
    assert len(rows) == 10 and all(r["error"] == "" for r in rows)
    assert by.count("online") == len(answered) and by.count("batch") == 10 - len(answered)


def test_a_crash_after_the_cancels_reason_was_recorded_sends_the_cancel_on_restart_without_a_second_record(home):
    rig = rig_with_deadline(home)
    try:
        batch, due = running(rig, 3)
        reason = {"chunk": 0, "batch_id": batch, "deadline_at": due, "margin_seconds": 300.0, "reason": "test"}
        rig.engine.ctx.emit(rig.job().job_id, NewEvent("StragglerCancelRequested", reason))  # killed before the cancel left
        rig.now = due - MIN_MARGIN_SECONDS
        rig = _restart(rig, home)
        rig.tick()
        assert rig.provider.batches[batch].status == "cancelling" and rig.calls("cancel") == 1
        assert len(rig.events("StragglerCancelRequested")) == 1
    finally:
        rig.close()


def test_a_duplicate_row_takes_its_leaders_synchronous_answer_and_is_not_sent(home):
    rig = rig_with_deadline(home)
    try:
        (rig.home.inbox / "a.csv").write_text("id,response\n0,same\n1,same\n2,other\n3,more\n")
        rig.tick()
        assert rig.tick()[:2] == ["JobAccepted", "JobPrepared"]
        assert rig.job().duplicate_rows == 1
        rig.tick()
        (c,) = rig.job().chunks.values()
        tick_to(rig, float(rig.job().deadline_at or 0.0) - MIN_MARGIN_SECONDS)
        rig.provider.finish(c.batch_id or "", "cancelled", answered=0)
        run_until_ended(rig)
        assert rig.job().ended == "completed" and rig.job().succeeded_rows == 4
        sent = [cid for cid, _ in rig.provider.complete_times]
        assert len(sent) == len(set(sent)) == 3  # the duplicate rides with its leader
        by = {r["id"]: r["answered_by"] for r in rig.result_rows()}
        assert by == {"0": "online", "1": "duplicate", "2": "online", "3": "online"}
        rows = {r["id"]: r for r in rig.result_rows()}
        assert rows["1"]["grade"] == rows["0"]["grade"] and all(r["error"] == "" for r in rows.values())
    finally:
        rig.close()


def test_a_chunk_still_unsent_when_the_deadline_nears_goes_synchronously_without_a_batch(home):
    """Two chunks and room for one batch: the second is still waiting when the deadline comes
    within the synchronous route's time for its rows. A batch created then would only be
    cancelled as a straggler; its rows go online at once instead, and only one batch is created."""
    rig = rig_with_deadline(home, extra="max_simultaneous_batches: 1\nmax_requests_per_batch: 3\n")
    try:
        job = rig.drop(6)
        due = float(job.deadline_at or 0.0)
        rig.tick()
        first, second = sorted(rig.job().chunks.values(), key=lambda c: c.index)
        assert first.in_flight and not second.in_flight and second.upload == "none"
        tick_to(rig, due - MIN_MARGIN_SECONDS)
        (routed,) = rig.events("ChunkRouted")
        assert routed["chunk"] == second.index and routed["route"] == "online" and "not sent yet" in routed["reason"]
        rig.provider.finish(first.batch_id or "", "cancelled", answered=1)  # the running one: a straggler
        run_until_ended(rig)
        assert rig.job().ended == "completed" and rig.job().succeeded_rows == 6
        assert rig.calls("create_batch") == 1  # the unsent chunk never became a batch
        sent = [cid for cid, _ in rig.provider.complete_times]
        assert len(sent) == len(set(sent)) == 5  # its 3 rows and the straggler's 2 unanswered, each once
        assert sorted(r["answered_by"] for r in rig.result_rows()) == ["batch"] + ["online"] * 5
    finally:
        rig.close()

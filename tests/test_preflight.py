"""The preflight (issue 22, deliverable 5), tick by tick with the in-memory provider: a job's first
rows go through the synchronous API before any batch; a failure fails the job in seconds with
no batch; a pass answers those rows (not sent again) at the standard price; an unreachable
provider is tried again with backoff; a crash between the call and the outcome sends it again
once; `bgctl retry` after a fix runs it again.  The preflight's rows go out together: every
intent first, then the calls at once, then the outcomes in row order."""

from __future__ import annotations

import dataclasses
import json

import pytest

from batchgrader.core.rules.preflight_rules import preflight_delay
from batchgrader.pipeline.pricing import billed_cost, load_pricing, standard_price
from batchgrader.store.eventstore import NewEvent
from ticks import Rig

CONFIG = "preflight_rows: 2\n"


@pytest.fixture
def rig(home):
    r = Rig(home, CONFIG)
    yield r
    r.close()


def drop(rig: Rig, rows: int) -> list[str]:
    """Put a file in the inbox; the events of the tick that takes it (its preflight included)."""
    (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(rows)))
    rig.tick()
    return rig.tick()


def sent_rows(rig: Rig) -> list[str]:
    return [
        json.loads(x)["custom_id"]
        for f in rig.provider.files.values()
        if f.info.purpose == "batch"
        for x in f.data.splitlines()
        if x.strip()
    ]


def test_a_passed_preflight_answers_its_rows_and_the_batch_carries_the_rest(rig):
    row = ["PreflightRowAnswered", "TokensUsed"]  # every row's intent, then each row's answer and cost, in row order
    passed = ["PreflightPassed", "JobPrepared", "RequestsReused"]  # prepared in the same tick
    assert drop(rig, 5) == ["JobAccepted", "PreflightRequested", "PreflightRequested", *row, *row, *passed]
    assert rig.calls("complete") == 2 and rig.calls("upload") == 0
    answered = [a["custom_id"] for a in rig.events("PreflightPassed")[0]["answers"]]
    assert answered == [cid for e in rig.events("PreflightRequested") for cid in e["rows"]]
    rig.tick()
    sent = sent_rows(rig)
    assert len(sent) == 3 and not set(sent) & set(answered)  # the preflight's rows are not sent again
    assert rig.events("RequestsReused")[0]["saved_usd"] == 0.0  # they were paid for, nothing saved
    rig.provider.finish_all()
    rig.tick()
    assert rig.job().ended == "completed"
    rows = rig.result_rows()
    assert len(rows) == 5 and all(r["error"] == "" and "SIMULATED" in r["grade"] for r in rows)
    used = [u for u in rig.events("TokensUsed") if u["chunk"] == -1]
    price = load_pricing().get(rig.job().model or "")
    want = billed_cost(standard_price(price), rig.provider.prompt_tokens, 0, rig.provider.completion_tokens)
    assert len(used) == 2 and all(u["batch_id"] is None and u["cost_usd"] == pytest.approx(want) for u in used) and want > 0
    assert standard_price(price).input_per_1m == price.spec.standard_input_per_1m  # the catalogue's standard price
    # the preflight's rows say so and keep their tokens: every token column sums to what was billed
    by = {r["id"]: r["answered_by"] for r in rows}
    assert [by[str(int(c.rsplit("-", 1)[-1]) - 1)] for c in answered] == ["preflight", "preflight"]  # row n is custom id n+1
    assert list(by.values()).count("batch") == 3
    billed = sum(u["prompt_tokens"] for u in rig.events("TokensUsed"))
    assert sum(int(r["input_tokens"]) for r in rows) == billed > 0


def test_the_standard_price_is_the_catalogues_own_or_twice_the_batch_price():
    table = load_pricing()
    old = table.get("gpt-3.5-turbo-1106")  # OpenAI's Batch table lists its standard rates: not half off
    assert standard_price(old).input_per_1m == old.spec.standard_input_per_1m == old.input_per_1m
    bare = dataclasses.replace(old, spec=type(old.spec)())  # a user's row with no standard prices
    assert standard_price(bare).input_per_1m == 2 * old.input_per_1m
    assert standard_price(bare).output_per_1m == 2 * old.output_per_1m


def test_a_refused_setting_fails_the_job_in_one_tick_with_no_batch(rig):
    message = "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) value is supported."
    for _ in range(2):  # a setting: every row is refused
        rig.provider.fail_next("complete", "refused", status_code=400, message=message, code="unsupported_value")
    types = drop(rig, 5)
    assert types[:4] == ["JobAccepted", "PreflightRequested", "PreflightRequested", "PreflightFailed"]
    assert types[-1] == "JobFailed" and rig.calls("complete") == 2
    failed = rig.events("JobFailed")[0]
    assert failed["code"] == "preflight_failed" and failed["stage"] == "preflight"
    assert message in failed["error"] and "unsupported_value" in failed["error"] and "bgctl retry" in failed["hint"]
    assert rig.calls("upload") == 0 and rig.calls("create_batch") == 0 and not rig.events("JobPrepared")
    (report,) = rig.home.outbox.glob("*error*")
    assert message in report.read_text() and "No batch was created" in report.read_text()
    rig.control("RetryRequested")  # the setting fixed: retry runs the preflight again
    types = []
    for _ in range(4):
        types += rig.tick()
    assert types.count("PreflightPassed") == 1 and "JobPrepared" in types


def test_a_truncated_preflight_names_the_output_bound(rig):
    rig.provider.finish_reason = lambda cid, body: "length"
    drop(rig, 3)
    failed = rig.events("PreflightFailed")[0]
    assert failed["row_code"] == "truncated" and "max_completion_tokens" in failed["hint"]
    assert rig.job().ended == "failed" and rig.calls("upload") == 0


def test_structured_output_outside_the_schema_fails_the_preflight(home):
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "g",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"score": {"type": "integer"}},
                "required": ["score"],
                "additionalProperties": False,
            },
        },
    }
    rig = Rig(home, CONFIG + f"response_format: {json.dumps(schema)}\n")
    rig.provider.answer = lambda cid, body: "Score: 4"
    drop(rig, 3)
    assert rig.events("PreflightFailed")[0]["row_code"] == "invalid_output" and rig.job().ended == "failed"
    rig.close()


def test_an_unreachable_provider_is_tried_again_with_backoff_never_skipped(rig):
    for _ in range(2):  # neither row's request reached it
        rig.provider.fail_next("complete", "unavailable")
    assert drop(rig, 4)[-1] == "PreflightUnreachable"
    assert "could not be reached" in (rig.job().last_error or "")
    wait = preflight_delay(1)
    assert rig.tick(wait / 2) == []  # waiting: not skipped, not prepared
    assert not rig.events("JobPrepared") and rig.job().preflight == "unreachable"
    row = ["PreflightRowAnswered", "TokensUsed"]
    passed = ["PreflightPassed", "JobPrepared", "RequestsReused"]
    assert rig.tick(wait) == ["PreflightRequested", "PreflightRequested", *row, *row, *passed]
    assert rig.events("PreflightRequested")[-1]["attempt"] == 2 and rig.job().last_error is None
    assert preflight_delay(2) == 2 * preflight_delay(1) and preflight_delay(30) == 300.0


def test_a_crash_between_the_call_and_the_outcome_sends_the_preflight_once_more(rig):
    (rig.home.inbox / "a.csv").write_text("id,response\n0,a\n1,b\n2,c\n")
    rig.tick()
    for _ in range(2):  # stands in for the intent the crash left open ...
        rig.provider.fail_next("complete", "unavailable")
    rig.tick()
    job = rig.job()
    rig.engine.ctx.emit(job.job_id, NewEvent("PreflightRequested", {"rows": ["x"], "attempt": 2}))  # ... an open intent
    assert rig.job().preflight == "requested"
    before = rig.calls("complete")
    rig.tick(preflight_delay(1))
    assert rig.events("PreflightRequested")[-1]["attempt"] == 3
    assert rig.calls("complete") - before == 2  # sent once more, not more
    assert rig.job().preflight == "passed"


def test_preflight_rows_0_turns_it_off(home):
    rig = Rig(home, "preflight_rows: 0\n")
    assert drop(rig, 3)[:2] == ["JobAccepted", "JobPrepared"] and rig.calls("complete") == 0
    rig.close()


def test_status_and_costs_count_the_preflights_rows_as_preflight_not_reused(rig):
    from batchgrader.cli.render_status import reused_rows, rows_cell
    from batchgrader.store import costs, queries

    drop(rig, 5)
    rig.tick()
    rig.tick()
    rig.provider.finish_all()
    rig.tick()
    assert rig.job().ended == "completed"
    (row,) = queries.status(rig.home)
    assert row["route_summary"]["preflight_rows"] == 2 and reused_rows(row) == 0
    assert rows_cell(row).splitlines() == ["5 ok/5", "2 preflight"]  # not "3 sent, 2 reused": they were sent and billed
    day = rig.job().created_ts[:10]
    (total,) = [r for r in costs.costs(rig.home, day, day, by="day")["rows"]]
    assert total["reused_rows"] == 0

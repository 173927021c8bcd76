"""The Responses API in BatchGrader's own requests (issue 33, item 2), tick by tick with the
in-memory provider: a Responses-only model's rows go out as responses in batches, the preflight
and the online route; answers, truncation and usage are read from Responses bodies; a chat model
is sent as before.  End to end through the SDK against the emulator: tests/test_responses_emulator.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchgrader.core.host.control_files import request_control
from batchgrader.daemon.control import apply_control
from batchgrader.pipeline.pricing import load_pricing, standard_price
from ticks import Rig

PRO = (
    "delete_provider_files: false\nmodel: gpt-5.5-pro\n"  # served by the Responses API only (its catalogue row's endpoint column)
)
SCHEMA = (
    "response_format:\n  type: object\n  properties:\n    score: {type: integer}\n    reason: {type: string}\n"
    "  required: [score, reason]\n  additionalProperties: false\n"
)


def uploaded(rig: Rig) -> list[dict[str, Any]]:
    """Every request line uploaded to the provider, in upload order."""
    return [json.loads(x) for f in rig.provider.files.values() if f.info.purpose == "batch" for x in f.data.splitlines()]


def drop(rig: Rig, rows: int) -> None:
    (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(rows)))


def run(rig: Rig, ticks: int = 12) -> None:
    for _ in range(ticks):
        rig.tick()
        rig.provider.finish_all()
        if rig.engine.ctx.state.jobs and rig.job().ended:
            return
    raise AssertionError("the job did not end")


def test_a_responses_only_model_is_sent_through_the_responses_api_in_a_batch(home):
    rig = Rig(home, PRO + "reasoning_effort: high\n")
    try:
        rig.drop(3)
        run(rig)
        job = rig.job()
        assert job.ended == "completed", job.last_error
        lines = uploaded(rig)
        assert len(lines) == 3 and {x["url"] for x in lines} == {"/v1/responses"}
        body = lines[0]["body"]
        assert body["model"] == "gpt-5.5-pro" and body["max_output_tokens"] == 50
        assert body["reasoning"] == {"effort": "high"}
        assert [m["role"] for m in body["input"]] == ["system", "user"] and body["input"][1]["content"].endswith("review 0")
        assert not {"messages", "max_completion_tokens", "reasoning_effort", "response_format"} & set(body)
        (batch,) = rig.provider.batches.values()
        assert batch.endpoint == "/v1/responses"  # the batch names the url of its lines
        rows = rig.result_rows()
        assert [r["grade"] for r in rows] == [f"SIMULATED answer for {x['custom_id']}" for x in lines]
        assert all(r["error"] == "" for r in rows)
        # usage read from the Responses bodies (input_tokens / output_tokens), priced at the batch price
        price = load_pricing().get("gpt-5.5-pro")
        per_row = (10 * price.input_per_1m + 5 * price.output_per_1m) / 1e6
        assert (job.prompt_tokens, job.completion_tokens) == (30, 15)
        assert job.cost_usd == pytest.approx(3 * per_row)
    finally:
        rig.close()


def test_a_chat_model_is_sent_as_before(home):
    rig = Rig(home, "delete_provider_files: false\nmodel: gpt-5.4-mini\n")
    try:
        rig.drop(2)
        run(rig)
        assert rig.job().ended == "completed"
        lines = uploaded(rig)
        assert {x["url"] for x in lines} == {"/v1/chat/completions"}
        assert "messages" in lines[0]["body"] and lines[0]["body"]["max_completion_tokens"] == 50
        (batch,) = rig.provider.batches.values()
        assert batch.endpoint == "/v1/chat/completions"
    finally:
        rig.close()


def test_openai_endpoint_responses_sends_a_model_served_by_both_through_the_responses_api(home):
    rig = Rig(home, "delete_provider_files: false\nmodel: gpt-5.4-mini\nopenai_endpoint: responses\n" + SCHEMA)
    rig.provider.answer = lambda cid, body: json.dumps({"score": 4, "reason": cid})
    try:
        rig.drop(2)
        run(rig)
        assert rig.job().ended == "completed", rig.job().last_error
        body = uploaded(rig)[0]["body"]
        fmt = body["text"]["format"]  # the Responses shape: name, schema and strict beside the type
        assert fmt["type"] == "json_schema" and fmt["strict"] is True and fmt["name"] == "grade"
        assert fmt["schema"]["required"] == ["score", "reason"] and "json_schema" not in fmt
        rows = rig.result_rows()
        assert [(r["score"], r["reason"]) for r in rows] == [("4", x["custom_id"]) for x in uploaded(rig)]
    finally:
        rig.close()


def test_an_answer_cut_by_max_output_tokens_is_truncated_and_retry_raises_that_bound(home):
    rig = Rig(home, PRO)
    rig.provider.finish_reason = lambda cid, body: "length" if body["max_output_tokens"] < 500 else "stop"
    try:
        job = rig.drop(2)
        rig.tick()
        rig.provider.finish_all()
        rig.tick()
        assert rig.job().ended == "failed"
        (failed,) = rig.events("RowsFailed")
        assert {r["code"] for r in failed["rows"]} == {"truncated"}
        rows = rig.result_rows()
        assert all("finish_reason: max_output_tokens" in r["error"] and "max-completion-tokens" in r["error"] for r in rows)
        assert not rig.events("RetryPlanned")  # not retried automatically: the same bound fails the same way
        path = request_control(rig.home, "retry", job.job_id, "raise the bound", max_completion_tokens=800)
        assert apply_control(rig.engine, json.loads(path.read_text())) is None
        run(rig)
        assert rig.job().ended == "completed"
        resent = uploaded(rig)[2:]
        assert [x["body"]["max_output_tokens"] for x in resent] == [800, 800]  # the bound of the Responses API
        assert all("max_completion_tokens" not in x["body"] for x in resent)
    finally:
        rig.close()


def test_the_preflight_sends_its_rows_through_the_responses_api(home):
    rig = Rig(home, PRO + "preflight_rows: 2\n")
    try:
        drop(rig, 4)
        run(rig)
        job = rig.job()
        assert job.preflight == "passed" and job.ended == "completed"
        assert len(rig.provider.complete_times) == 2  # the preflight's rows, each once through complete()
        first_two = rig.provider.billed[:2]
        assert all("input" in body and body["max_output_tokens"] == 50 for _, _, body in first_two)
        assert sum(c.requests for c in job.chunks.values()) == 2  # not sent again in the batch
        assert {x["url"] for x in uploaded(rig)} == {"/v1/responses"}
        pre = [u for u in rig.events("TokensUsed") if u["chunk"] == -1]
        price = standard_price(load_pricing().get("gpt-5.5-pro"))  # the synchronous price
        expected = (10 * price.input_per_1m + 5 * price.output_per_1m) / 1e6
        assert [u["cost_usd"] for u in pre] == pytest.approx([expected, expected])
    finally:
        rig.close()


def test_the_online_route_sends_every_row_through_the_responses_api(home):
    rig = Rig(home, PRO + "route: online\nonline_concurrency: 1\n")
    try:
        drop(rig, 2)
        run(rig)
        assert rig.job().ended == "completed"
        assert rig.calls("create_batch") == 0 and len(rig.events("OnlineRequestAnswered")) == 2
        assert len(rig.provider.billed) == 2 and all("input" in body for _, _, body in rig.provider.billed)
        rows = rig.result_rows()
        assert [r["answered_by"] for r in rows] == ["online", "online"] and all(r["grade"] for r in rows)
    finally:
        rig.close()

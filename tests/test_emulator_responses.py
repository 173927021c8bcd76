"""The emulator's Responses API (``POST /v1/responses`` and batches whose lines target
``/v1/responses``), through the official openai SDK unchanged over real HTTP: answers validate
against the pinned OpenAPI spec's ``Response``; what the spec refuses (``CreateResponse``) and
what the model's catalogue row refuses is refused with OpenAI's error shape, synchronously and in
a batch's error file; a Responses-only model is refused on chat completions with OpenAI's 404."""

from __future__ import annotations

import copy
from typing import Any

import openai
import pytest

from batchgrader.emulator import REFUSE_TRIGGER, RESPONSES_ENDPOINT
from batchgrader.emulator.openapi import responses_request_error
from batchgrader.emulator.rules import RESPONSES_ONLY_MESSAGE
from emulator_fixtures import (  # noqa: F401 - fixtures
    CHAT,
    MODEL,
    chat_line,
    client,
    clock,
    emu,
    emu_factory,
    jsonl,
    read_jsonl,
    run_to_terminal,
    upload,
)
from test_emulator_openapi import assert_valid, validator

BASE: dict[str, Any] = {"model": MODEL, "input": [{"role": "user", "content": "Grade this essay."}]}
SCHEMA = {
    "type": "json_schema",
    "name": "grade",
    "schema": {
        "type": "object",
        "properties": {"score": {"type": "integer"}},
        "required": ["score"],
        "additionalProperties": False,
    },
    "strict": True,
}

#: bodies the spec forbids -> the param the 400 names
FORBIDDEN: list[tuple[dict[str, Any], str]] = [
    ({"temperature": 3}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_output_tokens": 5}, "max_output_tokens"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"service_tier": "turbo"}, "service_tier"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user"}]}, "input[0].content"),
]
#: bodies the model's rules refuse (the spec allows them) -> (status, param, code)
REFUSED_BY_MODEL: list[tuple[dict[str, Any], tuple[int, str, str]]] = [
    ({"model": "gpt-5-mini", "temperature": 0}, (400, "temperature", "unsupported_value")),
    ({"model": "gpt-4o-mini", "reasoning": {"effort": "low"}}, (400, "reasoning.effort", "unsupported_parameter")),
    ({"model": "gpt-4o-mini", "max_output_tokens": 10_000_000}, (400, "max_output_tokens", "invalid_value")),
    ({"model": "gpt-4o-mini", "service_tier": "flex"}, (400, "service_tier", "invalid_value")),
]


def body_with(extra: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **extra}


def line(cid: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": RESPONSES_ENDPOINT, "body": body}


@pytest.mark.parametrize(("extra", "param"), FORBIDDEN, ids=[p for _, p in FORBIDDEN])
def test_the_spec_forbids_each_refused_body(extra, param):
    body = body_with(extra)
    assert not validator("CreateResponse").is_valid(body) and validator("CreateResponse").is_valid(BASE)
    refused = responses_request_error(body)
    assert refused is not None and refused["param"] == param


@pytest.mark.parametrize(("extra", "param"), FORBIDDEN, ids=[p for _, p in FORBIDDEN])
def test_sync_refuses_what_the_spec_forbids(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**body_with(extra))
    body = info.value.response.json()
    assert_valid("ErrorResponse", body)
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param


@pytest.mark.parametrize(("extra", "want"), REFUSED_BY_MODEL, ids=[w[1] for _, w in REFUSED_BY_MODEL])
def test_sync_refuses_what_the_model_refuses(client, extra, want):
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(**body_with(extra))
    err = info.value.response.json()["error"]
    assert (info.value.status_code, err["param"], err["code"]) == want


def test_sync_answers_read_through_the_sdk_and_validate(client):
    plain = client.responses.create(model=MODEL, input="Grade this essay.", instructions="Answer in one word.")
    assert plain.status == "completed" and plain.output_text and plain.usage.input_tokens > 0
    assert plain.usage.output_tokens == len(plain.output_text.split()) or plain.usage.output_tokens > 0
    structured = client.responses.create(model=MODEL, input="Grade this essay.", text={"format": SCHEMA})
    assert isinstance(__import__("json").loads(structured.output_text)["score"], int)
    reasoning = client.responses.create(model="gpt-5-mini", input="Grade.", reasoning={"effort": "low"}, max_output_tokens=20_000)
    assert reasoning.usage.output_tokens_details.reasoning_tokens > 0
    assert [item.type for item in reasoning.output] == ["reasoning", "message"]
    cut = client.responses.create(model="gpt-5-mini", input="Grade.", reasoning={"effort": "high"}, max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    refused = client.responses.create(model=MODEL, input=f"Grade this. {REFUSE_TRIGGER}")
    part = refused.output[-1].content[0]
    assert part.type == "refusal" and part.refusal and refused.output_text == ""
    for r in (plain, structured, reasoning, cut, refused):
        assert_valid("Response", r.model_dump(mode="json", exclude_unset=True, by_alias=True))  # what the emulator sent
    # the same request twice: the same answer (deterministic)
    again = client.responses.create(model=MODEL, input="Grade this essay.", instructions="Answer in one word.")
    assert again.output_text == plain.output_text and again.id == plain.id


def test_a_responses_only_model_is_refused_on_chat_completions_with_openais_404(client, clock):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="o3-pro", messages=[{"role": "user", "content": "hi"}])
    assert info.value.response.json() == {
        "error": {"message": RESPONSES_ONLY_MESSAGE, "type": "invalid_request_error", "param": "model", "code": None}
    }
    assert client.responses.create(model="o3-pro", input="hi", max_output_tokens=50_000).status == "completed"
    # in a chat batch, each line fails with that 404 in the error file
    b = client.batches.create(
        input_file_id=upload(client, jsonl([chat_line("pro-0", "hi", model="o3-pro")])).id, endpoint=CHAT, completion_window="24h"
    )
    b = run_to_terminal(client, clock, b.id)
    (err,) = read_jsonl(client, b.error_file_id)
    assert err["response"]["status_code"] == 404 and err["response"]["body"]["error"]["message"] == RESPONSES_ONLY_MESSAGE


def test_a_batch_of_responses_lines_completes_with_response_bodies(client, clock):
    mini = {"model": "gpt-5-mini", "max_output_tokens": 50_000}  # one model per batch
    good = [line(f"ok-{i}", body_with({**mini, "input": f"Grade essay {i}."})) for i in range(3)]
    good.append(line("json", body_with({**mini, "text": {"format": SCHEMA}})))
    good.append(line("cut", body_with({**mini, "reasoning": {"effort": "high"}, "max_output_tokens": 16})))
    good.append(line("refused", body_with({**mini, "input": f"Grade. {REFUSE_TRIGGER}"})))
    bad = [line(f"bad-{i}", body_with({**mini, **e})) for i, (e, _) in enumerate(FORBIDDEN)]
    f = upload(client, jsonl(good + bad))
    b = client.batches.create(input_file_id=f.id, endpoint=RESPONSES_ENDPOINT, completion_window="24h")
    assert b.endpoint == RESPONSES_ENDPOINT
    b = run_to_terminal(client, clock, b.id)
    assert b.status == "completed", b.errors
    assert (b.request_counts.completed, b.request_counts.failed) == (len(good), len(bad))
    out = {row["custom_id"]: row for row in read_jsonl(client, b.output_file_id)}
    for row in out.values():
        assert row["response"]["status_code"] == 200
        body = row["response"]["body"]
        assert_valid("Response", body)
        assert body["object"] == "response" and body["created_at"] > 0
    assert out["cut"]["response"]["body"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert out["refused"]["response"]["body"]["output"][-1]["content"][0]["type"] == "refusal"
    errs = {row["custom_id"]: row for row in read_jsonl(client, b.error_file_id)}
    for i, (_, param) in enumerate(FORBIDDEN):
        body = errs[f"bad-{i}"]["response"]["body"]
        assert_valid("ErrorResponse", body)
        assert errs[f"bad-{i}"]["response"]["status_code"] == 400 and body["error"]["param"] == param


def test_a_responses_batch_refuses_a_chat_line_and_an_unknown_model(client, clock):
    rows = [line("ok", BASE), chat_line("chat", "hi")]
    b = client.batches.create(input_file_id=upload(client, jsonl(rows)).id, endpoint=RESPONSES_ENDPOINT, completion_window="24h")
    b = run_to_terminal(client, clock, b.id)
    assert b.status == "failed" and b.errors.data[0].code == "invalid_url" and b.errors.data[0].line == 2
    rows = [line("ok", body_with({"model": "no-such-model-1"}))]
    b = client.batches.create(input_file_id=upload(client, jsonl(rows)).id, endpoint=RESPONSES_ENDPOINT, completion_window="24h")
    b = run_to_terminal(client, clock, b.id)
    assert b.status == "failed" and b.errors.data[0].code == "model_not_found"


def test_a_model_past_its_shutdown_date_is_refused_with_openais_404(emu_factory, clock):
    """gpt-5-mini shuts down on 2026-12-11 (catalogue): served the day before, refused from that day,
    synchronously (chat and Responses) and in a batch, in OpenAI's recorded wording."""
    import datetime

    from batchgrader.emulator import ManualClock
    from batchgrader.emulator.rules import SHUTDOWN_MESSAGE
    from emulator_fixtures import sdk_client

    day = datetime.datetime(2026, 12, 10, 12, tzinfo=datetime.UTC).timestamp()
    manual = ManualClock(day)
    c = sdk_client(emu_factory(clock=manual))
    ask = {"model": "gpt-5-mini", "max_output_tokens": 50_000}
    assert c.responses.create(input="Grade.", **ask).status == "completed"
    manual.advance(24 * 3600)  # 2026-12-11, 12:00 UTC
    gone = SHUTDOWN_MESSAGE.format(model="gpt-5-mini")
    with pytest.raises(openai.NotFoundError) as info:
        c.responses.create(input="Grade.", **ask)
    assert info.value.response.json()["error"] == {
        "message": gone,
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-5-mini", messages=[{"role": "user", "content": "Grade."}])
    assert c.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Grade."}]
    ).choices  # until 2027-01-14
    b = c.batches.create(
        input_file_id=upload(c, jsonl([line("x", body_with(ask))])).id, endpoint=RESPONSES_ENDPOINT, completion_window="24h"
    )
    b = run_to_terminal(c, manual, b.id)
    assert b.status == "failed" and (b.errors.data[0].code, b.errors.data[0].message) == ("model_not_found", gone)

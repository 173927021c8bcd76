"""The emulator, driven by the real openai SDK over real HTTP (nothing mocked)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from batchgrader.emulator import (
    BATCH_EXPIRED_MESSAGE,
    EXPIRE_AFTER_METADATA_KEY,
    FAULT_PROFILES,
    SIMULATED_BANNER,
    Emulator,
    EmulatorConfig,
    Fault,
    FaultRates,
    ManualClock,
    generate_from_schema,
)
from batchgrader.pipeline.tokens import ChatTokenCounter
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
    sdk_client,
    simple_input,
    upload,
    wait_for,
)


def http_json(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


def create_batch(client: openai.OpenAI, data: bytes, **kw: Any) -> Any:
    f = upload(client, data)
    return client.batches.create(input_file_id=f.id, endpoint=kw.pop("endpoint", CHAT), completion_window="24h", **kw)


# --- a tiny JSON Schema checker for the subset the emulator generates -------------------------


def conforms(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> bool:
    root = root or schema
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part]
        return conforms(value, target, root)
    if "enum" in schema:
        return value in schema["enum"]
    if "anyOf" in schema:
        return any(conforms(value, s, root) for s in schema["anyOf"])
    t = schema.get("type")
    if isinstance(t, list):
        return any(conforms(value, {**schema, "type": x}, root) for x in t)
    if t == "null":
        return value is None
    if t == "string":
        return (
            isinstance(value, str) and len(value) >= schema.get("minLength", 0) and len(value) <= schema.get("maxLength", 10**9)
        )
    if t == "integer":
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and schema.get("minimum", -1e18) <= value <= schema.get("maximum", 1e18)
        )
    if t == "number":
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and schema.get("minimum", -1e18) <= value <= schema.get("maximum", 1e18)
        )
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return (
            isinstance(value, list)
            and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 10**9)
            and all(conforms(v, schema.get("items", {}), root) for v in value)
        )
    if t == "object":
        if not isinstance(value, dict):
            return False
        props = schema.get("properties", {})
        if any(r not in value for r in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(conforms(v, props[k], root) for k, v in value.items() if k in props)
    return True


GRADE_SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "passed": {"type": "boolean"},
        "label": {"type": "string", "enum": ["good", "fair", "poor"]},
        "reasons": {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 1, "maxItems": 3},
        "detail": {
            "type": "object",
            "properties": {"grammar": {"type": "integer", "minimum": 0, "maximum": 10}, "note": {"type": ["string", "null"]}},
            "required": ["grammar", "note"],
            "additionalProperties": False,
        },
        "tag": {"$ref": "#/$defs/tag"},
        "optional_hint": {"type": "string"},
    },
    "required": ["score", "confidence", "passed", "label", "reasons", "detail", "tag"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "string", "enum": ["a", "b"]}},
}


def test_schema_generator_honours_types_bounds_and_required():
    rng = random.Random(1)
    for _ in range(200):
        v = generate_from_schema(GRADE_SCHEMA, rng)
        assert conforms(v, GRADE_SCHEMA), v
    seen_optional = {("optional_hint" in generate_from_schema(GRADE_SCHEMA, rng)) for _ in range(50)}
    assert seen_optional == {True, False}  # optional properties sometimes present, required always


# --- files ------------------------------------------------------------------------------------


def test_file_upload_roundtrip_true_bytes_and_listing(client, emu):
    data = "é\r\nline two ✓\n".encode() + bytes(range(256))  # CRLF, non-ASCII and every byte value
    f = client.files.create(file=("weird.jsonl", data, "application/jsonl"), purpose="batch")
    assert f.object == "file" and f.purpose == "batch" and f.status == "processed"
    assert f.bytes == len(data) and f.filename == "weird.jsonl"
    assert f.expires_at == f.created_at + 30 * 86400
    assert client.files.retrieve(f.id).model_dump() == f.model_dump()
    assert client.files.content(f.id).content == data

    g = client.files.create(file=("other.txt", b"hello", "text/plain"), purpose="user_data")
    h = upload(client, b"{}\n", "third.jsonl")
    ids_desc = [x.id for x in client.files.list()]
    assert ids_desc == [h.id, g.id, f.id]
    assert [x.id for x in client.files.list(order="asc")] == [f.id, g.id, h.id]
    assert [x.id for x in client.files.list(purpose="batch")] == [h.id, f.id]
    page = client.files.list(limit=1)
    assert [x.id for x in page.data] == [h.id] and page.has_more
    assert [x.id for x in client.files.list(limit=1, after=h.id).data] == [g.id]
    assert [x.id for x in client.files.list(limit=1)] == [h.id, g.id, f.id]  # SDK auto-pagination

    deleted = client.files.delete(g.id)
    assert deleted.deleted is True and deleted.id == g.id
    with pytest.raises(openai.NotFoundError) as ei:
        client.files.retrieve(g.id)
    assert ei.value.body["message"] == f"No such File object: {g.id}"
    assert g.id not in [x.id for x in client.files.list()]
    assert emu.files_created() == 3


def test_batch_file_uploaded_as_raw_bytes(client, clock):
    """The SDK sends raw bytes as a file named "upload" (no extension); OpenAI takes it as a batch
    file (bespokelabs-curator uploads its batch file so), a name ending otherwise is refused."""
    f = client.files.create(file=jsonl([chat_line("r1", "hello")]), purpose="batch")
    assert f.filename == "upload" and f.purpose == "batch"
    b = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    done = run_to_terminal(client, clock, b.id)
    assert done.status == "completed" and done.request_counts.completed == 1


def test_upload_rejections(client, emu_factory):
    with pytest.raises(openai.BadRequestError, match="Must be .jsonl"):
        client.files.create(file=("input.csv", b"a,b\n", "text/csv"), purpose="batch")
    small = emu_factory(max_batch_file_bytes=10)
    with pytest.raises(openai.BadRequestError, match="File is too large"):
        upload(sdk_client(small), b"x" * 11)


def test_auth_required_and_specific_key(emu_factory):
    e = emu_factory()
    status, body, _ = http_json("GET", e.base_url + "/batches")
    assert status == 401 and "didn't provide an API key" in body["error"]["message"]
    status, _, _ = http_json("GET", e.base_url + "/batches", headers={"Authorization": "Bearer anything"})
    assert status == 200  # any non-empty key by default

    strict = emu_factory(api_key="sk-right-key-000000000000")
    with pytest.raises(openai.AuthenticationError) as ei:
        openai.OpenAI(api_key="sk-wrong-key-111111111111", base_url=strict.base_url, max_retries=0).batches.list()
    assert ei.value.code == "invalid_api_key"
    assert "sk-wrong-key-111111111111" not in str(ei.value)  # masked, like the real API
    assert sdk_client(strict, api_key="sk-right-key-000000000000").batches.list().data == []


def test_unknown_route_and_missing_objects_give_openai_error_bodies(client, emu):
    status, body, headers = http_json("GET", emu.base_url + "/nothing", headers={"Authorization": "Bearer k"})
    assert status == 404 and body["error"]["message"] == "Invalid URL (GET /v1/nothing)"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert headers.get("x-request-id", "").startswith("req_")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_missing")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-missing")


# --- lifecycle --------------------------------------------------------------------------------


def test_lifecycle_on_manual_clock(client, clock, emu):
    b = create_batch(client, simple_input(4), metadata={"job": "j1", "chunk": "0"})
    assert b.status == "validating" and b.object == "batch" and b.completion_window == "24h"
    assert b.expires_at == b.created_at + 86400 and b.metadata == {"job": "j1", "chunk": "0"}
    assert b.request_counts.total == 0 and b.output_file_id is None
    assert client.batches.retrieve(b.id).status == "validating"  # the clock has not moved

    clock.advance(0.05)
    b1 = client.batches.retrieve(b.id)
    assert b1.status == "in_progress" and b1.in_progress_at is not None and b1.model == MODEL
    assert b1.request_counts.total == 4 and b1.request_counts.completed == 0
    clock.advance(0.025)  # half-way: half of the requests are done
    assert client.batches.retrieve(b.id).request_counts.completed == 2
    clock.advance(0.025)
    b2 = client.batches.retrieve(b.id)
    assert b2.status == "finalizing" and b2.finalizing_at is not None and b2.request_counts.completed == 4
    clock.advance(0.05)
    b3 = client.batches.retrieve(b.id)
    assert b3.status == "completed" and b3.completed_at is not None
    assert (b3.request_counts.total, b3.request_counts.completed, b3.request_counts.failed) == (4, 4, 0)
    assert b3.output_file_id and b3.error_file_id is None and b3.errors is None
    out = client.files.retrieve(b3.output_file_id)
    assert out.purpose == "batch_output" and out.bytes == len(client.files.content(out.id).content)


def test_lifecycle_on_real_clock_with_small_default_phases(emu_factory):
    e = emu_factory(clock=__import__("time").time)  # defaults: 0.05 s per phase
    c = sdk_client(e)
    b = create_batch(c, simple_input(2))
    done = wait_for(lambda: (x := c.batches.retrieve(b.id)).status == "completed" and x, timeout=5)
    assert done.request_counts.completed == 2


def test_transitions_do_not_depend_on_how_often_state_is_read(emu_factory, clock):
    """Lazy transitions are applied in time order across batches, so polling never changes
    the outcome (here: which of two batches hits the enqueued-token limit)."""
    tokens = ChatTokenCounter(MODEL).count(chat_line("x", "Grade essay number 0: the quick brown fox.")["body"]["messages"])
    results = []
    for poll in (True, False):
        clk = ManualClock()
        e = emu_factory(clock=clk, token_limits={MODEL: tokens * 3 + 1}, validating_s=0.1, in_progress_s=1.0)
        c = sdk_client(e)
        a = create_batch(c, simple_input(3, prefix="a"))
        clk.advance(0.05)
        b = create_batch(c, simple_input(3, prefix="b"))
        for _ in range(30):
            clk.advance(0.1)
            if poll:
                c.batches.list()
        results.append((c.batches.retrieve(a.id).status, c.batches.retrieve(b.id).status))
    assert results[0] == results[1] == ("completed", "failed")


# --- outputs ----------------------------------------------------------------------------------


def test_output_lines_format_tokens_and_shuffled_order(client, clock):
    rows = [chat_line(f"r{i}", f"Essay {i}: " + "word " * i, system="You grade essays.") for i in range(12)]
    b = run_to_terminal(client, clock, create_batch(client, jsonl(rows)).id)
    lines = read_jsonl(client, b.output_file_id)
    assert len(lines) == 12
    assert [l["custom_id"] for l in lines] != [r["custom_id"] for r in rows]  # order differs...
    by_id = {l["custom_id"]: l for l in lines}
    assert set(by_id) == {r["custom_id"] for r in rows}  # ...but every row is matched by custom_id
    enc = ChatTokenCounter(MODEL).encoding
    total_in = total_out = 0
    for r in rows:
        line = by_id[r["custom_id"]]
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        assert line["id"].startswith("batch_req_")
        resp = line["response"]
        assert resp["status_code"] == 200 and resp["request_id"].startswith("req_")
        body = resp["body"]
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        content = body["choices"][0]["message"]["content"]
        assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["message"]["role"] == "assistant"
        u = body["usage"]
        assert u["prompt_tokens"] == ChatTokenCounter(MODEL, num_threads=1).count(r["body"]["messages"])
        assert u["completion_tokens"] == len(enc.encode_ordinary(content))
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["prompt_tokens_details"] == {"cached_tokens": 0, "audio_tokens": 0}
        assert u["completion_tokens_details"]["reasoning_tokens"] == 0
        total_in += u["prompt_tokens"]
        total_out += u["completion_tokens"]
    assert b.usage.input_tokens == total_in and b.usage.output_tokens == total_out
    assert b.usage.total_tokens == total_in + total_out
    assert b.usage.input_tokens_details.cached_tokens == 0 and b.usage.output_tokens_details.reasoning_tokens == 0


def test_answers_are_deterministic(emu_factory, clock):
    contents = []
    for _ in range(2):
        c = sdk_client(emu_factory())
        b = run_to_terminal(c, clock, create_batch(c, simple_input(5)).id)
        contents.append(
            {l["custom_id"]: l["response"]["body"]["choices"][0]["message"]["content"] for l in read_jsonl(c, b.output_file_id)}
        )
    assert contents[0] == contents[1]
    assert len(set(contents[0].values())) > 1


def test_json_schema_and_json_object_outputs(client, clock):
    rf = {"type": "json_schema", "json_schema": {"name": "grade", "strict": True, "schema": GRADE_SCHEMA}}
    rows = [chat_line(f"s{i}", f"Essay {i}", response_format=rf) for i in range(20)]
    rows.append(chat_line("obj", "Essay", response_format={"type": "json_object"}))
    b = run_to_terminal(client, clock, create_batch(client, jsonl(rows)).id)
    lines = {l["custom_id"]: l for l in read_jsonl(client, b.output_file_id)}
    for i in range(20):
        value = json.loads(lines[f"s{i}"]["response"]["body"]["choices"][0]["message"]["content"])
        assert conforms(value, GRADE_SCHEMA), value
    assert isinstance(json.loads(lines["obj"]["response"]["body"]["choices"][0]["message"]["content"]), dict)


def test_completion_cap_truncates_with_finish_reason_length(client, clock):
    rows = [
        chat_line("capped", "Essay", model="gpt-4.1-nano", max_completion_tokens=3),
        chat_line("legacy", "Essay", model="gpt-4.1-nano", max_tokens=2),  # max_tokens: non-reasoning models only
        chat_line("free", "Essay", model="gpt-4.1-nano"),
    ]
    b = run_to_terminal(client, clock, create_batch(client, jsonl(rows)).id)
    lines = {l["custom_id"]: l["response"]["body"] for l in read_jsonl(client, b.output_file_id)}
    assert lines["capped"]["usage"]["completion_tokens"] == 3 and lines["capped"]["choices"][0]["finish_reason"] == "length"
    assert lines["legacy"]["usage"]["completion_tokens"] == 2 and lines["legacy"]["choices"][0]["finish_reason"] == "length"
    assert lines["free"]["choices"][0]["finish_reason"] == "stop"


def test_reasoning_model_reports_reasoning_tokens_and_rejects_max_tokens(client, clock):
    rows = [chat_line("ok", "Essay", model="o4-mini"), chat_line("bad", "Essay", model="o4-mini", max_tokens=50)]
    b = run_to_terminal(client, clock, create_batch(client, jsonl(rows)).id)
    ok = read_jsonl(client, b.output_file_id)[0]["response"]["body"]
    r = ok["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert r > 0 and ok["usage"]["completion_tokens"] > r
    assert b.usage.output_tokens_details.reasoning_tokens == r
    err = read_jsonl(client, b.error_file_id)[0]
    assert err["custom_id"] == "bad" and err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["param"] == "max_tokens"


def test_cached_tokens_for_repeated_long_prefix(client, clock):
    system = "Rubric: " + " ".join(f"criterion{i} matters" for i in range(700))
    rows = [chat_line(f"c{i}", f"Essay {i}", system=system) for i in range(3)]
    b = run_to_terminal(client, clock, create_batch(client, jsonl(rows)).id)
    cached = {
        l["custom_id"]: l["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        for l in read_jsonl(client, b.output_file_id)
    }
    assert cached["c0"] == 0 and cached["c1"] >= 1024 and cached["c1"] % 128 == 0 and cached["c2"] == cached["c1"]
    assert b.usage.input_tokens_details.cached_tokens == cached["c1"] * 2


def test_per_request_failures_go_to_error_file(client, clock):
    rows = [chat_line("good", "fine"), chat_line("bad400", "please __FAIL_400__"), chat_line("bad500", "x __FAIL_500__")]
    b = run_to_terminal(client, clock, create_batch(client, jsonl(rows)).id)
    assert b.status == "completed"
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (3, 1, 2)
    assert [l["custom_id"] for l in read_jsonl(client, b.output_file_id)] == ["good"]
    errs = {l["custom_id"]: l for l in read_jsonl(client, b.error_file_id)}
    assert set(errs) == {"bad400", "bad500"}
    for cid, status in (("bad400", 400), ("bad500", 500)):
        assert errs[cid]["error"] is None  # HTTP-level failure: top-level error stays null
        assert errs[cid]["response"]["status_code"] == status
        assert set(errs[cid]["response"]["body"]["error"]) == {"message", "type", "param", "code"}
    assert errs["bad500"]["response"]["body"]["error"]["type"] == "server_error"
    # usage counts only answered requests
    out = read_jsonl(client, b.output_file_id)[0]["response"]["body"]["usage"]
    assert b.usage.input_tokens == out["prompt_tokens"]


def test_batch_where_every_request_failed_is_completed_without_output(client, clock):
    b = run_to_terminal(client, clock, create_batch(client, jsonl(chat_line(f"f{i}", "__FAIL_500__") for i in range(3))).id)
    assert b.status == "completed" and b.output_file_id is None and b.error_file_id
    assert (b.request_counts.completed, b.request_counts.failed, b.request_counts.total) == (0, 3, 3)


def test_seeded_failure_fraction_is_deterministic(emu_factory, clock):
    def failed_ids(seed: int) -> set[str]:
        c = sdk_client(emu_factory(request_failure_rate=0.3, seed=seed))
        b = run_to_terminal(c, clock, create_batch(c, simple_input(60)).id)
        return {l["custom_id"] for l in read_jsonl(c, b.error_file_id)}

    a, a2, other = failed_ids(5), failed_ids(5), failed_ids(6)
    assert a == a2 and a != other
    assert 8 <= len(a) <= 30


def test_a_retried_row_can_succeed_after_a_seeded_failure(emu_factory, clock):
    e = emu_factory(request_failure_rate=0.5, seed=3)
    c = sdk_client(e)
    b = run_to_terminal(c, clock, create_batch(c, simple_input(20)).id)
    failed = [l["custom_id"] for l in read_jsonl(c, b.error_file_id)]
    assert failed
    retry = jsonl(chat_line(cid, f"Grade essay number {cid.split('-')[1]}: the quick brown fox.") for cid in failed)
    b2 = run_to_terminal(c, clock, create_batch(c, retry).id)
    assert b2.request_counts.completed > 0  # failures are seeded per attempt, not forever


# --- validation -------------------------------------------------------------------------------

GOOD = chat_line("a", "x")


@pytest.mark.parametrize(
    "bad_line, code, param",
    [
        ("{not json", "invalid_json_line", None),
        ({"method": "POST", "url": CHAT, "body": GOOD["body"]}, "missing_required_parameter", "custom_id"),
        ({**GOOD, "custom_id": "a"}, "duplicate_custom_id", "custom_id"),
        ({**chat_line("m", "x"), "method": "GET"}, "invalid_request", "method"),
        (chat_line("u", "x", url="/v1/embeddings"), "invalid_url", "url"),
        (chat_line("mm", "x", model="gpt-4o"), "mismatched_model", "body.model"),
        (chat_line("s", "x", stream=True), "streaming_unsupported", "body.stream"),
        ({"custom_id": "nm", "method": "POST", "url": CHAT, "body": {"messages": []}}, "invalid_request", "body.model"),
    ],
)
def test_one_bad_line_fails_the_whole_batch_with_its_line_number(client, clock, bad_line, code, param):
    data = jsonl([GOOD, chat_line("b", "y"), bad_line])
    b = run_to_terminal(client, clock, create_batch(client, data).id)
    assert b.status == "failed" and b.failed_at is not None and b.output_file_id is None
    assert b.errors.object == "list"
    (err,) = b.errors.data
    assert (err.code, err.line, err.param) == (code, 3, param)
    assert err.message


def test_all_bad_lines_are_reported_together(client, clock):
    data = jsonl(["{oops", GOOD, {**GOOD}, chat_line("z", "x", stream=True)])
    b = run_to_terminal(client, clock, create_batch(client, data).id)
    assert [(e.code, e.line) for e in b.errors.data] == [
        ("invalid_json_line", 1),
        ("duplicate_custom_id", 3),
        ("streaming_unsupported", 4),
    ]
    assert b.errors.data[1].message.startswith("The custom_id 'a' for this request is a duplicate")


def test_too_many_tasks(emu_factory, clock):
    c = sdk_client(emu_factory(max_requests_per_batch=3))
    b = run_to_terminal(c, clock, create_batch(c, simple_input(4)).id)
    assert b.status == "failed" and b.errors.data[0].code == "too_many_tasks"


def test_too_many_tasks_at_the_real_limit(client, clock):
    line = json.dumps(chat_line("{}", "x")).replace('"{}"', '"r{}"')
    data = ("\n".join(line.replace("r{}", f"r{i}") for i in range(50_001)) + "\n").encode()
    b = run_to_terminal(client, clock, create_batch(client, data).id)
    assert b.status == "failed" and b.errors.data[0].code == "too_many_tasks"


def test_missing_input_file_creates_then_fails(client, clock):
    b = client.batches.create(input_file_id="file-doesnotexist", endpoint=CHAT, completion_window="24h")
    assert b.status == "validating"
    b = run_to_terminal(client, clock, b.id)
    assert b.status == "failed"
    (err,) = b.errors.data
    assert err.code == "invalid_request" and err.param == "file_id" and "Cannot find file file-doesnotexist" in err.message


def test_synchronous_create_rejections(client, emu):
    f = upload(client, simple_input(1))
    with pytest.raises(openai.BadRequestError) as ei:
        client.batches.create(input_file_id=f.id, endpoint="/v1/nope", completion_window="24h")  # type: ignore[arg-type]
    assert ei.value.param == "endpoint" and ei.value.code == "invalid_value"
    with pytest.raises(openai.BadRequestError) as ei:
        client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="48h")  # type: ignore[arg-type]
    assert ei.value.param == "completion_window"
    with pytest.raises(openai.BadRequestError) as ei:
        client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h", metadata={"tags": ["a"]})  # type: ignore[dict-item]
    assert ei.value.code == "invalid_type" and ei.value.param == "metadata.tags"
    assert "expected a string, but got an array instead" in ei.value.message
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=f.id, endpoint=CHAT, completion_window="24h", metadata={f"k{i}": "v" for i in range(17)}
        )
    assert emu.batches_created() == 0


def test_enqueued_token_limit(emu_factory, clock):
    per_batch = sum(
        ChatTokenCounter(MODEL).count_many(
            [chat_line("x", f"Grade essay number {i}: the quick brown fox.")["body"]["messages"] for i in range(3)]
        )
    )
    e = emu_factory(token_limits={MODEL: per_batch + 5}, in_progress_s=1.0)
    c = sdk_client(e)
    first = create_batch(c, simple_input(3, prefix="a"))
    clock.advance(0.1)
    assert c.batches.retrieve(first.id).status == "in_progress"
    second = create_batch(c, simple_input(3, prefix="b"))
    clock.advance(0.1)
    s = c.batches.retrieve(second.id)
    assert s.status == "failed" and s.errors.data[0].code == "token_limit_exceeded" and s.errors.data[0].line is None
    limit = per_batch + 5
    assert s.errors.data[0].message == (
        f"Enqueued token limit reached for {MODEL} in organization org-emulator. Limit: {limit:,} enqueued tokens. "
        "Please try again once some in_progress batches have been completed."
    )
    assert run_to_terminal(c, clock, first.id).status == "completed"
    third = run_to_terminal(c, clock, create_batch(c, simple_input(3, prefix="c")).id)
    assert third.status == "completed"  # tokens were released when the first completed


def test_enqueued_token_limit_message_can_omit_the_figure(emu_factory, clock):
    e = emu_factory(token_limits={MODEL: 60}, token_limit_figure=False, in_progress_s=1.0)
    c = sdk_client(e)
    b = run_to_terminal(c, clock, create_batch(c, simple_input(5)).id)  # alone over the limit
    assert b.status == "failed" and b.errors.data[0].code == "token_limit_exceeded"
    assert b.errors.data[0].message == (
        f"Enqueued token limit reached for {MODEL} in organization org-emulator. "
        "Please try again once some in_progress batches have been completed."
    )
    assert "Limit:" not in b.errors.data[0].message


# --- expiry and cancellation ------------------------------------------------------------------


def test_expiry_at_the_completion_deadline_gives_partial_output(emu_factory, clock):
    # validating 0.05 s, in progress 1.0 s for 10 requests; the window closes 0.35 s after creation
    e = emu_factory(in_progress_s=1.0, completion_window_s=0.35)
    c = sdk_client(e)
    b = run_to_terminal(c, clock, create_batch(c, simple_input(10)).id)
    assert b.status == "expired" and b.expired_at is not None and b.completed_at is None
    done = read_jsonl(c, b.output_file_id)
    errs = read_jsonl(c, b.error_file_id)
    assert len(done) == 3  # (0.35 - 0.05) / 1.0 * 10 requests were answered: the first three
    assert {l["custom_id"] for l in done} == {"row-0", "row-1", "row-2"}
    assert {l["custom_id"] for l in errs} == {f"row-{i}" for i in range(3, 10)}
    for l in errs:
        assert l["response"] is None
        assert l["error"] == {"code": "batch_expired", "message": BATCH_EXPIRED_MESSAGE}
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (10, 3, 7)
    assert b.usage.input_tokens == sum(l["response"]["body"]["usage"]["prompt_tokens"] for l in done)


def test_forced_expiry_by_metadata(client, clock):
    b = create_batch(client, simple_input(6), metadata={EXPIRE_AFTER_METADATA_KEY: "2"})
    b = run_to_terminal(client, clock, b.id, step=0.01)
    assert b.status == "expired"
    assert sorted(l["custom_id"] for l in read_jsonl(client, b.output_file_id)) == ["row-0", "row-1"]
    assert len(read_jsonl(client, b.error_file_id)) == 4


def test_forced_expiry_with_zero_answered_has_no_output_file(client, clock):
    b = run_to_terminal(client, clock, create_batch(client, simple_input(3), metadata={EXPIRE_AFTER_METADATA_KEY: "0"}).id)
    assert b.status == "expired" and b.output_file_id is None and len(read_jsonl(client, b.error_file_id)) == 3


def test_expire_admin_call_in_process_and_over_http(emu, client, clock):
    a = create_batch(client, simple_input(4))
    clock.advance(0.06)
    assert emu.expire_batch(a.id, completed=1)["status"] == "expired"
    assert len(read_jsonl(client, client.batches.retrieve(a.id).output_file_id)) == 1
    b = create_batch(client, simple_input(4))
    status, body, _ = http_json("POST", f"{emu.root_url}/_emulator/batches/{b.id}/expire", {"completed": 3})
    assert status == 200 and body["status"] == "expired"
    assert body["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    status, body, _ = http_json("POST", f"{emu.root_url}/_emulator/batches/{b.id}/expire", {})
    assert status == 409


def test_cancel_in_progress_gives_partial_output(emu_factory, clock):
    e = emu_factory(in_progress_s=1.0, cancelling_s=0.5)
    c = sdk_client(e)
    b = create_batch(c, simple_input(10))
    clock.advance(0.05 + 0.42)  # 4 of 10 requests done
    cb = c.batches.cancel(b.id)
    assert cb.status == "cancelling" and cb.cancelling_at is not None
    assert c.batches.cancel(b.id).status == "cancelling"  # repeating a cancel is harmless
    clock.advance(0.49)
    assert c.batches.retrieve(b.id).status == "cancelling"
    clock.advance(0.02)
    done = c.batches.retrieve(b.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert sorted(l["custom_id"] for l in read_jsonl(c, done.output_file_id)) == [f"row-{i}" for i in range(4)]
    assert done.error_file_id is None  # requests never started are in neither file
    assert (done.request_counts.total, done.request_counts.completed) == (10, 4)
    assert c.batches.cancel(b.id).status == "cancelled"  # cancelling a cancelled batch is allowed


def test_cancel_while_validating_and_conflicts(client, clock):
    b = create_batch(client, simple_input(3))
    assert client.batches.cancel(b.id).status == "cancelling"
    b = run_to_terminal(client, clock, b.id)
    assert b.status == "cancelled" and b.output_file_id is None and b.error_file_id is None
    done = run_to_terminal(client, clock, create_batch(client, simple_input(1)).id)
    with pytest.raises(openai.ConflictError) as ei:
        client.batches.cancel(done.id)
    assert ei.value.body["message"] == "Cannot cancel a batch with status 'completed'."
    failed = run_to_terminal(
        client, clock, client.batches.create(input_file_id="file-x", endpoint=CHAT, completion_window="24h").id
    )
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(failed.id)


# --- listing ----------------------------------------------------------------------------------


def test_list_batches_pagination_newest_first(client, emu):
    f = upload(client, simple_input(1))
    ids = [client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id for _ in range(5)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    raw = http_json("GET", emu.base_url + "/batches?limit=2", headers={"Authorization": "Bearer k"})[1]
    assert raw["object"] == "list" and raw["first_id"] == ids[4] and raw["last_id"] == ids[3] and raw["has_more"] is True
    last = http_json("GET", emu.base_url + f"/batches?limit=2&after={ids[1]}", headers={"Authorization": "Bearer k"})[1]
    assert [b["id"] for b in last["data"]] == [ids[0]] and last["has_more"] is False
    assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]  # SDK auto-pagination
    for bad in (0, 101):
        with pytest.raises(openai.BadRequestError):
            client.batches.list(limit=bad)
    assert len(client.batches.list(limit=100).data) == 5


# --- faults -----------------------------------------------------------------------------------


def test_scripted_drop_after_creates_the_batch_but_sends_no_response(emu, client):
    f = upload(client, simple_input(1))
    emu.script_fault("POST", "/v1/batches", "drop_after")
    with pytest.raises(openai.APIConnectionError):
        client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h", metadata={"k": "1"})
    assert emu.batches_created() == 1 and emu.request_count("POST", "/v1/batches") == 1
    assert [b.metadata for b in client.batches.list()] == [{"k": "1"}]


def test_scripted_drop_before_does_not_create(emu, client):
    f = upload(client, simple_input(1))
    emu.script_fault("POST", "/v1/batches", Fault("drop_before"))
    with pytest.raises(openai.APIConnectionError):
        client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    assert emu.batches_created() == 0 and emu.request_count("POST", "/v1/batches") == 1
    client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")  # the fault was used up
    assert emu.batches_created() == 1


def test_scripted_status_faults_carry_retry_after(emu, client):
    emu.script_fault("GET", "/v1/batches", Fault("status", status=429, retry_after=2.5), times=2)
    for _ in range(2):
        with pytest.raises(openai.RateLimitError) as ei:
            client.batches.list()
        h = ei.value.response.headers
        assert h["retry-after"] == "3" and h["retry-after-ms"] == "2500"
        assert ei.value.code == "rate_limit_exceeded"
    assert client.batches.list().data == []
    emu.script_fault("*", "/v1/batches/*", Fault("status", status=503))
    with pytest.raises(openai.InternalServerError):
        client.batches.retrieve("batch_x")


def test_sdk_default_retries_would_duplicate_a_create(emu):
    """Why provider.py disables SDK retries on POST: a 500 after the effect is retried by the
    SDK and creates a second batch. (Here: drop_after then success.)"""
    c = sdk_client(emu, max_retries=2)
    f = upload(c, simple_input(1))
    emu.script_fault("POST", "/v1/batches", "drop_after")
    c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    assert emu.request_count("POST", "/v1/batches") == 2 and emu.batches_created() == 2


def test_hang_after_makes_the_client_time_out_after_the_effect(emu):
    c = sdk_client(emu, timeout=0.3)
    f = upload(c, simple_input(1))
    emu.script_fault("POST", "/v1/batches", Fault("hang_after", seconds=5))
    with pytest.raises(openai.APITimeoutError):
        c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    assert emu.batches_created() == 1


def test_truncated_and_garbage_responses(emu, client):
    f = upload(client, b"x" * 1000 + b"\n")
    emu.script_fault("GET", "/v1/files/{id}/content", "truncate")
    with pytest.raises(Exception) as ei:
        with client.files.with_streaming_response.content(f.id) as r:
            r.read()
    assert "incomplete" in str(ei.value).lower() or "closed" in str(ei.value).lower() or "peer" in str(ei.value).lower()
    emu.script_fault("GET", "/v1/batches", "garbage")
    with pytest.raises(ValueError):  # the SDK lets a JSONDecodeError escape (provider.py handles it)
        client.batches.list()


def fault_trace(emu_factory, profile: str | FaultRates, seed: int, n: int = 60) -> list[str]:
    e = emu_factory(faults=profile, seed=seed)
    c = sdk_client(e, timeout=5)
    trace = []
    for _ in range(n):
        try:
            c.batches.list()
            trace.append("ok")
        except openai.APIStatusError as exc:
            trace.append(str(exc.status_code))
        except openai.APIConnectionError:
            trace.append("drop")
    return trace


def test_fault_profiles_are_deterministic_per_seed(emu_factory):
    a = fault_trace(emu_factory, "flaky", 11)
    assert a == fault_trace(emu_factory, "flaky", 11)
    assert a != fault_trace(emu_factory, "flaky", 12)
    assert {"ok", "429"} <= set(a) and set(a) <= {"ok", "429", "500", "503"}
    drops = fault_trace(emu_factory, "drops", 3)
    assert "drop" in drops and set(drops) <= {"ok", "drop"}
    assert fault_trace(emu_factory, "none", 1, n=10) == ["ok"] * 10


def test_chaos_and_slow_profiles(emu_factory):
    fast_slow = FaultRates(slow=0.5, slow_delay_s=(0.001, 0.005))
    e = emu_factory(faults=fast_slow, seed=2)
    c = sdk_client(e)
    for _ in range(20):
        c.batches.list()
    assert 3 <= e.stats()["faults_injected"]["delay"] <= 17
    quick_chaos = dataclasses.replace(FAULT_PROFILES["chaos"], slow_delay_s=(0.001, 0.002))
    chaos = fault_trace(emu_factory, quick_chaos, 9, n=150)
    assert {"ok", "drop", "429"} <= set(chaos)
    with pytest.raises(ValueError):
        Emulator(EmulatorConfig(faults="nonsense"))


def test_drops_after_the_effect_under_the_drops_profile(emu_factory):
    e = emu_factory(faults=FaultRates(drop_after=1.0))
    c = sdk_client(e)
    with pytest.raises(openai.APIConnectionError):
        upload(c, simple_input(1))
    assert e.files_created() == 1


# --- inspection -------------------------------------------------------------------------------


def test_stats_in_process_and_over_http(emu, client):
    f = upload(client, simple_input(1))
    client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h", metadata={"job": "7"})
    client.batches.list()
    status, over_http, _ = http_json("GET", emu.root_url + "/_emulator/stats")
    assert status == 200 and over_http == json.loads(json.dumps(emu.stats()))
    assert over_http["simulated"] is True
    assert over_http["requests"] == {"POST /v1/files": 1, "POST /v1/batches": 1, "GET /v1/batches": 1}
    assert over_http["batches_created"] == 1 and over_http["files_created"] == 1
    assert over_http["batches"][0]["metadata"] == {"job": "7"} and over_http["batches"][0]["input_file_id"] == f.id


def test_stats_give_each_batchs_transition_times_and_the_work_of_each(emu_factory, clock):
    """What bench/bench_due.py reads: when each batch moved, on the emulator's clock, and how long
    each transition's own work took (none on a manual clock, which moves only when told)."""
    e = emu_factory(validating_s=1.0, in_progress_s=2.0, finalizing_s=0.5)
    c = sdk_client(e)
    t0 = clock()
    b = c.batches.create(input_file_id=upload(c, simple_input(2)).id, endpoint=CHAT, completion_window="24h")
    assert run_to_terminal(c, clock, b.id).status == "completed"
    (times,) = [x["times"] for x in e.stats()["batches"]]
    assert times["created"] == t0
    assert (times["validate"], times["finalize"], times["complete"]) == (t0 + 1.0, t0 + 3.0, t0 + 3.5)
    assert times["validate_work"] == times["finalize_work"] == times["complete_work"] == 0.0


def test_faults_can_be_scripted_over_http(emu, client):
    status, _, _ = http_json(
        "POST",
        emu.root_url + "/_emulator/faults",
        {"method": "GET", "path": "/v1/batches", "kind": "status", "status": 500, "times": 1},
    )
    assert status == 200
    with pytest.raises(openai.InternalServerError):
        client.batches.list()
    client.batches.list()
    http_json("POST", emu.root_url + "/_emulator/faults", {"path": "*", "kind": "status", "status": 502, "times": 5})
    http_json("DELETE", emu.root_url + "/_emulator/faults")
    client.batches.list()
    assert emu.stats()["faults_injected"] == {"status": 1}


def test_on_request_hook_sees_received_then_effected(emu_factory):
    calls: list[tuple[str, str, str, int]] = []
    holder: dict[str, Emulator] = {}

    def hook(method: str, route: str, phase: str) -> None:
        calls.append((method, route, phase, holder["e"].batches_created()))

    e = emu_factory(on_request=hook)
    holder["e"] = e
    c = sdk_client(e)
    f = upload(c, simple_input(1))
    c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    c.batches.retrieve(c.batches.list().data[0].id)
    assert calls == [
        ("POST", "/v1/files", "received", 0),
        ("POST", "/v1/files", "effected", 0),
        ("POST", "/v1/batches", "received", 0),  # not created yet...
        ("POST", "/v1/batches", "effected", 1),  # ...created, answer not sent yet
        ("GET", "/v1/batches", "received", 1),
        ("GET", "/v1/batches", "effected", 1),
        ("GET", "/v1/batches/{id}", "received", 1),
        ("GET", "/v1/batches/{id}", "effected", 1),
    ]
    http_json("GET", e.root_url + "/_emulator/stats")
    assert len(calls) == 8  # admin paths are not reported


# --- persistence and the CLI entry point --------------------------------------------------------


def test_data_dir_survives_a_restart(tmp_path: Path, clock):
    data_dir = tmp_path / "emu"
    cfg = EmulatorConfig(clock=clock, data_dir=str(data_dir), in_progress_s=1.0)
    with Emulator(cfg) as e1:
        c = sdk_client(e1)
        f = upload(c, simple_input(4))
        b = c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h", metadata={"k": "v"})
        clock.advance(0.3)
        assert c.batches.retrieve(b.id).status == "in_progress"
        c.files.delete(f.id)  # the running batch keeps its input
    with Emulator(cfg) as e2:
        c = sdk_client(e2)
        assert e2.batches_created() == 1
        assert c.batches.retrieve(b.id).request_counts.completed == 1
        done = run_to_terminal(c, clock, b.id)
        assert done.status == "completed" and done.metadata == {"k": "v"}
        assert sorted(l["custom_id"] for l in read_jsonl(c, done.output_file_id)) == [f"row-{i}" for i in range(4)]
        out_bytes = c.files.content(done.output_file_id).content
    with Emulator(cfg) as e3:
        assert sdk_client(e3).files.content(done.output_file_id).content == out_bytes


def test_run_emulator_in_another_process_prints_banner_and_serves_stats(tmp_path: Path):
    code = "from batchgrader.emulator import run_emulator; run_emulator(0, 'flaky', 4, None)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        banner = []
        base = None
        for _ in range(20):
            line = proc.stdout.readline()
            banner.append(line)
            if "base URL:" in line:
                base = line.split("base URL:")[1].strip()
                break
        assert base and base.startswith("http://127.0.0.1:") and base.endswith("/v1")
        assert any(SIMULATED_BANNER in l for l in banner)
        status, stats, _ = http_json("GET", base[: -len("/v1")] + "/_emulator/stats")
        assert status == 200 and stats["simulated"] is True and stats["batches_created"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_answers_are_made_while_the_batch_runs_and_dated_when_each_request_was_processed(emu_factory):
    """As at a real provider, a request's answer exists (and is dated) once it is processed: the
    retrieve that finds the batch done does not generate every answer at that moment."""
    clk = ManualClock()
    c = sdk_client(emu_factory(clock=clk, validating_s=1.0, in_progress_s=100.0, finalizing_s=10.0))
    b = create_batch(c, simple_input(4))
    start = clk()
    clk.advance(1.0)
    assert c.batches.retrieve(b.id).status == "in_progress"
    clk.advance(50.0)  # half-way: two requests are done, and answered now
    assert c.batches.retrieve(b.id).request_counts.completed == 2
    clk.advance(200.0)  # finalized at start + 101, completed at start + 111, seen only now
    done = c.batches.retrieve(b.id)
    assert done.status == "completed" and done.completed_at == int(start + 111)
    created = {l["custom_id"]: l["response"]["body"]["created"] for l in read_jsonl(c, done.output_file_id)}
    first, last = sorted(created)[:2], sorted(created)[2:]
    assert {created[k] for k in first} == {int(start + 51)}
    assert {created[k] for k in last} == {int(start + 101)}

"""The OpenAI emulator against OpenAI's published OpenAPI spec (the pinned part shipped as
``batchgrader/emulator/openai_openapi.yaml``), through the real openai SDK over real HTTP.

Every answer of the chat-completions, batch and file routes, and every batch output and error
line's body, validates against the spec's response schema (``jsonschema``, Draft 2020-12, the
spec's ``$ref`` resolved through a registry); a request the spec forbids is refused with a 400 in
OpenAI's error shape, synchronously and as a batch line's error."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import openai
import pytest
import yaml
from referencing import Registry, Resource

from batchgrader.emulator.openapi import SPEC_FILE, batch_request_error, chat_request_error
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

SPEC_URI = "urn:openai-openapi"


def _nullable(node: Any) -> Any:
    """The spec as JSON Schema, null allowed where the API sends it: OpenAPI 3.0's ``nullable:
    true`` (which the 3.1 spec still uses), and an optional property (one its object does not
    require), which the spec types without null and the live API sends as ``null`` (a batch's
    ``completed_at`` before completion, a file's ``status_details``)."""
    if isinstance(node, list):
        return [_nullable(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable(v) for k, v in node.items() if k != "nullable"}
    if isinstance(node.get("properties"), dict):
        required = set(node.get("required") or [])
        out["properties"] = {k: v if k in required else {"anyOf": [v, {"type": "null"}]} for k, v in out["properties"].items()}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


with open(SPEC_FILE, encoding="utf-8") as _fh:
    SPEC = yaml.safe_load(_fh)
REGISTRY: Registry[Any] = Registry().with_resource(
    SPEC_URI, Resource.from_contents({"$schema": "https://json-schema.org/draft/2020-12/schema", **_nullable(SPEC)})
)


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({"$ref": f"{SPEC_URI}#/components/schemas/{name}"}, registry=REGISTRY)


def assert_valid(name: str, instance: Any) -> None:
    errors = sorted(validator(name).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{name}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def raw_json(raw: Any) -> Any:
    return json.loads(raw.http_response.text)


BASE = {"model": MODEL, "messages": [{"role": "user", "content": "Grade this essay."}]}

#: bodies the spec forbids -> the param the 400 names
FORBIDDEN: list[tuple[dict[str, Any], str]] = [
    ({"temperature": 3}, "temperature"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 0}, "n"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"temperature": "warm"}, "temperature"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]}, "messages[1].content"),
    ({"messages": []}, "messages"),
    ({"service_tier": "turbo"}, "service_tier"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
]


def _forbidden_body(extra: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **extra}


@pytest.mark.parametrize(("extra", "param"), FORBIDDEN, ids=[p for _, p in FORBIDDEN])
def test_the_spec_forbids_each_refused_body(extra, param):
    """The cases below are refused by the spec itself, not only by the emulator."""
    body = _forbidden_body(extra)
    assert not validator("CreateChatCompletionRequest").is_valid(body)
    assert validator("CreateChatCompletionRequest").is_valid(BASE)
    refused = chat_request_error(body)
    assert refused is not None and refused["param"] == param


@pytest.mark.parametrize(("extra", "param"), FORBIDDEN, ids=[p for _, p in FORBIDDEN])
def test_sync_refuses_what_the_spec_forbids_with_a_400(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**_forbidden_body(extra))
    assert info.value.status_code == 400
    body = info.value.response.json()
    assert_valid("ErrorResponse", body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param


def test_batch_lines_the_spec_forbids_are_refused_in_the_error_file(client, clock):
    rows = [
        {"custom_id": f"bad-{i}", "method": "POST", "url": CHAT, "body": _forbidden_body(e)} for i, (e, _) in enumerate(FORBIDDEN)
    ]
    rows.append(chat_line("good", "Grade this essay."))
    b = client.batches.create(input_file_id=upload(client, jsonl(rows)).id, endpoint=CHAT, completion_window="24h")
    b = run_to_terminal(client, clock, b.id)
    assert b.status == "completed" and (b.request_counts.completed, b.request_counts.failed) == (1, len(FORBIDDEN))
    errs = {line["custom_id"]: line for line in read_jsonl(client, b.error_file_id)}
    for i, (_, param) in enumerate(FORBIDDEN):
        line = errs[f"bad-{i}"]
        assert line["response"]["status_code"] == 400
        assert_valid("ErrorResponse", line["response"]["body"])
        err = line["response"]["body"]["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param


def test_sync_answers_validate_against_the_response_schema(client):
    bodies: list[dict[str, Any]] = [
        BASE,
        {**BASE, "temperature": 2, "top_p": 0, "n": 1, "seed": 7, "max_completion_tokens": 40},
        {**BASE, "response_format": {"type": "json_object"}},
        {
            **BASE,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "grade",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 10}},
                        "required": ["score"],
                        "additionalProperties": False,
                    },
                },
            },
        },
        {**BASE, "model": "o4-mini", "reasoning_effort": "low", "max_completion_tokens": 5000},
        {**BASE, "max_completion_tokens": 1},
        {
            **BASE,
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            ],
        },
    ]
    for body in bodies:
        assert validator("CreateChatCompletionRequest").is_valid(body), body
        assert_valid("CreateChatCompletionResponse", raw_json(client.chat.completions.with_raw_response.create(**body)))


def test_batch_and_file_objects_validate_through_the_lifecycle(client, clock):
    rows = [chat_line(f"r{i}", f"Grade essay {i}.") for i in range(3)]
    rows.append(chat_line("fail", "x __FAIL_500__"))
    up = raw_json(client.files.with_raw_response.create(file=("in.jsonl", jsonl(rows), "application/jsonl"), purpose="batch"))
    assert_valid("OpenAIFile", up)
    assert_valid("OpenAIFile", raw_json(client.files.with_raw_response.retrieve(up["id"])))
    create = {"input_file_id": up["id"], "endpoint": CHAT, "completion_window": "24h", "metadata": {"job": "1"}}
    assert validator("CreateBatchRequest").is_valid(create)
    batch = raw_json(client.batches.with_raw_response.create(**create))
    assert_valid("Batch", batch)
    seen = {batch["status"]}
    for _ in range(200):
        batch = raw_json(client.batches.with_raw_response.retrieve(batch["id"]))
        assert_valid("Batch", batch)
        seen.add(batch["status"])
        if batch["status"] == "completed":
            break
        clock.advance(0.02)
    assert {"validating", "in_progress", "completed"} <= seen
    assert_valid("ListBatchesResponse", raw_json(client.batches.with_raw_response.list()))
    for fid in (batch["output_file_id"], batch["error_file_id"]):
        assert_valid("OpenAIFile", raw_json(client.files.with_raw_response.retrieve(fid)))
    assert_valid("ListFilesResponse", raw_json(client.files.with_raw_response.list()))
    # every output line's body is a chat completion, every error line's an error response
    out = read_jsonl(client, batch["output_file_id"])
    assert len(out) == 3
    for line in out:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert_valid("CreateChatCompletionResponse", line["response"]["body"])
    for line in read_jsonl(client, batch["error_file_id"]):
        assert_valid("ErrorResponse", line["response"]["body"])
    # a cancelled batch, and a deleted file
    other = client.batches.create(input_file_id=up["id"], endpoint=CHAT, completion_window="24h")
    assert_valid("Batch", raw_json(client.batches.with_raw_response.cancel(other.id)))
    assert_valid("DeleteFileResponse", raw_json(client.files.with_raw_response.delete(up["id"])))


def test_error_answers_validate_as_error_responses(client):
    for call in (
        lambda: client.batches.retrieve("batch_missing"),
        lambda: client.files.retrieve("file-missing"),
        lambda: client.chat.completions.create(model="no-such-model", messages=BASE["messages"]),
        lambda: client.batches.cancel("batch_missing"),
        lambda: client.batches.create(input_file_id="file-x", endpoint=CHAT, completion_window="1h"),
    ):
        with pytest.raises(openai.APIStatusError) as info:
            call()
        assert_valid("ErrorResponse", info.value.response.json())


@pytest.mark.parametrize(
    ("expires", "param"),
    [
        ({"anchor": "created_at", "seconds": 60}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 2592001}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": "3600"}, "output_expires_after.seconds"),
        ({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor"),
        ({"seconds": 3600}, "output_expires_after.anchor"),
    ],
)
def test_batch_create_refuses_an_output_expiry_the_spec_forbids(client, expires, param):
    up = upload(client, jsonl([chat_line("r", "x")]))
    create = {"input_file_id": up.id, "endpoint": CHAT, "completion_window": "24h", "output_expires_after": expires}
    assert not validator("CreateBatchRequest").is_valid(create)
    assert batch_request_error(create) is not None
    with pytest.raises(openai.BadRequestError) as info:
        client.batches.create(**create)
    body = info.value.response.json()
    assert_valid("ErrorResponse", body)
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == param


def test_batch_create_takes_an_output_expiry_the_spec_allows(client):
    up = upload(client, jsonl([chat_line("r", "x")]))
    for seconds in (3600, 2592000):
        create = {
            "input_file_id": up.id,
            "endpoint": CHAT,
            "completion_window": "24h",
            "output_expires_after": {"anchor": "created_at", "seconds": seconds},
        }
        assert validator("CreateBatchRequest").is_valid(create)
        assert_valid("Batch", raw_json(client.batches.with_raw_response.create(**create)))


def test_the_pinned_spec_names_its_source():
    head = SPEC_FILE.read_text(encoding="utf-8").splitlines()[:4]
    assert "github.com/openai/openai-openapi" in head[0] and "commit " in head[1]
    assert SPEC["openapi"].startswith("3.1")

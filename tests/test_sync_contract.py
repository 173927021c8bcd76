"""The emulators' synchronous endpoints, through each provider's official SDK, and the contract
that what the emulators answer parses into the SDK's own types with every required field
present and no field the types do not know (issue 22, deliverable 6).  One module,
parametrised over the providers."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest

from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.pipeline.results import parse_line
from batchgrader.provider.anthropic_batches import AnthropicBatchProvider
from batchgrader.provider.azure_api import AzureOpenAIProvider
from batchgrader.provider.gemini_batches import GeminiBatchProvider
from batchgrader.provider.openai_api import OpenAIProvider, ProviderRejected

KEY = "sk-emulator-contract-0123456789abcdef"
AZURE_VERSION = "2025-04-01-preview"
AZURE_DEPLOYMENT = "grader-4o-mini"  # the emulator serves it (extra_models); any other name: 404


def strict_problems(model: Any, path: str = "$") -> list[str]:
    """Fields an SDK model was given that its type does not know, and required fields it lacks,
    recursively (pydantic models, lists and dicts of them)."""
    problems: list[str] = []
    if isinstance(model, pydantic.BaseModel):
        problems += [f"{path}.{k}: not a field of {type(model).__name__}" for k in (model.model_extra or {})]
        for name, field in type(model).model_fields.items():
            if field.is_required() and name not in model.model_fields_set:
                problems.append(f"{path}.{name}: required by {type(model).__name__}, missing")
            problems += strict_problems(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, (list, tuple)):
        for i, x in enumerate(model):
            problems += strict_problems(x, f"{path}[{i}]")
    elif isinstance(model, dict):
        for k, v in model.items():
            problems += strict_problems(v, f"{path}.{k}")
    return problems


def conforms(sdk_type: Any, obj: Any) -> None:
    """``obj`` (JSON from the emulator) is a valid ``sdk_type`` with nothing unknown, nothing missing."""
    model = sdk_type.model_validate(obj)
    assert strict_problems(model) == []


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    provider: Callable[[Emulator], Any]
    path: Callable[[str], str]  # model -> the synchronous endpoint's path
    request: Callable[[str, str], dict[str, Any]]  # (model, text) -> the native request body
    headers: dict[str, str]
    response_type: Callable[[], Any]


def _chat(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_completion_tokens": 400}


def _chat_completion_type() -> Any:
    from openai.types.chat import ChatCompletion

    return ChatCompletion


def _message_type() -> Any:
    from anthropic.types import Message

    return Message


def _generate_type() -> Any:
    from google.genai.types import GenerateContentResponse

    return GenerateContentResponse


CASES = [
    Case(
        "openai",
        "gpt-5.4-mini",
        lambda e: OpenAIProvider(api_key=KEY, base_url=e.base_url, timeout=10, max_retries=0),
        lambda m: "/v1/chat/completions",
        _chat,
        {"Authorization": f"Bearer {KEY}"},
        _chat_completion_type,
    ),
    Case(
        "azure",
        "grader-4o-mini",
        lambda e: AzureOpenAIProvider(KEY, e.root_url, AZURE_VERSION, timeout=10, max_retries=0),
        lambda m: f"/openai/deployments/{m}/chat/completions?api-version={AZURE_VERSION}",
        _chat,
        {"api-key": KEY},
        _chat_completion_type,
    ),
    Case(
        "anthropic",
        "claude-haiku-4-5",
        lambda e: AnthropicBatchProvider(KEY, e.root_url, timeout=10, max_retries=0),
        lambda m: "/v1/messages",
        lambda m, t: {"model": m, "max_tokens": 400, "messages": [{"role": "user", "content": t}]},
        {"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        _message_type,
    ),
    Case(
        "gemini",
        "gemini-2.5-flash",
        lambda e: GeminiBatchProvider(KEY, e.root_url, timeout=10, max_retries=0),
        lambda m: f"/v1beta/models/{m}:generateContent",
        lambda m, t: {
            "contents": [{"role": "user", "parts": [{"text": t}]}],
            "generationConfig": {"maxOutputTokens": 16000},
        },  # 2.5 Flash thinks by default
        {"x-goog-api-key": KEY},
        _generate_type,
    ),
]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def emu(clock: ManualClock) -> Iterator[Emulator]:
    with Emulator(
        EmulatorConfig(
            clock=clock, api_key=KEY, validating_s=1, in_progress_s=5, finalizing_s=1, extra_models=(AZURE_DEPLOYMENT,)
        )
    ) as e:
        yield e


def _http(emu: Emulator, method: str, path: str, headers: dict[str, str], body: Any = None) -> tuple[int, bytes]:
    req = urllib.request.Request(
        emu.root_url.rstrip("/") + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method=method,
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(emu: Emulator, case: Case, body: dict[str, Any]) -> tuple[int, Any]:
    status, data = _http(emu, "POST", case.path(case.model), case.headers, body)
    return status, json.loads(data)


def _line(case: Case, text: str, bound: int = 16000) -> dict[str, Any]:
    """One request line as the batch would carry it; the default bound leaves room for thinking (2.5 Flash thinks by default)."""
    body = {"model": case.model, "messages": [{"role": "user", "content": text}], "max_completion_tokens": bound}
    return {"custom_id": "row-1", "method": "POST", "url": "/v1/chat/completions", "body": body}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_sync_endpoint_answers_in_the_sdk_type(emu, case):
    status, obj = _post(emu, case, case.request(case.model, "Grade this essay: it is fine."))
    assert status == 200, obj
    conforms(case.response_type(), obj)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_provider_sends_one_request_through_the_sdk(emu, case):
    o = parse_line(case.provider(emu).complete(_line(case, "Grade this essay: it is fine.")))
    assert o.ok and o.custom_id == "row-1" and o.content and o.prompt_tokens > 0 and o.completion_tokens > 0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_small_bound_truncates_the_sync_answer_as_in_a_batch(emu, case):
    o = parse_line(case.provider(emu).complete(_line(case, "Grade this essay: it is fine.", bound=2)))
    assert not o.ok and o.error_code == "truncated"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_request_the_batch_path_fails_is_an_http_error_in_the_providers_shape(emu, case):
    with pytest.raises(ProviderRejected) as err:
        case.provider(emu).complete(_line(case, "please __FAIL_400__"))
    assert err.value.status_code == 400 and "__FAIL_400__" in str(err.value)


# --- the batch path: batch objects, result lines, errors ------------------------------------------


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(x) for x in data.splitlines() if x.strip()]


def _chat_line(cid: str, text: str, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_completion_tokens": 300}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _openai_batch(emu: Emulator, clock: ManualClock, tmp_path: Any) -> list[tuple[Any, Any]]:
    from openai.types import Batch, FileObject
    from openai.types.chat import ChatCompletion
    from openai.types.shared import ErrorObject

    case = CASES[0]
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(json.dumps(_chat_line(f"r{i}", t, case.model)) + "\n" for i, t in enumerate(["fine", "__FAIL_400__"]))
    )
    p = case.provider(emu)
    f = p.upload(path, path.name)
    b = p.create_batch(f.id)
    for _ in range(40):
        if p.retrieve(b.id).status == "completed":
            break
        clock.advance(1)
    _, raw_batch = _http(emu, "GET", f"/v1/batches/{b.id}", case.headers)
    batch = json.loads(raw_batch)
    _, raw_file = _http(emu, "GET", f"/v1/files/{f.id}", case.headers)
    out = _lines(_http(emu, "GET", f"/v1/files/{batch['output_file_id']}/content", case.headers)[1])
    err = _lines(_http(emu, "GET", f"/v1/files/{batch['error_file_id']}/content", case.headers)[1])
    _, missing = _http(emu, "GET", "/v1/batches/batch_nope", case.headers)
    return [
        (Batch, batch),
        (FileObject, json.loads(raw_file)),
        *[(ChatCompletion, x["response"]["body"]) for x in out],
        *[(ErrorObject, x["response"]["body"]["error"]) for x in err],
        (ErrorObject, json.loads(missing)["error"]),
    ]


def _anthropic_batch(emu: Emulator, clock: ManualClock, tmp_path: Any) -> list[tuple[Any, Any]]:
    import anthropic
    from anthropic.types import ErrorResponse
    from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

    case = CASES[2]
    client = anthropic.Anthropic(base_url=emu.root_url, api_key=KEY, max_retries=0)
    params = {"model": case.model, "max_tokens": 300}
    reqs = [
        {"custom_id": f"r{i}", "params": {**params, "messages": [{"role": "user", "content": t}]}}
        for i, t in enumerate(["fine", "__FAIL_400__"])
    ]
    b = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
    clock.advance(20)
    _, raw = _http(emu, "GET", f"/v1/messages/batches/{b.id}", case.headers)
    results = _lines(_http(emu, "GET", f"/v1/messages/batches/{b.id}/results", case.headers)[1])
    _, missing = _http(emu, "GET", "/v1/messages/batches/msgbatch_nope", case.headers)
    return [
        (MessageBatch, json.loads(raw)),
        *[(MessageBatchIndividualResponse, r) for r in results],
        (ErrorResponse, json.loads(missing)),
    ]


def _gemini_batch(emu: Emulator, clock: ManualClock, tmp_path: Any) -> list[tuple[Any, Any]]:
    from google.genai.types import GenerateContentResponse

    case = CASES[3]
    path = tmp_path / "bg-job1-c0000-a1.jsonl"
    path.write_text("".join(json.dumps(_chat_line(f"r{i}", f"essay {i}", case.model)) + "\n" for i in range(2)))
    p = case.provider(emu)
    b = p.create_batch(p.upload(path, path.name).id, metadata={"bg_key": "job1:0:1"})
    clock.advance(20)
    done = p.retrieve(b.id)
    from google import genai

    client = genai.Client(api_key=KEY, http_options=genai.types.HttpOptions(base_url=emu.root_url))
    raw = client.files.download(file=done.output_file_id or "")
    return [(GenerateContentResponse, line["response"]) for line in _lines(raw)]


BATCH_PATHS = {"openai": _openai_batch, "anthropic": _anthropic_batch, "gemini": _gemini_batch}


@pytest.mark.parametrize("name", sorted(BATCH_PATHS))
def test_every_batch_response_parses_into_the_sdk_types(emu, clock, tmp_path, name):
    got = BATCH_PATHS[name](emu, clock, tmp_path)
    assert len(got) >= 2
    for sdk_type, obj in got:
        model = sdk_type.model_validate(obj)
        assert strict_problems(model) == [], (sdk_type.__name__, obj)


def test_the_strict_check_sees_an_unknown_field_and_a_missing_one():
    from openai.types.chat import ChatCompletion

    good = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}],
    }
    assert strict_problems(ChatCompletion.model_validate(good)) == []
    extra = {**good, "choices": [{**good["choices"][0], "surprise": 1}]}
    assert strict_problems(ChatCompletion.model_validate(extra)) == ["$.choices[0].surprise: not a field of Choice"]
    with pytest.raises(pydantic.ValidationError):
        ChatCompletion.model_validate({k: v for k, v in good.items() if k != "choices"})


def test_a_body_key_the_sdk_has_no_argument_for_is_still_sent(emu):
    line = _line(CASES[0], "Grade this essay: it is fine.")
    line["body"]["bg_unknown_setting"] = 1  # e.g. a newer API parameter than the installed SDK knows
    o = parse_line(CASES[0].provider(emu).complete(line))
    assert o.ok

"""The Gemini Batch API: the emulator serves it to the official ``google-genai`` SDK over real HTTP,
and the adapter maps requests and results to and from the pipeline's OpenAI shapes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google import genai
from google.genai import errors, types

from batchgrader.emulator import Emulator, EmulatorConfig, Fault, ManualClock
from batchgrader.pipeline.results import RowOutcome, iter_outcomes, parse_line
from batchgrader.provider.gemini_api import (
    STATE_TO_STATUS,
    key_problem,
    parse_display_name,
    to_gemini_line,
    to_openai_result_line,
)
from batchgrader.provider.gemini_batches import GeminiBatchProvider
from batchgrader.provider.openai_api import OutcomeUnknown, ProviderConfigError, ProviderRejected, reconcile_batch
from batchgrader.provider.tls import genai_client_args
from emulator_fixtures import chat_line, jsonl

KEY = "AIza-gemini-emulator-test-0123456789abcdef"
MODEL = "gemini-2.5-flash"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def emu(clock: ManualClock) -> Iterator[Emulator]:
    with Emulator(EmulatorConfig(clock=clock, api_key=KEY, validating_s=1, in_progress_s=10, finalizing_s=1)) as e:
        yield e


def sdk(emu: Emulator, key: str = KEY) -> genai.Client:
    """The official client on ``emu``, on the SDK's own TLS contexts built once (provider/tls.py)."""
    client_args, async_client_args = genai_client_args()
    options = types.HttpOptions(base_url=emu.root_url, client_args=client_args, async_client_args=async_client_args)
    return genai.Client(api_key=key, http_options=options)


@pytest.fixture
def client(emu: Emulator) -> genai.Client:
    return sdk(emu)


@pytest.fixture
def provider(emu: Emulator) -> GeminiBatchProvider:
    return GeminiBatchProvider(KEY, emu.root_url, timeout=10, max_retries=2)


def outcomes_of(source: Any) -> dict[str, RowOutcome]:
    return {o.custom_id: o for o in iter_outcomes(source)}


def gline(key: str, text: str = "Grade this essay.", **gen: Any) -> dict[str, Any]:
    return {"key": key, "request": {"contents": [{"role": "user", "parts": [{"text": text}]}], "generationConfig": gen}}


def upload(client: genai.Client, tmp_path: Path, lines: list[dict[str, Any]], name: str = "in.jsonl") -> str:
    p = tmp_path / name
    p.write_bytes(jsonl(lines))
    f = client.files.upload(file=p, config={"display_name": name, "mime_type": "jsonl"})
    assert f.name
    return f.name


def chunk(tmp_path: Path, n: int, name: str = "bg-job1-c0000-a1.jsonl", model: str = MODEL, **kw: Any) -> Path:
    p = tmp_path / name
    p.write_bytes(jsonl(chat_line(f"job1-r{i}", f"Grade essay {i}.", model=model, system="You grade.", **kw) for i in range(n)))
    return p


# --- the emulator, through the official SDK ---------------------------------------------------


def test_sdk_upload_create_get_download_lifecycle(client: genai.Client, clock: ManualClock, tmp_path: Path) -> None:
    name = upload(
        client, tmp_path, [gline("a-1", maxOutputTokens=8000), gline("a-2", "__FAIL_400__"), gline("a-3", "__FAIL_500__")]
    )
    b = client.batches.create(model=MODEL, src=name, config={"display_name": "job:0:1"})
    assert b.state == types.JobState.JOB_STATE_PENDING and b.display_name == "job:0:1" and b.name.startswith("batches/")
    clock.advance(2)
    assert client.batches.get(name=b.name).state == types.JobState.JOB_STATE_RUNNING
    clock.advance(20)
    done = client.batches.get(name=b.name)
    assert done.state == types.JobState.JOB_STATE_SUCCEEDED and done.done and done.dest and done.dest.file_name
    lines = {r["key"]: r for r in map(json.loads, client.files.download(file=done.dest.file_name).splitlines())}
    assert set(lines) == {"a-1", "a-2", "a-3"}
    u = lines["a-1"]["response"]["usageMetadata"]
    assert u["promptTokenCount"] > 0 and u["candidatesTokenCount"] > 0 and u["thoughtsTokenCount"] > 0
    assert u["totalTokenCount"] == u["promptTokenCount"] + u["candidatesTokenCount"] + u["thoughtsTokenCount"]
    assert lines["a-2"]["error"]["status"] == "INVALID_ARGUMENT" and lines["a-2"]["error"]["code"] == 3
    assert lines["a-3"]["error"]["status"] == "INTERNAL"
    with pytest.raises(errors.ClientError) as exc:  # uploaded files cannot be downloaded (as the real API)
        client.files.download(file=name)
    assert exc.value.code == 400


def test_sdk_structured_output_is_valid_json_for_the_schema(client: genai.Client, clock: ManualClock, tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}, "reason": {"type": "string"}},
        "required": ["score", "reason"],
        "additionalProperties": False,
    }
    lines = [
        gline(f"s-{i}", maxOutputTokens=400, responseMimeType="application/json", responseJsonSchema=schema) for i in range(3)
    ]
    b = client.batches.create(model="gemini-2.5-flash-lite", src=upload(client, tmp_path, lines), config={"display_name": "s"})
    clock.advance(20)
    done = client.batches.get(name=b.name)
    for raw in client.files.download(file=done.dest.file_name).splitlines():  # type: ignore[union-attr]
        text = json.loads(raw)["response"]["candidates"][0]["content"]["parts"][0]["text"]
        obj = json.loads(text)
        assert 1 <= obj["score"] <= 5 and isinstance(obj["reason"], str)


def test_sdk_inline_requests_cancel_and_expiry(clock: ManualClock, tmp_path: Path) -> None:
    cfg = EmulatorConfig(clock=clock, api_key=KEY, validating_s=1, in_progress_s=10, finalizing_s=0, completion_window_s=6)
    with Emulator(cfg) as e:
        c = sdk(e)
        inline = [{"contents": [{"role": "user", "parts": [{"text": f"q{i}"}]}], "metadata": {"key": f"k{i}"}} for i in range(10)]
        expiring = c.batches.create(model=MODEL, src=inline, config={"display_name": "exp"})  # type: ignore[arg-type]
        cancelled = c.batches.create(
            model=MODEL, src=upload(c, tmp_path, [gline(f"c{i}") for i in range(10)]), config={"display_name": "can"}
        )
        clock.advance(3.5)
        c.batches.cancel(name=cancelled.name)
        clock.advance(10)
        exp = c.batches.get(name=expiring.name)
        can = c.batches.get(name=cancelled.name)
        assert exp.state == types.JobState.JOB_STATE_EXPIRED and can.state == types.JobState.JOB_STATE_CANCELLED
        assert exp.dest and exp.dest.inlined_responses and 0 < len(exp.dest.inlined_responses) < 10
        kept = c.files.download(file=can.dest.file_name).splitlines()  # type: ignore[union-attr]
        assert 0 < len(kept) < 10  # the requests processed before the cancel keep their answers
        with pytest.raises(errors.ClientError):  # an ended batch cannot be cancelled
            c.batches.cancel(name=cancelled.name)


def test_sdk_list_pages_newest_first_and_delete(client: genai.Client, tmp_path: Path) -> None:
    name = upload(client, tmp_path, [gline("x")])
    made = [client.batches.create(model=MODEL, src=name, config={"display_name": f"b{i}"}).name for i in range(3)]
    pager = client.batches.list(config={"page_size": 2})
    assert [b.name for b in pager.page] == made[::-1][:2] and pager.config["page_token"]
    assert [b.name for b in pager] == made[::-1]
    client.batches.delete(name=made[0])
    with pytest.raises(errors.ClientError) as exc:
        client.batches.get(name=made[0])
    assert exc.value.code == 404 and exc.value.status == "NOT_FOUND"


def test_sdk_sees_google_error_shapes(emu: Emulator, client: genai.Client, tmp_path: Path) -> None:
    with pytest.raises(errors.ClientError) as exc:
        client.batches.create(model="claude-haiku-4-5", src=upload(client, tmp_path, [gline("x")]), config={"display_name": "x"})
    assert exc.value.code == 404 and exc.value.status == "NOT_FOUND"
    wrong = sdk(emu, "AIza-wrong")  # (keep the client referenced: a collected Client closes its connection)
    with pytest.raises(errors.ClientError) as exc:
        wrong.batches.list()
    assert exc.value.code == 400 and "API key not valid" in str(exc.value.message)
    emu.script_fault("GET", "/v1beta/batches", Fault("status", status=503))
    with pytest.raises(errors.ServerError) as sexc:
        client.batches.list()
    assert sexc.value.code == 503 and sexc.value.status == "UNAVAILABLE"


def test_sdk_count_tokens_matches_the_batch_usage(client: genai.Client, clock: ManualClock, tmp_path: Path) -> None:
    text = "Grade this essay about the quick brown fox."
    n = client.models.count_tokens(model=MODEL, contents=[{"role": "user", "parts": [{"text": text}]}]).total_tokens
    b = client.batches.create(model=MODEL, src=upload(client, tmp_path, [gline("t", text)]), config={"display_name": "t"})
    clock.advance(20)
    done = client.batches.get(name=b.name)
    line = json.loads(client.files.download(file=done.dest.file_name))  # type: ignore[union-attr]
    assert n and line["response"]["usageMetadata"]["promptTokenCount"] == n


# --- the adapter: request building and result parsing ------------------------------------------


def test_request_building_from_a_pipeline_line() -> None:
    line = chat_line("r-1", "The essay.", model=MODEL, system="You grade essays.", max_completion_tokens=77, temperature=0.2)
    line["body"]["messages"] += [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Grade it."}]
    line["body"]["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "g", "strict": True, "schema": {"type": "object"}},
    }
    out = to_gemini_line(line)
    assert out["key"] == "r-1"
    req = out["request"]
    assert req["systemInstruction"] == {"parts": [{"text": "You grade essays."}]}
    assert [(c["role"], c["parts"][0]["text"]) for c in req["contents"]] == [
        ("user", "The essay."),
        ("model", "Noted."),
        ("user", "Grade it."),
    ]
    assert req["generationConfig"] == {
        "maxOutputTokens": 77,
        "temperature": 0.2,
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object"},
    }
    assert key_problem("r-1") is None and key_problem("") and key_problem("x" * 513)


def test_result_parsing_from_documented_examples() -> None:
    # the shape of Google's documented GenerateContentResponse (usageMetadata with cached and thinking tokens)
    ok = {
        "key": "request-1",
        "response": {
            "candidates": [
                {
                    "content": {"parts": [{"text": "thinking...", "thought": True}, {"text": "Score: 4"}], "role": "model"},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 120,
                "cachedContentTokenCount": 100,
                "candidatesTokenCount": 9,
                "thoughtsTokenCount": 31,
                "totalTokenCount": 160,
            },
            "modelVersion": "gemini-2.5-flash",
            "responseId": "abc",
        },
    }
    out = to_openai_result_line(ok)
    o = parse_line(out)
    assert o.ok and o.custom_id == "request-1" and o.content == "Score: 4" and o.finish_reason == "stop"
    assert (o.prompt_tokens, o.cached_tokens, o.completion_tokens, o.reasoning_tokens) == (120, 100, 40, 31)
    assert out["response"]["body"]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 31
    assert out["response"]["body"]["gemini_usage"]["thoughtsTokenCount"] == 31
    truncated = json.loads(json.dumps(ok))
    truncated["response"]["candidates"][0]["finishReason"] = "MAX_TOKENS"
    assert parse_line(to_openai_result_line(truncated)).finish_reason == "length"
    err = to_openai_result_line({"key": "request-2", "error": {"code": 3, "message": "bad", "status": "INVALID_ARGUMENT"}})
    e = parse_line(err)
    assert not e.ok and err["response"]["status_code"] == 400 and "bad" in (e.error_message or "")
    blocked = to_openai_result_line({"key": "request-3", "response": {"promptFeedback": {"blockReason": "SAFETY"}}})
    assert blocked["response"]["status_code"] == 400 and "SAFETY" in blocked["response"]["body"]["error"]["message"]
    read = outcomes_of([json.dumps(out), json.dumps(err)])  # the pipeline reads them like OpenAI lines
    assert read["request-1"].ok and not read["request-2"].ok
    with pytest.raises(ValueError):
        to_openai_result_line({"response": {}})


def test_states_and_display_names() -> None:
    assert STATE_TO_STATUS["JOB_STATE_PENDING"] == "validating" and STATE_TO_STATUS["JOB_STATE_RUNNING"] == "in_progress"
    assert [STATE_TO_STATUS[f"JOB_STATE_{s}"] for s in ("SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED")] == [
        "completed",
        "failed",
        "cancelled",
        "expired",
    ]
    assert parse_display_name("a1b2:3:1") == {"bg_job": "a1b2", "bg_chunk": "3", "bg_attempt": "1", "bg_key": "a1b2:3:1"}
    assert parse_display_name("my batch") == {} and parse_display_name(None) == {} and parse_display_name(":1:2") == {}


# --- the engine-facing provider ----------------------------------------------------------------


def test_provider_end_to_end_usage_is_exact(
    provider: GeminiBatchProvider, client: genai.Client, clock: ManualClock, tmp_path: Path
) -> None:
    path = chunk(tmp_path, 4, max_completion_tokens=16000)  # 2.5 Flash thinks by default: room for it
    f = provider.upload(path, path.name)
    assert f.id.startswith("files/") and f.filename == path.name
    assert not list(tmp_path.glob("*.gemini.jsonl"))  # the converted file is gone once uploaded
    assert [x.id for x in provider.find_files(path.name)] == [f.id]
    b = provider.create_batch(f.id, metadata={"bg_key": "job1:0:1", "bg_job": "job1"})
    assert b.status == "validating" and b.metadata["bg_chunk"] == "0" and b.input_file_id == f.id
    clock.advance(20)
    done = provider.retrieve(b.id)
    assert done.status == "completed" and done.output_file_id and done.output_file_id.startswith("files/batch-")
    n = provider.download(done.output_file_id, tmp_path / "out.jsonl")
    assert n == (tmp_path / "out.jsonl").stat().st_size
    outcomes = outcomes_of(tmp_path / "out.jsonl")
    assert sorted(outcomes) == [f"job1-r{i}" for i in range(4)] and all(o.ok for o in outcomes.values())
    reported = [
        json.loads(raw)["response"]["usageMetadata"] for raw in client.files.download(file=done.output_file_id).splitlines()
    ]
    assert sum(o.prompt_tokens for o in outcomes.values()) == sum(u["promptTokenCount"] for u in reported)
    assert sum(o.completion_tokens for o in outcomes.values()) == sum(
        u["candidatesTokenCount"] + u.get("thoughtsTokenCount", 0) for u in reported
    )
    assert sum(o.reasoning_tokens for o in outcomes.values()) == sum(u.get("thoughtsTokenCount", 0) for u in reported) > 0
    assert provider.delete_file(done.output_file_id) is True and provider.delete_file(done.output_file_id) is False


def test_provider_cancel_maps_to_cancelled(provider: GeminiBatchProvider, clock: ManualClock, tmp_path: Path) -> None:
    path = chunk(tmp_path, 3)
    b = provider.create_batch(provider.upload(path, path.name).id, metadata={"bg_key": "job1:0:1"})
    clock.advance(2)
    assert provider.cancel(b.id).status in ("in_progress", "cancelling")
    clock.advance(5)
    assert provider.retrieve(b.id).status == "cancelled"
    with pytest.raises(ProviderRejected):
        provider.cancel(b.id)


def test_provider_refuses_bad_input_before_sending(emu: Emulator, provider: GeminiBatchProvider, tmp_path: Path) -> None:
    mixed = tmp_path / "bg-j-c0000-a1.jsonl"
    mixed.write_bytes(jsonl([chat_line("a", "x", model=MODEL), chat_line("b", "y", model="gemini-2.5-pro")]))
    with pytest.raises(ProviderRejected, match="one model"):
        provider.upload(mixed, mixed.name)
    empty_key = tmp_path / "bg-j-c0001-a1.jsonl"
    empty_key.write_bytes(jsonl([chat_line("", "x", model=MODEL)]))
    with pytest.raises(ProviderRejected, match="Gemini batch key"):
        provider.upload(empty_key, empty_key.name)
    assert emu.request_count("POST", "/upload/v1beta/files") == 0
    with pytest.raises(ProviderConfigError, match="GEMINI_API_KEY"):
        GeminiBatchProvider(None, emu.root_url)


def test_create_outcome_unknown_then_reconciled_by_display_name(
    emu: Emulator, provider: GeminiBatchProvider, clock: ManualClock, tmp_path: Path
) -> None:
    path = chunk(tmp_path, 2)
    f = provider.upload(path, path.name)
    other = provider.create_batch(f.id, metadata={"bg_key": "job1:0:0"})  # an earlier attempt: never adopted
    emu.script_fault("POST", "/v1beta/models/{model}:batchGenerateContent", Fault("drop_after"))
    with pytest.raises(OutcomeUnknown):
        provider.create_batch(f.id, metadata={"bg_key": "job1:0:1"})
    assert emu.batches_created() == 2
    fresh = GeminiBatchProvider(KEY, emu.root_url, timeout=10)  # a restarted daemon: no memory of the create
    found = reconcile_batch(fresh, f.id, {"bg_key": "job1:0:1"})
    assert found.outcome == "adopted" and found.batch and found.batch.id != other.id and not found.duplicates
    assert found.batch.metadata["bg_attempt"] == "1"
    # a recovered job (no input file known): the input is the file uploaded under the attempt's name
    recovered = fresh.find_batches(metadata={"bg_job": "job1"})
    assert {b.metadata["bg_attempt"] for b in recovered} == {"0", "1"}
    by_attempt = {b.metadata["bg_attempt"]: b.input_file_id for b in recovered}
    assert by_attempt == {"1": f.id, "0": ""}  # nothing was uploaded under attempt 0's name
    assert reconcile_batch(fresh, f.id, {"bg_key": "job1:0:7"}).outcome == "not_created"


def test_a_lost_upload_reply_is_outcome_unknown(emu: Emulator, provider: GeminiBatchProvider, tmp_path: Path) -> None:
    path = chunk(tmp_path, 1)  # answered errors to a create: tests/provider_contract.py
    emu.script_fault("POST", "/upload/v1beta/files", Fault("drop_after"))
    with pytest.raises(OutcomeUnknown):
        provider.upload(path, path.name)


def test_emulator_keeps_gemini_files_and_batches_across_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    cfg = EmulatorConfig(clock=clock, api_key=KEY, data_dir=str(tmp_path / "emu"))
    with Emulator(cfg) as e:
        c = sdk(e)
        b = c.batches.create(model=MODEL, src=upload(c, tmp_path, [gline("p-1"), gline("p-2")]), config={"display_name": "keep"})
    clock.advance(5)
    with Emulator(cfg) as e:
        c = sdk(e)
        again = c.batches.get(name=b.name)
        assert again.state == types.JobState.JOB_STATE_SUCCEEDED and again.display_name == "keep"
        assert len(c.files.download(file=again.dest.file_name).splitlines()) == 2  # type: ignore[union-attr]


def test_a_list_round_and_a_recovered_jobs_search_find_gemini_batches(tmp_path: Path, emu: Emulator, clock: ManualClock) -> None:
    from batchgrader.provider.openai_api import list_statuses

    gem = GeminiBatchProvider(KEY, emu.root_url, timeout=10)
    ids = set()
    for i in range(3):
        name = f"bg-gemini_{i}-c0000-a1.jsonl"
        path = tmp_path / name
        path.write_bytes(jsonl(chat_line(f"r-{i}", "x", model=MODEL) for _ in range(1)))
        ids.add(gem.create_batch(gem.upload(path, name).id, metadata={"bg_key": f"gemini_{i}:0:1"}).id)
    assert all(i.startswith("batches/") for i in ids)
    assert set(list_statuses(gem, ids)) == ids
    assert [b.metadata["bg_job"] for b in gem.find_batches(metadata={"bg_job": "gemini_1"})] == ["gemini_1"]


def test_a_read_told_to_wait_is_transient_not_a_refusal(
    emu: Emulator, provider: GeminiBatchProvider, clock: ManualClock, tmp_path: Path
) -> None:
    from batchgrader.provider.openai_api import ProviderUnavailable

    path = chunk(tmp_path, 1)
    b = provider.create_batch(provider.upload(path, path.name).id, metadata={"bg_key": "j:0:1"})
    clock.advance(20)
    out = provider.retrieve(b.id).output_file_id
    assert out
    emu.script_fault("GET", "/v1beta/files/{id}:download", Fault("status", status=429, retry_after=0))
    with pytest.raises(ProviderUnavailable):  # the engine downloads again later; a 429 is not "gone"
        provider.download(out, tmp_path / "o.jsonl")
    assert provider.download(out, tmp_path / "o.jsonl") > 0


SCHEMA = {"type": "json_schema", "json_schema": {"name": "g", "strict": True, "schema": {"type": "object"}}}


def test_token_counter_gives_the_counts_the_batch_is_billed(
    emu: Emulator, provider: GeminiBatchProvider, clock: ManualClock, tmp_path: Path
) -> None:
    """Exact: the whole request (system prompt and generation config) is counted, as billed."""
    from batchgrader.provider.gemini_batches import GeminiTokenCounter, gemini_counter

    path = tmp_path / "bg-j-c0000-a1.jsonl"
    lines = [
        chat_line(
            f"c-{i}", f"Essay {i}: " + "words " * i, model=MODEL, system="You grade essays strictly.", response_format=SCHEMA
        )
        for i in range(3)
    ]
    path.write_bytes(jsonl(lines))
    counter = GeminiTokenCounter(provider)
    assert counter.name == "gemini"
    counts = counter.count_tokens(lines)
    # one call per request, plus the one check that the full request was honoured
    assert emu.request_count("POST", "/v1beta/models/{model}:countTokens") == 3 + 1
    b = provider.create_batch(provider.upload(path, path.name).id, metadata={"bg_key": "j:0:1"})
    clock.advance(20)
    provider.download(provider.retrieve(b.id).output_file_id or "", tmp_path / "o.jsonl")
    billed = {k: o.prompt_tokens for k, o in outcomes_of(tmp_path / "o.jsonl").items()}
    assert [billed[f"c-{i}"] for i in range(3)] == counts  # exact, system prompt included
    assert all(n > provider.count_contents_tokens(MODEL, line) for n, line in zip(counts, lines, strict=True))
    assert counter.count_tokens(lines[:1]) == counts[:1]  # checked once per counter
    assert emu.request_count("POST", "/v1beta/models/{model}:countTokens") == 3 + 1 + 3 + 1
    assert gemini_counter({"gemini_api_key": None}) is None
    assert isinstance(gemini_counter({"gemini_api_key": KEY, "gemini_base_url": emu.root_url}), GeminiTokenCounter)


def test_sdk_count_tokens_takes_the_whole_request_only_through_extra_body(client: genai.Client) -> None:
    """The SDK refuses a system instruction on the Developer API before sending; the API's own
    ``generateContentRequest`` field, given through ``HttpOptions.extra_body``, counts it; a
    system instruction at the top level is refused as the API refuses it."""
    contents = [{"role": "user", "parts": [{"text": "Grade this essay."}]}]
    system = {"parts": [{"text": "You are a strict grader of essays."}]}
    with pytest.raises(ValueError, match="not in Gemini Developer API mode"):
        client.models.count_tokens(model=MODEL, contents=contents, config=types.CountTokensConfig(system_instruction="x"))
    alone = client.models.count_tokens(model=MODEL, contents=contents).total_tokens
    full = {
        "model": f"models/{MODEL}",
        "contents": contents,
        "systemInstruction": system,
        "generationConfig": {"maxOutputTokens": 9},
    }
    opts = types.HttpOptions(extra_body={"generateContentRequest": full})
    both = client.models.count_tokens(model=MODEL, contents=contents, config=types.CountTokensConfig(http_options=opts))
    assert alone and both.total_tokens and both.total_tokens > alone
    stray = types.HttpOptions(extra_body={"systemInstruction": system})
    with pytest.raises(errors.ClientError) as exc:
        client.models.count_tokens(model=MODEL, contents=contents, config=types.CountTokensConfig(http_options=stray))
    assert exc.value.code == 400 and "generate_content_request.model: model is not specified" in str(exc.value.message)


def test_token_counter_refuses_an_endpoint_that_ignores_the_full_request(tmp_path: Path) -> None:
    """Counts without the system prompt must not be called exact: the counter raises, and the
    counting hook keeps the estimates with the reason."""
    from batchgrader.provider.counting import exact_counts
    from batchgrader.provider.gemini_batches import GeminiTokenCounter

    with Emulator(EmulatorConfig(api_key=KEY, gemini_count_contents_only=True)) as e:
        counter = GeminiTokenCounter(GeminiBatchProvider(KEY, e.root_url, timeout=10, max_retries=0))
        plain = [chat_line("p", "no system prompt here", model=MODEL)]
        assert counter.count_tokens(plain)  # exact: nothing but contents to count
        found = exact_counts(counter, [chat_line("s", "Essay.", model=MODEL, system="You grade.")])
    assert not found.exact and "ignored generateContentRequest" in (found.reason or "")


def test_count_gives_exact_gemini_counts_with_a_key_and_estimates_without(tmp_path: Path, home, emu, monkeypatch) -> None:  # noqa: ANN001
    from click.testing import CliRunner

    from batchgrader.cli.commands import cli

    for var in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    home.config_file.write_text(
        "profiles:\n  gem:\n    provider: gemini\n    model: gemini-2.5-flash\n    system_prompt: You grade.\n"
    )
    f = tmp_path / "data.csv"
    f.write_text("response\nfirst essay\nsecond essay\n")
    runner = CliRunner()
    res = json.loads(runner.invoke(cli, ["count", str(f), "--json", "--profile", "gem"]).output)
    assert res["input_tokens_exact"] is False and res["provider"] == "gemini" and res["input_tokens"] > 0
    assert "no API key" in res["token_count"]["reason"]
    assert res["estimated_cost_usd"]  # priced from the shipped Gemini batch prices
    assert "ESTIMATE" in runner.invoke(cli, ["count", str(f), "--profile", "gem"]).output
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", emu.root_url)
    exact = json.loads(runner.invoke(cli, ["count", str(f), "--json", "--profile", "gem"]).output)
    assert exact["input_tokens_exact"] is True and exact["token_count"]["source"] == "gemini counting endpoint"
    billed = emu.request_count("POST", "/v1beta/models/{model}:countTokens")
    assert billed == 2 + 1 and exact["token_count"]["sent"] == 2
    again = json.loads(runner.invoke(cli, ["count", str(f), "--json", "--profile", "gem"]).output)
    assert again["input_tokens"] == exact["input_tokens"] and again["token_count"]["cached"] == 2
    assert emu.request_count("POST", "/v1beta/models/{model}:countTokens") == billed  # the cache answered
    assert "ESTIMATE" not in runner.invoke(cli, ["count", str(f), "--profile", "gem"]).output

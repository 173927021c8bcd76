"""Anthropic Message Batches: the emulator serves them to the official ``anthropic`` SDK over real
HTTP, and the adapter maps requests and results to and from the pipeline's OpenAI shapes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from batchgrader.emulator import Emulator, EmulatorConfig, Fault, ManualClock
from batchgrader.pipeline.results import iter_outcomes, parse_line
from batchgrader.provider.anthropic_api import (
    AnthropicProvider,
    custom_id_problem,
    to_anthropic_request,
    to_openai_result_line,
)
from batchgrader.provider.openai_api import OutcomeUnknown, ProviderConfigError, ProviderRejected, ProviderUnavailable
from emulator_fixtures import chat_line
from harness import merged

KEY = "sk-ant-emulator-test-0123456789abcdef"
MODEL = "claude-haiku-4-5"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def emu(clock: ManualClock) -> Iterator[Emulator]:
    with Emulator(EmulatorConfig(clock=clock, api_key=KEY, validating_s=1, in_progress_s=10, finalizing_s=1)) as e:
        yield e


@pytest.fixture
def client(emu: Emulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=emu.root_url, api_key=KEY, max_retries=0)


@pytest.fixture
def provider(emu: Emulator) -> AnthropicProvider:
    return AnthropicProvider(KEY, emu.root_url, timeout=10, max_retries=2)


def req(cid: str, text: str = "Grade this essay.", **params: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "params": {"model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": text}], **params},
    }


# --- the emulator, through the official SDK ---------------------------------------------------


def test_sdk_create_retrieve_results_lifecycle(client: anthropic.Anthropic, clock: ManualClock) -> None:
    b = client.messages.batches.create(requests=[req("a-1"), req("a-2", "__FAIL_400__"), req("a-3", "__FAIL_500__")])  # type: ignore[list-item]
    assert b.id.startswith("msgbatch_") and b.type == "message_batch"
    assert b.processing_status == "in_progress" and b.results_url is None
    assert b.request_counts.processing == 3
    assert (b.expires_at - b.created_at).total_seconds() == 86400
    clock.advance(12)
    b = client.messages.batches.retrieve(b.id)
    assert b.processing_status == "ended" and b.ended_at is not None
    assert (b.request_counts.succeeded, b.request_counts.errored, b.request_counts.processing) == (1, 2, 0)
    assert b.results_url and b.results_url.startswith("http://") and b.results_url.endswith(f"/{b.id}/results")
    results = {r.custom_id: r.result for r in client.messages.batches.results(b.id)}
    assert results["a-1"].type == "succeeded"
    msg = results["a-1"].message  # type: ignore[union-attr]
    assert msg.model == MODEL and msg.usage.input_tokens > 0 and msg.usage.service_tier == "batch"
    assert results["a-2"].type == "errored" and results["a-2"].error.error.type == "invalid_request_error"  # type: ignore[union-attr]
    assert results["a-3"].type == "errored" and results["a-3"].error.error.type == "api_error"  # type: ignore[union-attr]


def test_sdk_structured_output_is_valid_json_for_the_schema(client: anthropic.Anthropic, clock: ManualClock) -> None:
    schema = {
        "type": "object",
        "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}, "why": {"type": "string"}},
        "required": ["score", "why"],
    }
    fmt = {"format": {"type": "json_schema", "schema": schema}}
    b = client.messages.batches.create(requests=[req(f"s-{i}", f"essay {i}", output_config=fmt) for i in range(5)])  # type: ignore[misc]
    clock.advance(12)
    for r in client.messages.batches.results(b.id):
        data = json.loads(r.result.message.content[0].text)  # type: ignore[union-attr]
        assert set(data) >= {"score", "why"} and 1 <= data["score"] <= 5


def test_sdk_cancel_and_expiry(clock: ManualClock) -> None:
    cfg = EmulatorConfig(clock=clock, api_key=KEY, validating_s=0, in_progress_s=10, finalizing_s=0, completion_window_s=5)
    with Emulator(cfg) as emu:
        c = anthropic.Anthropic(base_url=emu.root_url, api_key=KEY, max_retries=0)
        expiring = c.messages.batches.create(requests=[req(f"e-{i}") for i in range(10)])  # type: ignore[misc]
        clock.advance(3)
        cancelled = c.messages.batches.create(requests=[req(f"c-{i}") for i in range(4)])  # type: ignore[misc]
        assert c.messages.batches.cancel(cancelled.id).processing_status == "canceling"
        clock.advance(3)
        e = c.messages.batches.retrieve(expiring.id)
        assert e.processing_status == "ended"
        assert (e.request_counts.succeeded, e.request_counts.expired) == (5, 5)
        k = c.messages.batches.retrieve(cancelled.id)
        assert k.processing_status == "ended" and k.request_counts.canceled == 4 and k.cancel_initiated_at is not None
        types = sorted(r.result.type for r in c.messages.batches.results(expiring.id))
        assert types == ["expired"] * 5 + ["succeeded"] * 5
        assert c.messages.batches.delete(cancelled.id).type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            c.messages.batches.retrieve(cancelled.id)


def test_sdk_list_pages_newest_first(client: anthropic.Anthropic) -> None:
    ids = [client.messages.batches.create(requests=[req(f"l-{i}")]).id for i in range(5)]  # type: ignore[list-item]
    first = client.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    assert [b.id for b in client.messages.batches.list(limit=2)] == ids[::-1]  # auto-paging via after_id


def test_sdk_sees_anthropic_error_shapes(emu: Emulator, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.batches.retrieve("msgbatch_missing")
    assert nf.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "Message batch msgbatch_missing not found."},
    }
    with pytest.raises(anthropic.AuthenticationError) as au:
        anthropic.Anthropic(base_url=emu.root_url, api_key="sk-ant-wrong-key-000000", max_retries=0).messages.batches.list()
    assert au.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert "sk-ant-wrong" not in json.dumps(au.value.body)
    for bad in ([req("has space")], [req("x" * 65)], [req("dup"), req("dup")], []):
        with pytest.raises(anthropic.BadRequestError) as br:
            client.messages.batches.create(requests=bad)  # type: ignore[arg-type]
        assert br.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert emu.batches_created() == 0
    emu.script_fault("POST", "/v1/messages/batches", Fault("status", status=529))
    with pytest.raises(anthropic.InternalServerError) as ov:
        client.messages.batches.create(requests=[req("ok")])  # type: ignore[list-item]
    assert ov.value.status_code == 529 and ov.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


def test_sdk_count_tokens_matches_the_batch_usage(client: anthropic.Anthropic, clock: ManualClock) -> None:
    messages = [{"role": "user", "content": "Grade the essay about rivers."}]
    counted = client.messages.count_tokens(model=MODEL, system="Be fair.", messages=messages).input_tokens  # type: ignore[arg-type]
    b = client.messages.batches.create(requests=[req("t-1", messages[0]["content"], system="Be fair.")])  # type: ignore[list-item]
    clock.advance(12)
    (r,) = list(client.messages.batches.results(b.id))
    assert r.result.message.usage.input_tokens == counted > 0  # type: ignore[union-attr]


# --- the adapter: request building and result parsing from Anthropic's documented examples ----


def test_request_building_from_a_pipeline_line() -> None:
    schema = {"type": "object", "properties": {"grade": {"type": "string"}}, "required": ["grade"]}
    line = chat_line(
        "row-7",
        "Please evaluate the following text: hello",
        model=MODEL,
        system="You are a careful grader.",
        max_completion_tokens=300,
        temperature=0.2,
        response_format={"type": "json_schema", "json_schema": {"name": "grade", "strict": True, "schema": schema}},
    )
    assert to_anthropic_request(line) == {
        "custom_id": "row-7",
        "params": {
            "model": MODEL,
            "max_tokens": 300,
            "messages": [{"role": "user", "content": "Please evaluate the following text: hello"}],
            "system": "You are a careful grader.",
            "temperature": 0.2,
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        },
    }


def test_custom_id_rule() -> None:
    assert custom_id_problem("abc_DEF-123") is None
    assert custom_id_problem("x" * 64) is None
    for bad in ("", "x" * 65, "has space", "dot.ted", "ümlaut"):
        assert custom_id_problem(bad) is not None


# The result lines documented in Anthropic's batch-processing guide ("Retrieving batch results"),
# with the usage fields of the Messages API reference (checked 2026-11-23).
DOC_SUCCEEDED = {
    "custom_id": "my-second-request",
    "result": {
        "type": "succeeded",
        "message": {
            "id": "msg_014VwiXbi91y3JMjcpyGBHX5",
            "type": "message",
            "role": "assistant",
            "model": "claude-opus-4-7",
            "content": [{"type": "text", "text": "Hello again! It's nice to see you."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 11,
                "cache_creation_input_tokens": 7,
                "cache_read_input_tokens": 2048,
                "output_tokens": 36,
                "output_tokens_details": {"thinking_tokens": 20},
            },
        },
    },
}
DOC_ERRORED = {
    "custom_id": "my-first-request",
    "result": {
        "type": "errored",
        "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "Validation error..."}},
    },
}


def test_result_parsing_from_documented_examples() -> None:
    ok = parse_line(to_openai_result_line(DOC_SUCCEEDED))
    assert ok.ok and ok.content == "Hello again! It's nice to see you." and ok.finish_reason == "stop"
    assert (ok.prompt_tokens, ok.cached_tokens, ok.completion_tokens, ok.reasoning_tokens) == (11 + 7 + 2048, 2048, 36, 20)
    bad = parse_line(to_openai_result_line(DOC_ERRORED))
    assert not bad.ok and bad.status_code == 400 and bad.error_message == "Validation error..."
    for kind, code in (("canceled", "batch_cancelled"), ("expired", "batch_expired")):
        o = parse_line(to_openai_result_line({"custom_id": "r", "result": {"type": kind}}))
        assert not o.ok and o.error_code == code
    with pytest.raises(ValueError):
        to_openai_result_line({"custom_id": "r", "result": {"type": "mystery"}})


# --- the adapter against the emulator ---------------------------------------------------------


def test_adapter_end_to_end_usage_is_exact(provider: AnthropicProvider, client: anthropic.Anthropic, clock: ManualClock) -> None:
    lines = [chat_line(f"row-{i}", f"Essay {i} about bridges.", model=MODEL, system="Grade it.") for i in range(6)]
    lines.append(chat_line("row-bad", "__FAIL_400__", model=MODEL))
    b = create_from_lines(provider, lines)
    assert (b.status, b.job_status, b.total) == ("in_progress", "in_progress", 7)
    clock.advance(12)
    b = provider.retrieve(b.id)
    assert (b.job_status, b.succeeded, b.errored) == ("completed", 6, 1)
    records, m = merged(
        [x["custom_id"] for x in lines], iter_outcomes(json.dumps(x) for x in provider.results(b.id)), "completed"
    )
    assert not [r for r in records if r.get("error_code") == "missing_result"]  # every row has its outcome
    raw = {r.custom_id: r.result for r in client.messages.batches.results(b.id)}
    expected_in = sum(r.message.usage.input_tokens for r in raw.values() if r.type == "succeeded")  # type: ignore[union-attr]
    expected_out = sum(r.message.usage.output_tokens for r in raw.values() if r.type == "succeeded")  # type: ignore[union-attr]
    assert (m.succeeded, len(m.failed_rows)) == (6, 1) and m.failed_rows[0]["custom_id"] == "row-bad"
    assert (m.usage["prompt_tokens"], m.usage["completion_tokens"]) == (expected_in, expected_out)
    assert expected_in == sum(provider.count_tokens(MODEL, x) for x in lines[:6])


def test_adapter_refuses_bad_input_before_sending(emu: Emulator, provider: AnthropicProvider) -> None:
    with pytest.raises(ValueError, match="custom_id"):
        create_from_lines(provider, [chat_line("not ok!", "x", model=MODEL)])
    with pytest.raises(ValueError, match="1 to 100,000"):
        provider.create([])
    assert emu.request_count("POST", "/v1/messages/batches") == 0
    with pytest.raises(ProviderConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider(None)


def create_from_lines(provider: AnthropicProvider, lines: list[dict[str, Any]]) -> Any:
    """Create a batch from the pipeline's OpenAI-shaped lines, as ``AnthropicBatchProvider`` does."""
    return provider.create([to_anthropic_request(line) for line in lines])


def test_create_outcome_unknown_then_reconciled_by_the_matching_rule(tmp_path) -> None:  # noqa: ANN001
    """The product's rule (``AnthropicBatchProvider.find_batches``, in a fresh process that knows
    no batch ids): a batch created since the chunk file was written, with exactly its request
    count, is adopted once its results name exactly its custom_ids; while a candidate runs, the
    answer is "not yet" (ProviderUnavailable), never a guess."""
    from batchgrader.provider.anthropic_batches import AnthropicBatchProvider

    clock = ManualClock(start=float(int(time.time())))  # the rule compares batch times with the file's mtime
    cfg = EmulatorConfig(clock=clock, api_key=KEY, validating_s=1, in_progress_s=10, finalizing_s=1)
    with Emulator(cfg) as emu:

        def staged(name: str, lines: list[dict[str, Any]]) -> str:
            path = tmp_path / name
            path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in lines))
            return AnthropicBatchProvider(KEY, emu.root_url, timeout=10, max_retries=0).upload(path, name).id

        lines = [chat_line(f"job1-{i}", f"essay {i}", model=MODEL) for i in range(4)]
        mine = staged("job1.jsonl", lines)
        other = staged("other.jsonl", [chat_line(f"other-{i}", "x", model=MODEL) for i in range(4)])  # same count
        sender = AnthropicBatchProvider(KEY, emu.root_url, timeout=10, max_retries=0)
        sender.create_batch(other)
        emu.script_fault("POST", "/v1/messages/batches", Fault("drop_after"))
        with pytest.raises(OutcomeUnknown):
            sender.create_batch(mine)
        assert emu.batches_created() == 2  # the create took effect; the answer was lost

        after_restart = AnthropicBatchProvider(KEY, emu.root_url, timeout=10, max_retries=0)
        with pytest.raises(ProviderUnavailable, match="custom_ids can be checked once it has ended"):
            after_restart.find_batches(mine)  # two running candidates of 4 requests: wait
        clock.advance(13)  # both ended: their results tell them apart
        (found,) = after_restart.find_batches(mine)
        (theirs,) = after_restart.find_batches(other)
        assert found.id != theirs.id and found.request_counts.total == 4 and found.input_file_id == mine

        lonely = staged("job2.jsonl", [chat_line("job2-0", "y", model=MODEL)])
        emu.script_fault("POST", "/v1/messages/batches", Fault("drop_before"))
        with pytest.raises(OutcomeUnknown):
            sender.create_batch(lonely)
        assert after_restart.find_batches(lonely) == []  # never created: it may be sent again
        assert emu.batches_created() == 2


def test_after_a_restart_a_running_batch_of_another_chunk_is_not_waited_for(tmp_path) -> None:  # noqa: ANN001
    """A create whose reply was lost, in a job whose other chunk's batch (same request count)
    still runs: a fresh process knows that batch from the note beside its chunk file, so it
    answers at once (here: not created, send it again) instead of waiting for the batch to end."""
    from batchgrader.provider.anthropic_batches import AnthropicBatchProvider

    clock = ManualClock(start=float(int(time.time())))
    cfg = EmulatorConfig(clock=clock, api_key=KEY, validating_s=1, in_progress_s=3600, finalizing_s=1)
    with Emulator(cfg) as emu:
        sender = AnthropicBatchProvider(KEY, emu.root_url, timeout=10, max_retries=0)
        ids = {}
        for n in (0, 1):
            path = tmp_path / f"chunk-{n}.jsonl"
            path.write_bytes(b"".join(json.dumps(chat_line(f"job-{n}-{i}", "x", model=MODEL)).encode() + b"\n" for i in range(3)))
            ids[n] = sender.upload(path, path.name).id
        running = sender.create_batch(ids[0])
        emu.script_fault("POST", "/v1/messages/batches", Fault("drop_before"))
        with pytest.raises(OutcomeUnknown):
            sender.create_batch(ids[1])
        after_restart = AnthropicBatchProvider(KEY, emu.root_url, timeout=10, max_retries=0)
        assert after_restart.find_batches(ids[1]) == []  # chunk 0's batch is known, and still runs
        (again,) = after_restart.find_batches(ids[0])
        assert again.id == running.id and emu.batches_created() == 1


def test_a_refused_create_carries_anthropics_error_type(emu: Emulator, provider: AnthropicProvider) -> None:
    emu.script_fault("POST", "/v1/messages/batches", Fault("status", status=429, retry_after=1))
    with pytest.raises(ProviderRejected) as rj:
        create_from_lines(provider, [chat_line("a", "x", model=MODEL)])
    assert rj.value.retryable and rj.value.type == "rate_limit_error"  # the rest: tests/provider_contract.py


@pytest.mark.slow
def test_reads_survive_the_flaky_profile(clock: ManualClock) -> None:
    with Emulator(EmulatorConfig(clock=clock, api_key=KEY, faults="flaky", seed=3)) as emu:
        c = anthropic.Anthropic(base_url=emu.root_url, api_key=KEY, max_retries=0)
        b = None
        for _ in range(20):  # create once it is answered (a 5xx/429 here never created anything)
            try:
                b = c.messages.batches.create(requests=[req("f-1")])  # type: ignore[list-item]
                break
            except anthropic.APIStatusError:
                continue
        assert b is not None
        clock.advance(1)
        p = AnthropicProvider(KEY, emu.root_url, timeout=10, max_retries=8)
        got = [p.retrieve(b.id).status for _ in range(15)]
        assert set(got) == {"ended"}
        assert sum(1 for _ in p.results(b.id)) == 1
        assert emu.stats()["faults_injected"]


def test_emulator_keeps_anthropic_batches_across_a_restart(tmp_path, clock: ManualClock) -> None:
    cfg = EmulatorConfig(clock=clock, api_key=KEY, data_dir=str(tmp_path), validating_s=1, in_progress_s=10, finalizing_s=1)
    with Emulator(cfg) as first:
        c = anthropic.Anthropic(base_url=first.root_url, api_key=KEY, max_retries=0)
        done = c.messages.batches.create(requests=[req("p-1"), req("p-2", "__FAIL_400__")])  # type: ignore[list-item]
        cancelled = c.messages.batches.create(requests=[req("q-1")])  # type: ignore[list-item]
        c.messages.batches.cancel(cancelled.id)
        clock.advance(12)
        before = sorted(r.model_dump_json() for r in c.messages.batches.results(done.id))
    with Emulator(cfg) as second:
        c = anthropic.Anthropic(base_url=second.root_url, api_key=KEY, max_retries=0)
        assert second.batches_created() == 2
        assert sorted(r.model_dump_json() for r in c.messages.batches.results(done.id)) == before
        assert c.messages.batches.retrieve(cancelled.id).request_counts.canceled == 1


def test_count_marks_claude_token_counts_as_an_estimate(tmp_path, home) -> None:  # noqa: ANN001
    from click.testing import CliRunner

    from batchgrader.cli.commands import cli

    home.config_file.write_text("profiles:\n  claude:\n    provider: anthropic\n    model: claude-haiku-4-5\n")
    f = tmp_path / "data.csv"
    f.write_text("response\nfirst essay\nsecond essay\n")
    runner = CliRunner()
    claude = json.loads(runner.invoke(cli, ["count", str(f), "--json", "--profile", "claude"]).output)
    assert claude["input_tokens_exact"] is False and claude["provider"] == "anthropic" and claude["input_tokens"] > 0
    assert "ESTIMATE" in runner.invoke(cli, ["count", str(f), "--profile", "claude"]).output
    openai_count = json.loads(runner.invoke(cli, ["count", str(f), "--json"]).output)
    assert openai_count["input_tokens_exact"] is True
    assert "input tokens (exact)" in runner.invoke(cli, ["count", str(f)]).output


# --- the listing of a poll round ---------------------------------------------------------------------


def test_a_list_round_pages_through_anthropic_batches(tmp_path, emu: Emulator) -> None:  # noqa: ANN001
    from batchgrader.provider.anthropic_batches import AnthropicBatchProvider
    from batchgrader.provider.openai_api import list_statuses
    from emulator_fixtures import jsonl

    claude = AnthropicBatchProvider(KEY, emu.root_url, timeout=10, max_retries=0)
    ids = set()
    for i in range(3):
        name = f"bg-anthropic_{i}-c0-a0.jsonl"
        path = tmp_path / name
        path.write_bytes(jsonl(chat_line(f"r-{i}-{j}", "x", model=MODEL) for j in range(2)))
        ids.add(claude.create_batch(claude.upload(path, name).id).id)
    assert all(i.startswith("msgbatch_") for i in ids)
    assert set(list_statuses(claude, ids)) == ids
    page = claude.list_batches(limit=2)
    seen = {b.id for b in page.items}
    assert page.has_more and len(page.items) == 2
    while page.has_more:
        page = claude.list_batches(limit=2, after=page.last_id)
        seen |= {b.id for b in page.items}
    assert seen == ids

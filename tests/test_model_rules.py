"""The emulators refuse what the real APIs refuse (from the model catalogue) and spend reasoning
tokens as reasoning models do, on the batch path, through the official SDKs over real HTTP; and
the request builders carry ``reasoning_effort`` to each provider's control."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.pipeline.catalogue import load_checked
from batchgrader.pipeline.requests import RequestBuilder
from batchgrader.provider.anthropic_api import to_anthropic_request
from batchgrader.provider.gemini_api import to_gemini_request
from emulator_fixtures import API_KEY, chat_line, jsonl, read_jsonl, run_to_terminal, upload

ANT_KEY = "sk-ant-emulator-test-0123456789abcdef"
GEM_KEY = "gemini-emulator-test-key-0123456789"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def emu(clock: ManualClock) -> Iterator[Emulator]:
    cfg = EmulatorConfig(clock=clock, api_key=API_KEY, validating_s=0.01, in_progress_s=0.05, finalizing_s=0.01)
    with Emulator(cfg) as e:
        yield e


def openai_batch(emu: Emulator, clock: ManualClock, lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Run one OpenAI batch of ``lines`` to its end; every output and error line by custom_id."""
    client = openai.OpenAI(base_url=emu.base_url, api_key=API_KEY, max_retries=0)
    f = upload(client, jsonl(lines))
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = run_to_terminal(client, clock, b.id)
    rows = read_jsonl(client, done.output_file_id) + read_jsonl(client, done.error_file_id)
    return {r["custom_id"]: r for r in rows}


# --- OpenAI and Azure: the batch path ------------------------------------------------------------


def test_openai_refuses_temperature_on_a_model_that_takes_only_its_default(emu: Emulator, clock: ManualClock) -> None:
    rows = openai_batch(
        emu,
        clock,
        [
            chat_line("t0", "Grade.", model="o4-mini", temperature=0, max_completion_tokens=25_000),
            chat_line("t1", "Grade.", model="o4-mini", temperature=1, max_completion_tokens=25_000),
        ],
    )
    rows |= openai_batch(emu, clock, [chat_line("g4", "Grade.", model="gpt-4.1-nano", temperature=0)])
    refused = rows["t0"]["response"]
    assert refused["status_code"] == 400
    assert refused["body"]["error"] == {
        "message": "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) value is supported.",
        "type": "invalid_request_error",
        "param": "temperature",
        "code": "unsupported_value",
    }
    assert rows["t1"]["response"]["status_code"] == 200 and rows["g4"]["response"]["status_code"] == 200


def test_openai_refuses_temperature_at_an_effort_other_than_none(emu: Emulator, clock: ManualClock) -> None:
    rows = openai_batch(
        emu,
        clock,
        [
            chat_line("none", "Grade.", model="gpt-5.1", temperature=0),
            chat_line("high", "Grade.", model="gpt-5.1", temperature=0, reasoning_effort="high"),
        ],
    )
    assert rows["none"]["response"]["status_code"] == 200
    assert rows["high"]["response"]["body"]["error"]["code"] == "unsupported_value"


def test_openai_refuses_an_effort_the_model_lacks_and_a_bound_above_its_maximum(emu: Emulator, clock: ManualClock) -> None:
    rows = openai_batch(
        emu,
        clock,
        [
            chat_line("4o", "Grade.", model="gpt-4.1-nano", reasoning_effort="low"),
            chat_line("big", "Grade.", model="gpt-4.1-nano", max_completion_tokens=40_000),
        ],
    )
    rows |= openai_batch(emu, clock, [chat_line("xh", "Grade.", model="o4-mini", reasoning_effort="xhigh")])
    rows |= openai_batch(emu, clock, [chat_line("mt", "Grade.", model="gpt-6-sol", max_tokens=500)])
    assert rows["mt"]["response"]["body"]["error"]["code"] == "unsupported_parameter"  # gpt-6: a reasoning model too
    assert rows["xh"]["response"]["body"]["error"]["code"] == "unsupported_value"
    assert "'reasoning_effort' does not support 'xhigh'" in rows["xh"]["response"]["body"]["error"]["message"]
    assert rows["4o"]["response"]["body"]["error"]["code"] == "unsupported_parameter"
    assert rows["big"]["response"]["body"]["error"]["message"].startswith("max_tokens is too large: 40000.")


def test_openai_reasoning_spends_hundreds_to_thousands_and_a_small_bound_truncates(emu: Emulator, clock: ManualClock) -> None:
    lines = [chat_line(f"s{i}", f"Grade essay {i}.", model="o4-mini", max_completion_tokens=300) for i in range(5)]
    lines += [chat_line(f"b{i}", f"Grade essay {i}.", model="o4-mini", max_completion_tokens=25_000) for i in range(5)]
    rows = openai_batch(emu, clock, lines)
    # gpt-5.1 runs at effort none by default
    rows |= openai_batch(emu, clock, [chat_line(f"n{i}", f"Grade essay {i}.", model="gpt-5.1") for i in range(3)])
    for i in range(5):
        small = rows[f"s{i}"]["response"]["body"]
        assert small["choices"][0]["finish_reason"] == "length" and small["choices"][0]["message"]["content"] == ""
        assert small["usage"]["completion_tokens"] == 300 == small["usage"]["completion_tokens_details"]["reasoning_tokens"]
        big = rows[f"b{i}"]["response"]["body"]
        reasoning = big["usage"]["completion_tokens_details"]["reasoning_tokens"]
        assert big["choices"][0]["finish_reason"] == "stop" and 600 <= reasoning <= 3_000
    for i in range(3):
        assert rows[f"n{i}"]["response"]["body"]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


# --- Anthropic ---------------------------------------------------------------------------------


@pytest.fixture
def ant(clock: ManualClock) -> Iterator[anthropic.Anthropic]:
    cfg = EmulatorConfig(clock=clock, api_key=ANT_KEY, validating_s=1, in_progress_s=10, finalizing_s=1)
    with Emulator(cfg) as e:
        yield anthropic.Anthropic(base_url=e.root_url, api_key=ANT_KEY, max_retries=0)


def ant_results(client: anthropic.Anthropic, clock: ManualClock, requests: list[dict[str, Any]]) -> dict[str, Any]:
    b = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    clock.advance(12)
    return {r.custom_id: r.result for r in client.messages.batches.results(b.id)}


def areq(cid: str, model: str, max_tokens: int = 2000, **params: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "params": {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "Grade."}], **params},
    }


def test_anthropic_refuses_temperature_on_a_model_that_deprecated_it(ant: anthropic.Anthropic, clock: ManualClock) -> None:
    # under API version 2023-06-01 each model's catalogue row decides (2026-10-21: test_anthropic_version.py)
    res = ant_results(
        ant.with_options(default_headers={"anthropic-version": "2023-06-01"}),
        clock,
        [areq("opus48", "claude-opus-4-8", 30_000, temperature=0), areq("haiku45", "claude-haiku-4-5", temperature=0)],
    )
    assert res["opus48"].type == "errored"
    err = res["opus48"].error.error  # type: ignore[union-attr]
    assert (err.type, err.message) == ("invalid_request_error", "`temperature` is deprecated for this model.")
    assert res["haiku45"].type == "succeeded"


def test_anthropic_thinking_spends_its_budget_and_a_small_bound_truncates(ant: anthropic.Anthropic, clock: ManualClock) -> None:
    thinking = {"type": "enabled", "budget_tokens": 4096}
    res = ant_results(
        ant,
        clock,
        [
            areq("small", "claude-haiku-4-5", 1030, thinking={"type": "enabled", "budget_tokens": 1024}),
            areq("roomy", "claude-haiku-4-5", 9000, thinking=thinking),
            areq("bad", "claude-haiku-4-5", 4096, thinking=thinking),
            areq("off", "claude-haiku-4-5", 2000),
        ],
    )
    roomy = res["roomy"].message  # type: ignore[union-attr]
    assert roomy.stop_reason == "end_turn" and roomy.content[0].type == "thinking" and roomy.content[-1].type == "text"
    used = roomy.usage.output_tokens_details.thinking_tokens  # type: ignore[union-attr]
    assert 600 <= used <= 4096
    small = res["small"].message  # type: ignore[union-attr]
    assert small.stop_reason == "max_tokens"
    assert res["bad"].error.error.message == "`max_tokens` must be greater than `thinking.budget_tokens`."  # type: ignore[union-attr]
    off = res["off"].message  # type: ignore[union-attr]
    assert off.stop_reason == "end_turn" and [b.type for b in off.content] == ["text"]


# --- Gemini ------------------------------------------------------------------------------------


@pytest.fixture
def gem(clock: ManualClock) -> Iterator[genai.Client]:
    cfg = EmulatorConfig(clock=clock, api_key=GEM_KEY, validating_s=1, in_progress_s=10, finalizing_s=1)
    with Emulator(cfg) as e:
        yield genai.Client(api_key=GEM_KEY, http_options=types.HttpOptions(base_url=e.root_url))


def gem_results(client: genai.Client, clock: ManualClock, tmp_path: Path, model: str, lines: list[dict]) -> dict[str, Any]:
    p = tmp_path / "in.jsonl"
    p.write_bytes(jsonl(lines))
    f = client.files.upload(file=p, config={"display_name": "in.jsonl", "mime_type": "jsonl"})
    b = client.batches.create(model=model, src=f.name, config={"display_name": "job:0:1"})  # type: ignore[arg-type]
    clock.advance(22)
    done = client.batches.get(name=b.name)  # type: ignore[arg-type]
    return {r["key"]: r for r in map(json.loads, client.files.download(file=done.dest.file_name).splitlines())}  # type: ignore[union-attr]


def gline(key: str, **gen: Any) -> dict[str, Any]:
    return {"key": key, "request": {"contents": [{"role": "user", "parts": [{"text": "Grade."}]}], "generationConfig": gen}}


def test_gemini_thinking_eats_a_small_output_bound(gem: genai.Client, clock: ManualClock, tmp_path: Path) -> None:
    res = gem_results(
        gem,
        clock,
        tmp_path,
        "gemini-2.5-pro",
        [
            gline("small", maxOutputTokens=100),
            gline("roomy", maxOutputTokens=30_000),
            gline("off", maxOutputTokens=1000, thinkingConfig={"thinkingBudget": 0}),
        ],
    )
    small = res["small"]["response"]
    assert small["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert small["candidates"][0]["content"]["parts"][0]["text"] == ""
    assert small["usageMetadata"]["thoughtsTokenCount"] == 100
    roomy = res["roomy"]["response"]
    assert roomy["candidates"][0]["finishReason"] == "STOP" and roomy["usageMetadata"]["thoughtsTokenCount"] >= 600
    assert res["off"]["error"] == {
        "code": 3,
        "message": "Budget 0 is invalid. This model only works in thinking mode.",
        "status": "INVALID_ARGUMENT",
    }


# --- the request builders ----------------------------------------------------------------------


def builder(home: Home, text: str) -> RequestBuilder:
    home.config_file.write_text(text, encoding="utf-8")
    config, _ = load_checked(load_config(home, environ={}))
    return RequestBuilder(config.default, home, "0" * 64)


def test_openai_lines_carry_reasoning_effort_and_the_models_bound(home: Home) -> None:
    body = builder(home, "model: o4-mini\nreasoning_effort: low\n").request("c1", [{"role": "user", "content": "x"}])["body"]
    assert body["reasoning_effort"] == "low" and body["max_completion_tokens"] == 25_000
    body = builder(home, "model: gpt-4.1-nano\n").request("c1", [{"role": "user", "content": "x"}])["body"]
    assert "reasoning_effort" not in body and body["max_completion_tokens"] == 1000


def test_anthropic_requests_carry_a_thinking_budget_or_an_effort(home: Home) -> None:
    line = builder(home, "provider: anthropic\nmodel: claude-haiku-4-5\nreasoning_effort: medium\n").request(
        "c1", [{"role": "user", "content": "x"}]
    )
    params = to_anthropic_request(line)["params"]
    assert params["thinking"] == {"type": "enabled", "budget_tokens": 4096} and params["max_tokens"] == 20_480
    assert "reasoning_effort" not in params
    line = builder(home, "provider: anthropic\nmodel: claude-opus-5\nreasoning_effort: high\n").request(
        "c1", [{"role": "user", "content": "x"}]
    )
    params = to_anthropic_request(line)["params"]
    assert params["thinking"] == {"type": "adaptive"} and params["output_config"] == {"effort": "high"}


def test_gemini_requests_carry_a_thinking_budget_or_level(home: Home) -> None:
    line = builder(home, "provider: gemini\nmodel: gemini-2.5-flash\nreasoning_effort: none\n").request(
        "c1", [{"role": "user", "content": "x"}]
    )
    assert to_gemini_request(line["body"])["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 0}
    line = builder(home, "provider: gemini\nmodel: gemini-3.8-flash\nreasoning_effort: low\n").request(
        "c1", [{"role": "user", "content": "x"}]
    )
    gen = to_gemini_request(line["body"])["generationConfig"]
    assert gen["thinkingConfig"] == {"thinkingLevel": "LOW"} and gen["maxOutputTokens"] == 32_768

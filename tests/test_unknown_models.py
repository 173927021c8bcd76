"""A model id the emulator does not serve is answered as the real APIs answer one they do not
know, through the official SDKs: OpenAI 404 ``model_not_found`` (a batch line: the batch fails
validation with ``model_not_found``), Azure 404 ``DeploymentNotFound``, Anthropic 404
``not_found_error`` (a batch request: an errored result), Gemini 404 ``NOT_FOUND``.  It serves
the shipped catalogue's models (aliases and dated snapshots included) and, as documented, the
ids of ``EmulatorConfig.extra_models`` and the rows of ``EmulatorConfig.models_file``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from emulator_fixtures import API_KEY, chat_line, jsonl, run_to_terminal, upload

ANT_KEY = "sk-ant-emulator-test-0123456789abcdef"
MSG = [{"role": "user", "content": "Grade."}]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def emulator(clock: ManualClock, **kw: Any) -> Emulator:
    return Emulator(EmulatorConfig(clock=clock, api_key=None, validating_s=1, in_progress_s=10, finalizing_s=1, **kw))


@pytest.fixture
def emu(clock: ManualClock) -> Iterator[Emulator]:
    with emulator(clock) as e:
        yield e


def oai(emu: Emulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=emu.base_url, api_key=API_KEY, max_retries=0)


def ant(emu: Emulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=emu.root_url, api_key=ANT_KEY, max_retries=0)


def gem(emu: Emulator) -> genai.Client:
    return genai.Client(api_key="gemini-test-key-0123456789", http_options=types.HttpOptions(base_url=emu.root_url))


def test_openai_sync_answers_404_model_not_found(emu: Emulator) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        oai(emu).chat.completions.create(model="gpt-4o-mni", messages=MSG)  # type: ignore[arg-type]
    assert exc.value.status_code == 404
    assert exc.value.code == "model_not_found" and exc.value.type == "invalid_request_error"
    assert exc.value.message.endswith("The model `gpt-4o-mni` does not exist or you do not have access to it.")
    # known: a shipped row, and a dated snapshot of one
    for model in ("gpt-5.4-mini", "gpt-5.4-mini-2024-07-18"):
        assert oai(emu).chat.completions.create(model=model, messages=MSG).choices[0].message.content  # type: ignore[arg-type]


def test_openai_batch_with_an_unknown_model_fails_validation(emu: Emulator, clock: ManualClock) -> None:
    client = oai(emu)
    f = upload(client, jsonl([chat_line("a", "Grade.", model="gpt-4o-mni"), chat_line("b", "Grade.", model="gpt-4o-mni")]))
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    b = run_to_terminal(client, clock, b.id)
    assert b.status == "failed"
    err = b.errors.data[0]
    assert (err.code, err.param, err.line) == ("model_not_found", "body.model", 1)
    assert err.message == "The provided model 'gpt-4o-mni' is not supported by the Batch API."


def test_azure_sync_answers_404_deployment_not_found(emu: Emulator) -> None:
    az = openai.AzureOpenAI(api_key=API_KEY, azure_endpoint=emu.root_url, api_version="2025-04-01-preview", max_retries=0)
    with pytest.raises(openai.NotFoundError) as exc:
        az.chat.completions.create(model="no-such-deployment", messages=MSG)  # type: ignore[arg-type]
    assert exc.value.code == "DeploymentNotFound"


def test_anthropic_answers_404_not_found_error_sync_batch_and_counting(emu: Emulator, clock: ManualClock) -> None:
    client = ant(emu)
    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.create(model="claude-haiku-4-6", max_tokens=100, messages=MSG)  # type: ignore[arg-type]
    assert exc.value.body == {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-haiku-4-6"}}
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-haiku-4-6", messages=MSG)  # type: ignore[arg-type]
    requests = [
        {"custom_id": "bad", "params": {"model": "claude-haiku-4-6", "max_tokens": 100, "messages": MSG}},
        {"custom_id": "ok", "params": {"model": "claude-haiku-4-5-20251001", "max_tokens": 100, "messages": MSG}},  # an alias
    ]
    b = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    clock.advance(12)
    res = {r.custom_id: r.result for r in client.messages.batches.results(b.id)}
    assert res["ok"].type == "succeeded" and res["bad"].type == "errored"
    err = res["bad"].error.error  # type: ignore[union-attr]
    assert (err.type, err.message) == ("not_found_error", "model: claude-haiku-4-6")


def test_gemini_answers_404_not_found_sync_and_batch(emu: Emulator) -> None:
    client = gem(emu)
    with pytest.raises(genai_errors.ClientError) as exc:
        client.models.generate_content(model="gemini-2.5-flahs", contents="Grade.")
    assert (exc.value.code, exc.value.status) == (404, "NOT_FOUND")
    inline = [{"contents": [{"role": "user", "parts": [{"text": "Grade."}]}]}]
    with pytest.raises(genai_errors.ClientError) as exc:
        client.batches.create(model="gemini-2.5-flahs", src=inline, config={"display_name": "x"})  # type: ignore[arg-type]
    assert (exc.value.code, exc.value.status) == (404, "NOT_FOUND")
    assert client.models.generate_content(model="gemini-2.5-flash", contents="Grade.").text


def test_the_documented_options_add_models(clock: ManualClock, tmp_path: Path) -> None:
    catalogue = tmp_path / "pricing.csv"
    catalogue.write_text("model,input_per_1m,output_per_1m,provider\nacme-1,1,2,openai\n", encoding="utf-8")
    with emulator(clock, extra_models=("my-deployment", "claude-house-1"), models_file=catalogue) as e:
        assert oai(e).chat.completions.create(model="acme-1", messages=MSG).choices  # type: ignore[arg-type]
        assert ant(e).messages.create(model="claude-house-1", max_tokens=50, messages=MSG).content  # type: ignore[arg-type]
        az = openai.AzureOpenAI(api_key=API_KEY, azure_endpoint=e.root_url, api_version="2025-04-01-preview", max_retries=0)
        assert az.chat.completions.create(model="my-deployment", messages=MSG).choices  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError):
            oai(e).chat.completions.create(model="acme-2", messages=MSG)  # type: ignore[arg-type]
        # a row added to the file later is served from then on
        catalogue.write_text(catalogue.read_text() + "acme-2,1,2,openai\n", encoding="utf-8")
        import os

        os.utime(catalogue, (1, 1))  # a new mtime even within the same clock tick
        assert oai(e).chat.completions.create(model="acme-2", messages=MSG).choices  # type: ignore[arg-type]

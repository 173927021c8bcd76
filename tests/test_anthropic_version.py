"""Anthropic API versions: the ``anthropic-version`` our client sends is the configured one
(``anthropic_api_version``), its rules are checked when the configuration loads (2026-10-21
refuses ``temperature``, ``top_p`` and ``top_k`` on every model), and the emulator applies the
rules of the header it receives, to synchronous requests and to each request of a batch."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from batchgrader.core.configuration.config import KEYS, ConfigError, load_config
from batchgrader.core.configuration.providers import ANTHROPIC_DEFAULT_API_VERSION
from batchgrader.core.host.home import Home
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.pipeline.catalogue import load_checked
from batchgrader.provider.anthropic_api import AnthropicProvider

KEY = "sk-ant-emulator-test-0123456789abcdef"


def test_the_default_version_is_the_one_the_installed_sdk_sends() -> None:
    from anthropic._constants import ANTHROPIC_API_VERSION

    assert ANTHROPIC_DEFAULT_API_VERSION == ANTHROPIC_API_VERSION == "2026-10-21"
    assert KEYS["anthropic_api_version"].default == ANTHROPIC_DEFAULT_API_VERSION


# --- the configuration --------------------------------------------------------------------------


def load(home: Home, text: str, environ: dict[str, str] | None = None) -> Any:
    home.config_file.write_text(text, encoding="utf-8")
    return load_checked(load_config(home, environ=environ or {}))


@pytest.mark.parametrize("model", ["claude-haiku-4-5", "claude-sonnet-4-6", "claude-opus-5"])
def test_a_temperature_on_anthropic_does_not_load_under_2026_10_21(home: Home, model: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(home, f"provider: anthropic\nmodel: {model}\ntemperature: 0\n")
    msg = str(exc.value)
    assert "the default profile: key 'temperature' is 0" in msg
    assert "API version 2026-10-21" in msg and "temperature, top_p, top_k" in msg
    assert "remove 'temperature' from the default profile" in msg and "anthropic_api_version" in msg and "2023-06-01" in msg


def test_the_message_names_the_profile_and_where_its_temperature_comes_from(home: Home) -> None:
    text = "temperature: 0.3\nprofiles:\n  claude:\n    provider: anthropic\n    model: claude-haiku-4-5\n"
    with pytest.raises(ConfigError) as exc:
        load(home, text)
    msg = str(exc.value)
    assert "profiles.claude: key 'temperature' is 0.3" in msg and "set 'temperature: null' in profiles.claude" in msg
    assert "the default profile" not in msg  # the default profile sends to OpenAI: its temperature is fine there
    with pytest.raises(ConfigError, match="unset BATCHGRADER_TEMPERATURE"):
        load(home, "provider: anthropic\nmodel: claude-haiku-4-5\n", {"BATCHGRADER_TEMPERATURE": "0"})
    # fixed: the profile leaves it out
    load(home, text + "    temperature: null\n")


def test_pinning_2023_06_01_applies_each_models_catalogue_row(home: Home) -> None:
    config, _ = load(home, "anthropic_api_version: 2023-06-01\nprovider: anthropic\nmodel: claude-haiku-4-5\ntemperature: 0\n")
    assert config.default.anthropic_api_version == "2023-06-01"
    with pytest.raises(ConfigError, match="deprecated for this model"):
        load(home, "anthropic_api_version: 2023-06-01\nprovider: anthropic\nmodel: claude-opus-4-8\ntemperature: 0\n")
    with pytest.raises(ConfigError, match="key 'anthropic_api_version' must be one of '2023-06-01', '2026-10-21'"):
        load(home, "anthropic_api_version: 2024-01-01\nprovider: anthropic\nmodel: claude-haiku-4-5\n")
    with pytest.raises(ConfigError, match="cannot be set in a profile"):
        load(
            home, "profiles:\n  c:\n    provider: anthropic\n    model: claude-haiku-4-5\n    anthropic_api_version: 2023-06-01\n"
        )


def test_count_and_doctor_refuse_it_and_doctor_shows_the_version(home: Home, tmp_path: Path) -> None:
    from batchgrader.ops.doctor import FAIL, OK, run_checks
    from cli_fixtures import run

    data = tmp_path / "essays.csv"
    data.write_text("text\nGood.\n", encoding="utf-8")
    home.config_file.write_text("provider: anthropic\nmodel: claude-haiku-4-5\ntemperature: 0\n", encoding="utf-8")
    res = run("count", str(data))
    assert res.exit_code != 0 and "anthropic_api_version" in res.output and "Traceback" not in res.output
    failed = [c for c in run_checks(home, environ={}, require_key=False) if c.status == FAIL]
    assert any("API version 2026-10-21" in c.detail + c.fix for c in failed)

    home.config_file.write_text("anthropic_api_version: 2023-06-01\nprovider: anthropic\nmodel: claude-haiku-4-5\n")
    shown = {c.name: c for c in run_checks(home, environ={}, require_key=False)}
    assert shown["anthropic api version"].status == OK
    assert shown["anthropic api version"].detail.startswith("anthropic-version 2023-06-01 (from config.yaml)")
    home.config_file.write_text("provider: anthropic\nmodel: claude-haiku-4-5\n")
    shown = {c.name: c for c in run_checks(home, environ={}, require_key=False)}
    assert (
        "anthropic-version 2026-10-21 (from default): temperature, top_p, top_k refused" in shown["anthropic api version"].detail
    )


@pytest.mark.slow  # a real daemon process
def test_the_daemon_exits_78_on_a_temperature_the_version_refuses(home: Home) -> None:
    from harness import bgctl

    home.config_file.write_text("provider: anthropic\nmodel: claude-haiku-4-5\ntemperature: 0\n", encoding="utf-8")
    res = bgctl(home.root, "daemon", "--once", "--sandbox", timeout=60)
    assert res.returncode == 78, res.stderr
    assert "API version 2026-10-21" in res.stderr


# --- the emulator, through the official SDK -----------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def emu(clock: ManualClock) -> Iterator[Emulator]:
    with Emulator(EmulatorConfig(clock=clock, api_key=KEY, validating_s=1, in_progress_s=10, finalizing_s=1)) as e:
        yield e


def req(cid: str, model: str = "claude-haiku-4-5", **params: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "params": {"model": model, "max_tokens": 200, "messages": [{"role": "user", "content": "Grade."}], **params},
    }


SAMPLED = [req("t", temperature=0), req("p", top_p=0.9), req("k", top_k=5), req("t1", temperature=1.0), req("plain")]


def test_a_batch_created_with_2026_10_21_errors_each_request_with_a_sampling_parameter(emu: Emulator, clock: ManualClock) -> None:
    client = anthropic.Anthropic(base_url=emu.root_url, api_key=KEY, max_retries=0)  # the SDK's default version
    b = client.messages.batches.create(requests=SAMPLED)  # type: ignore[arg-type]
    clock.advance(12)
    res = {r.custom_id: r.result for r in client.messages.batches.results(b.id)}
    assert res["plain"].type == "succeeded"
    for cid, name in (("t", "temperature"), ("p", "top_p"), ("k", "top_k"), ("t1", "temperature")):
        assert res[cid].type == "errored", cid
        err = res[cid].error.error  # type: ignore[union-attr]
        assert err.type == "invalid_request_error" and f"`{name}`" in err.message and "2026-10-21" in err.message


def test_the_synchronous_api_refuses_it_with_a_400(emu: Emulator) -> None:
    client = anthropic.Anthropic(base_url=emu.root_url, api_key=KEY, max_retries=0)
    params = req("x")["params"]
    with pytest.raises(anthropic.BadRequestError) as exc:  # anthropic >= 1.0 has no temperature argument: the body has it
        client.messages.create(**params, extra_body={"temperature": 0})
    assert exc.value.status_code == 400
    assert exc.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "`temperature`" in exc.value.body["error"]["message"]  # type: ignore[index]
    pinned = client.with_options(default_headers={"anthropic-version": "2023-06-01"})
    assert pinned.messages.create(**params, extra_body={"temperature": 0}).stop_reason == "end_turn"


def test_an_unknown_or_missing_version_is_refused(emu: Emulator) -> None:
    client = anthropic.Anthropic(base_url=emu.root_url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match='anthropic-version: "2023-10-01" is not a valid version'):
        client.with_options(default_headers={"anthropic-version": "2023-10-01"}).messages.batches.list()
    plain = urllib.request.Request(emu.root_url + "/v1/messages/batches", headers={"x-api-key": KEY})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(plain, timeout=10)
    assert exc.value.code == 400
    body = json.loads(exc.value.read())
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "anthropic-version: header is required"},
    }


@pytest.mark.parametrize(("version", "expected"), [(None, "errored"), ("2026-10-21", "errored"), ("2023-06-01", "succeeded")])
def test_our_client_sends_the_configured_version(emu: Emulator, clock: ManualClock, version: str | None, expected: str) -> None:
    provider = AnthropicProvider(KEY, emu.root_url, timeout=10, api_version=version)
    b = provider.create([req("t", temperature=0)])
    clock.advance(12)
    [line] = list(provider.results(b.id))
    assert (line["response"] or {}).get("status_code", 400) == (200 if expected == "succeeded" else 400), line


def test_the_synchronous_route_sends_a_temperature_the_pinned_version_takes(emu: Emulator) -> None:
    from batchgrader.provider.anthropic_batches import AnthropicBatchProvider

    line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "claude-haiku-4-5",
            "max_completion_tokens": 200,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Grade."}],
        },
    }
    out = AnthropicBatchProvider(KEY, emu.root_url, timeout=10, api_version="2023-06-01").complete(line)
    assert out["response"]["status_code"] == 200 and out["response"]["body"]["choices"][0]["message"]["content"]


def test_bgctl_models_shows_the_temperature_rule_of_the_version_sent(home: Home) -> None:
    """A Claude row's own temperature rule ("any") holds only under 2023-06-01; `bgctl models`
    showed it under 2026-10-21 too, where every sampling parameter is refused."""
    from cli_fixtures import run

    rows = {r["model"]: r for r in json.loads(run("models", "--provider", "anthropic", "--json").output)["models"]}
    assert rows["claude-haiku-4-5"]["temperature"] == "none (API)"
    assert rows["claude-haiku-4-5"]["temperature_api_version"] == ANTHROPIC_DEFAULT_API_VERSION
    home.config_file.write_text('anthropic_api_version: "2023-06-01"\n')
    rows = {r["model"]: r for r in json.loads(run("models", "--provider", "anthropic", "--json").output)["models"]}
    assert rows["claude-haiku-4-5"]["temperature"] == "any"

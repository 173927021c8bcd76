"""The counting hook: exact input tokens from a provider's counting endpoint (Anthropic
``messages.count_tokens``, served by the emulator over real HTTP), batched and cached; without a
key the counts are estimates, and every output says which."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from click.testing import CliRunner

from batchgrader.cli.commands import cli
from batchgrader.core.host.home import Home
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.provider.anthropic_api import AnthropicProvider, AnthropicTokenCounter
from batchgrader.provider.counting import CountCache, exact_counts
from emulator_fixtures import chat_line

KEY = "sk-ant-counting-test-0123456789abcdef"
MODEL = "claude-haiku-4-5"
COUNT_ROUTE = ("POST", "/v1/messages/count_tokens")


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator(EmulatorConfig(clock=ManualClock(), api_key=KEY)) as e:
        yield e


def _claude_home(home: Home, emu: Emulator, monkeypatch: pytest.MonkeyPatch, key: str | None = KEY) -> None:
    home.config_file.write_text(
        f"anthropic_base_url: {emu.root_url}\nprofiles:\n  claude:\n    provider: anthropic\n    model: {MODEL}\n"
    )
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    if key is None:
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)


def _data(tmp_path: Path, n: int = 5) -> Path:
    f = tmp_path / "data.csv"
    f.write_text("response\n" + "".join(f"essay number {i} about {'rivers ' * i}\n" for i in range(n)))
    return f


def _count(*args: str) -> tuple[dict, str]:
    runner = CliRunner()
    res = runner.invoke(cli, ["count", *args, "--json"])
    assert res.exit_code == 0, res.output
    table = runner.invoke(cli, ["count", *args])
    return json.loads(res.output), table.output


def _endpoint_total(emu: Emulator, f: Path) -> int:
    """What the endpoint says for each row's request, asked directly through the SDK."""
    client = anthropic.Anthropic(base_url=emu.root_url, api_key=KEY, max_retries=0)
    system = "You are a careful grader. Read the text and give a short, fair assessment."
    total = 0
    for line in f.read_text().splitlines()[1:]:
        msgs = [{"role": "user", "content": f"Please evaluate the following text: {line}"}]
        total += client.messages.count_tokens(model=MODEL, system=system, messages=msgs).input_tokens  # type: ignore[arg-type]
    return total


def test_count_is_exact_from_the_endpoint_and_cached(home: Home, emu: Emulator, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    _claude_home(home, emu, monkeypatch)
    f = _data(tmp_path, 5)
    first, table = _count(str(f), "--profile", "claude")
    assert first["input_tokens_exact"] is True
    assert first["token_count"] == {
        "exact": True,
        "source": "anthropic counting endpoint",
        "cached": 0,
        "sent": 5,
        "reason": None,
    }
    sent_so_far = emu.request_count(*COUNT_ROUTE)
    assert sent_so_far == 5  # the table run found every count in the cache
    assert first["input_tokens"] == _endpoint_total(emu, f)
    assert "exact, from the anthropic counting endpoint" in table and "ESTIMATE" not in table
    again, _ = _count(str(f), "--profile", "claude")
    assert again["token_count"]["cached"] == 5 and again["token_count"]["sent"] == 0
    assert again["input_tokens"] == first["input_tokens"]
    assert emu.request_count(*COUNT_ROUTE) == sent_so_far + 5  # only _endpoint_total's own 5 calls
    assert (home.root / "token_counts.sqlite").exists()
    assert KEY not in (home.root / "token_counts.sqlite").read_bytes().decode("latin-1")


def test_count_without_a_key_is_an_estimate_and_says_so(home: Home, emu: Emulator, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    _claude_home(home, emu, monkeypatch, key=None)
    summary, table = _count(str(_data(tmp_path)), "--profile", "claude")
    assert summary["input_tokens_exact"] is False
    assert summary["token_count"]["exact"] is False and "no API key" in summary["token_count"]["reason"]
    assert "ESTIMATE" in table and "why an estimate" in table
    assert "estimated cost: input (estimate)" in table
    assert emu.request_count(*COUNT_ROUTE) == 0


def test_count_with_a_refused_key_is_an_estimate(home: Home, emu: Emulator, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    _claude_home(home, emu, monkeypatch, key="sk-ant-wrong-key-000000000000")
    summary, table = _count(str(_data(tmp_path)), "--profile", "claude")
    assert summary["input_tokens_exact"] is False
    assert "counting failed" in summary["token_count"]["reason"] and "401" in summary["token_count"]["reason"]
    assert "sk-ant-wrong-key-000000000000" not in json.dumps(summary) + table


def test_openai_counts_stay_exact_offline(home: Home, tmp_path: Path) -> None:
    summary, table = _count(str(_data(tmp_path)))
    assert summary["input_tokens_exact"] is True and "token_count" not in summary
    assert "input tokens (exact)" in table


def test_the_hook_sends_only_uncounted_requests_in_slices(tmp_path: Path, emu: Emulator) -> None:
    counter = AnthropicTokenCounter(AnthropicProvider(KEY, emu.root_url, timeout=10), workers=4)
    cache = CountCache(tmp_path / "counts.sqlite")
    lines = [chat_line(f"r{i}", f"text {i} " * (i + 1), model=MODEL) for i in range(7)]
    first = exact_counts(counter, lines[:4], cache)
    assert first.exact and first.sent == 4 and first.cached == 0
    both = exact_counts(counter, lines, cache)
    assert both.sent == 3 and both.cached == 4 and both.counts is not None
    assert both.counts[:4] == first.counts and len(set(both.counts)) == 7
    assert emu.request_count(*COUNT_ROUTE) == 7
    same_question = [{**lines[0], "custom_id": "another-row"}]  # the key leaves custom_id out
    assert exact_counts(counter, same_question, cache).sent == 0
    too_many = exact_counts(counter, [chat_line(f"n{i}", f"new {i}", model=MODEL) for i in range(3)], cache, max_uncached=2)
    assert too_many.counts is None and "not counted one by one" in str(too_many.reason)
    assert emu.request_count(*COUNT_ROUTE) == 7
    cache.close()


def test_daemon_planning_uses_exact_counts_and_replans(home: Home, emu: Emulator, tmp_path: Path) -> None:
    """plan_with_exact_counts: the planned chunks carry the endpoint's counts; a split limit is
    applied to those counts; without a counter the tiktoken plan stays, labelled an estimate."""
    from batchgrader.core.configuration.config import load_config
    from batchgrader.pipeline.prepare import limits_for, prepare
    from batchgrader.pipeline.pricing import load_pricing
    from batchgrader.provider.counting import plan_with_exact_counts

    home.config_file.write_text(f"provider: anthropic\nmodel: {MODEL}\nsplit_token_limit: 200\n")
    prof = load_config(home, environ={}).default
    f = _data(tmp_path, 12)
    req = tmp_path / "requests.jsonl"
    prices = load_pricing()

    def prepared():  # noqa: ANN202
        with open(req, "wb") as out:
            return prepare(f, prof, home, requests_out=out, prices=prices)

    local = prepared()
    counter = AnthropicTokenCounter(AnthropicProvider(KEY, emu.root_url, timeout=10))
    cache = CountCache(tmp_path / "c.sqlite")
    limits = limits_for(prof, None)
    exact = prepared()
    info = plan_with_exact_counts(exact, req, "anthropic", counter, cache, limits)
    assert info is not None and info["exact"] is True and info["source"] == "anthropic counting endpoint"
    lines = [json.loads(x) for x in req.read_bytes().splitlines()]
    assert list(exact.tokens) == [counter.count_tokens([x])[0] for x in lines]
    assert info["input_tokens"] == exact.input_tokens == sum(exact.tokens)
    assert all(c.input_tokens <= 200 for c in exact.chunks) and sum(c.requests for c in exact.chunks) == 12
    if list(exact.tokens) != list(local.tokens):  # the stand-in tokenizer differs: so may the plan
        assert exact.input_tokens != local.input_tokens
    unknown = prepared()
    none = plan_with_exact_counts(unknown, req, "anthropic", None, cache, limits)
    assert none == {"exact": False, "source": "estimate", "input_tokens": local.input_tokens, "reason": none["reason"]}
    assert "no API key" in str(none["reason"]) and list(unknown.tokens) == list(local.tokens)
    assert plan_with_exact_counts(prepared(), req, "openai", counter, cache, limits) is None
    cache.close()

"""Prompt caching (issue 26): requests laid out with the shared part first and marked for each
provider's cache, the emulators applying each provider's caching rules (over real HTTP, through
the official SDKs), and cache reads and writes priced from the usage the provider reports."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as gtypes

from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.emulator.prompt_cache import OPENAI_INCREMENT, system_tokens
from batchgrader.pipeline.answerkey import line_key, line_keys
from batchgrader.pipeline.caching import CACHE_KEY_FIELD, cache_key, shared_prefix_tokens
from batchgrader.pipeline.merge import StreamedMerge, cache_figures
from batchgrader.pipeline.prepare import prepare
from batchgrader.pipeline.pricing import billed_cost, cache_saving, load_pricing
from batchgrader.pipeline.results import parse_line
from batchgrader.provider.anthropic_api import to_anthropic_request, to_openai_result_line
from batchgrader.provider.gemini_api import to_gemini_line
from batchgrader.provider.gemini_api import to_openai_result_line as gemini_result_line
from emulator_fixtures import API_KEY, chat_line, jsonl, run_to_terminal, upload

PRICES = load_pricing()
#: a rubric of about 2,000 tokens: long enough for every provider's minimum but Gemini 2.5 Pro's
RUBRIC = "You grade short essays on a scale of 1 to 5. " + " ".join(
    f"Criterion {i}: the essay states its claim, supports it with evidence and concludes clearly." for i in range(110)
)
SHORT = "You grade short essays on a scale of 1 to 5."


def _profile(home: Home, text: str) -> Any:
    home.config_file.write_text(text)
    return load_config(home, environ={}).default


def _lines(tmp_path: Path, home: Home, config: str, rows: int = 3) -> list[dict[str, Any]]:
    f = tmp_path / "essays.csv"
    f.write_text("id,response\n" + "".join(f"{i},essay number {i} about bridges\n" for i in range(rows)), encoding="utf-8")
    buf = io.BytesIO()
    prepare(f, _profile(home, config), home, requests_out=buf)
    return [json.loads(x) for x in buf.getvalue().splitlines()]


def _raw_lines(tmp_path: Path, home: Home, config: str) -> list[bytes]:
    f = tmp_path / "essays.csv"
    f.write_text("id,response\n1,first essay\n2,a second essay\n", encoding="utf-8")
    buf = io.BytesIO()
    prepare(f, _profile(home, config), home, requests_out=buf)
    return buf.getvalue().splitlines()


# --- the layout ---------------------------------------------------------------------------------


def test_two_rows_share_a_byte_identical_prefix_holding_the_whole_shared_part(tmp_path: Path, home: Home) -> None:
    a, b = _raw_lines(tmp_path, home, f"system_prompt: {json.dumps(RUBRIC)}\n")
    ja, jb = json.loads(a), json.loads(b)
    # everything but the custom_id and the row's user message is the same bytes, in the same place
    body_a = a[a.index(b'"body"') :]
    body_b = b[b.index(b'"body"') :]
    shared = os.path.commonprefix([body_a, body_b])
    assert json.dumps(RUBRIC)[1:-1].encode() in shared  # the system prompt (with examples) comes first
    assert ja["body"]["messages"][0] == jb["body"]["messages"][0] == {"role": "system", "content": RUBRIC}
    assert ja["body"]["messages"][-1]["content"] != jb["body"]["messages"][-1]["content"]
    assert {k: v for k, v in ja["body"].items() if k != "messages"} == {k: v for k, v in jb["body"].items() if k != "messages"}


def test_openai_requests_carry_one_cache_key_per_job_and_profile(tmp_path: Path, home: Home) -> None:
    lines = _lines(tmp_path, home, f"system_prompt: {json.dumps(SHORT)}\n")
    keys = {line["body"][CACHE_KEY_FIELD] for line in lines}
    assert len(keys) == 1 and keys.pop().startswith("bg-")
    assert cache_key("default", "a" * 64) != cache_key("other", "a" * 64) != cache_key("default", "b" * 64)
    assert cache_key("default", "a" * 64) == cache_key("default", "a" * 64)
    off = _lines(tmp_path, home, f"system_prompt: {json.dumps(SHORT)}\nprompt_caching: false\n")
    assert all(CACHE_KEY_FIELD not in line["body"] for line in off)


def test_the_cache_key_is_not_part_of_the_request_key(tmp_path: Path, home: Home) -> None:
    on = _raw_lines(tmp_path, home, f"system_prompt: {json.dumps(SHORT)}\n")
    off = _raw_lines(tmp_path, home, f"system_prompt: {json.dumps(SHORT)}\nprompt_caching: false\n")
    assert on != off and CACHE_KEY_FIELD.encode() in on[0]
    assert [line_key("p", x) for x in on] == [line_key("p", x) for x in off]
    assert list(line_keys("p", on)) == list(line_keys("p", off))  # the fast path agrees


def test_azure_requests_carry_no_cache_key(tmp_path: Path, home: Home) -> None:
    config = "provider: azure\nazure_endpoint: https://example.openai.azure.com\nazure_model: gpt-4.1-mini\nmodel: my-dep\n"
    assert all(CACHE_KEY_FIELD not in line["body"] for line in _lines(tmp_path, home, config))


@pytest.mark.parametrize(
    ("system", "marked"),
    [(RUBRIC, True), (SHORT, False)],
)
def test_anthropic_marks_the_shared_part_only_when_it_reaches_the_models_minimum(
    tmp_path: Path, home: Home, system: str, marked: bool
) -> None:
    config = f"provider: anthropic\nmodel: claude-sonnet-4-6\nsystem_prompt: {json.dumps(system)}\n"
    assert (shared_prefix_tokens(system, "claude-sonnet-4-6", "o200k_base") >= 1024) is marked
    lines = _lines(tmp_path, home, config)
    params = [to_anthropic_request(line)["params"] for line in lines]
    if marked:
        assert all(p["system"] == [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}] for p in params)
    else:
        assert all(p["system"] == system for p in params) and all(CACHE_KEY_FIELD not in line["body"] for line in lines)
    off = _lines(tmp_path, home, config + "prompt_caching: false\n")
    assert all(to_anthropic_request(line)["params"]["system"] == system for line in off)


def test_anthropic_minimum_comes_from_the_catalogue(tmp_path: Path, home: Home) -> None:
    # about 2,000 tokens: enough for Sonnet 4.5 (1,024) but not for Haiku 4.5 (4,096)
    assert PRICES.get("claude-haiku-4-5").spec.min_cache_prefix == 4096
    config = f"provider: anthropic\nmodel: claude-haiku-4-5\nsystem_prompt: {json.dumps(RUBRIC)}\n"
    lines = _lines(tmp_path, home, config)
    assert all(isinstance(to_anthropic_request(line)["params"]["system"], str) for line in lines)


def test_gemini_requests_send_nothing_for_caching(tmp_path: Path, home: Home) -> None:
    config = f"provider: gemini\nmodel: gemini-2.5-flash\nsystem_prompt: {json.dumps(RUBRIC)}\n"
    for line in _lines(tmp_path, home, config):
        assert CACHE_KEY_FIELD not in json.dumps(to_gemini_line(line))
        assert "cachedContent" not in json.dumps(to_gemini_line(line))


# --- pricing --------------------------------------------------------------------------------------


def test_cache_reads_and_writes_are_priced_exactly() -> None:
    sonnet = PRICES.get("claude-sonnet-4-5")  # batch: input 1.5, cached 0.15, cache write 1.875, output 7.5
    assert billed_cost(sonnet, 3000, 2000, 100, 0) == pytest.approx((1000 * 1.5 + 2000 * 0.15 + 100 * 7.5) / 1e6, abs=1e-15)
    assert billed_cost(sonnet, 3000, 0, 100, 2000) == pytest.approx((1000 * 1.5 + 2000 * 1.875 + 100 * 7.5) / 1e6, abs=1e-15)
    assert cache_saving(sonnet, 3000, 2000, 100, 0) == pytest.approx(2000 * (1.5 - 0.15) / 1e6, abs=1e-15)
    assert cache_saving(sonnet, 3000, 0, 100, 2000) == pytest.approx(-2000 * (1.875 - 1.5) / 1e6, abs=1e-15)
    gpt4o = PRICES.get("gpt-4o")  # no batch cache rate in the catalogue: nothing saved, nothing invented
    assert cache_saving(gpt4o, 3000, 2000, 100) == 0.0
    with pytest.raises(ValueError, match="cannot exceed"):
        cache_saving(sonnet, 100, 90, 0, 20)


def test_merge_figures_only_when_the_cache_was_used() -> None:
    sonnet = PRICES.get("claude-sonnet-4-5")
    used = StreamedMerge(
        rows=2,
        failed_rows=[],
        usage={"prompt_tokens": 6000, "cached_tokens": 2000, "completion_tokens": 200, "reasoning_tokens": 0},
        cache_write_tokens=2000,
    )
    figures = cache_figures(used, sonnet)
    assert figures == {"cache_write_tokens": 2000, "cache_saved_usd": pytest.approx(2000 * (1.35 - 0.375) / 1e6)}
    unused = StreamedMerge(
        rows=1,
        failed_rows=[],
        usage={"prompt_tokens": 60, "cached_tokens": 0, "completion_tokens": 2, "reasoning_tokens": 0},
    )
    assert cache_figures(unused, sonnet) == {}


# --- the emulators, over real HTTP with the official SDKs ------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def emu(clock: ManualClock) -> Iterator[Emulator]:
    cfg = EmulatorConfig(clock=clock, api_key=API_KEY, validating_s=1, in_progress_s=5, finalizing_s=1, shuffle_output=False)
    with Emulator(cfg) as e:
        yield e


def _openai_usages(emu: Emulator, clock: ManualClock, lines: list[dict[str, Any]]) -> list[Any]:
    client = openai.OpenAI(base_url=emu.base_url, api_key=API_KEY, max_retries=0)
    f = upload(client, jsonl(lines))
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = run_to_terminal(client, clock, b.id, step=1.0)
    assert done.status == "completed" and done.output_file_id
    out = [json.loads(x) for x in client.files.content(done.output_file_id).content.splitlines()]
    by_id = {o["custom_id"]: o for o in out}
    return [by_id[line["custom_id"]] for line in lines]


def test_openai_emulator_caches_prefixes_of_1024_tokens_in_128_token_steps(emu: Emulator, clock: ManualClock) -> None:
    model = "gpt-5-mini"
    lines = [chat_line(f"r-{i}", f"Essay {i}.", model=model, system=RUBRIC, prompt_cache_key="bg-job") for i in range(3)]
    lines.append(chat_line("other-key", "Essay 3.", model=model, system=RUBRIC, prompt_cache_key="bg-other"))
    lines.append(chat_line("short-0", "Essay.", model=model, system=SHORT))
    lines.append(chat_line("short-1", "Essay!", model=model, system=SHORT))
    out = _openai_usages(emu, clock, lines)
    usages = [openai.types.chat.ChatCompletion.model_validate(o["response"]["body"]).usage for o in out]
    cached = [u.prompt_tokens_details.cached_tokens for u in usages]  # type: ignore[union-attr]
    assert cached[0] == 0  # the first request with the prefix misses
    assert cached[1] == cached[2] > 0 and cached[1] >= 1024 and cached[1] % OPENAI_INCREMENT == 0
    assert cached[1] <= usages[1].prompt_tokens  # type: ignore[union-attr]
    assert cached[3] == 0  # another prompt_cache_key is another cache
    assert cached[4] == cached[5] == 0  # under 1,024 tokens: never cached
    # priced exactly from the reported usage
    outcome = parse_line(out[1])
    price = PRICES.get(model)
    assert outcome.cached_tokens == cached[1]
    expected = (
        (outcome.prompt_tokens - cached[1]) * price.input_per_1m
        + cached[1] * price.effective_cached_per_1m
        + outcome.completion_tokens * price.output_per_1m
    ) / 1e6
    assert billed_cost(price, outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens) == pytest.approx(expected)


def _anthropic_results(emu: Emulator, clock: ManualClock, requests: list[dict[str, Any]]) -> dict[str, Any]:
    client = anthropic.Anthropic(base_url=emu.root_url, api_key=API_KEY, max_retries=0)
    b = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    clock.advance(10)
    assert client.messages.batches.retrieve(b.id).processing_status == "ended"
    return {r.custom_id: r for r in client.messages.batches.results(b.id)}


def test_anthropic_emulator_writes_then_reads_a_marked_prefix(emu: Emulator, clock: ManualClock) -> None:
    model = "claude-sonnet-4-5"
    lines = [chat_line(f"r-{i}", f"Essay {i}.", model=model, system=RUBRIC, prompt_cache_key="bg-job") for i in range(3)]
    lines.append(chat_line("unmarked", "Essay 3.", model=model, system=RUBRIC))
    results = _anthropic_results(emu, clock, [to_anthropic_request(x) for x in lines])
    u = {cid: r.result.message.usage for cid, r in results.items()}  # type: ignore[union-attr]  # the SDK's own Usage type
    prefix = system_tokens(RUBRIC)
    assert prefix >= 1024
    assert (u["r-0"].cache_creation_input_tokens, u["r-0"].cache_read_input_tokens) == (prefix, 0)
    assert (u["r-1"].cache_creation_input_tokens, u["r-1"].cache_read_input_tokens) == (0, prefix)
    assert (u["r-2"].cache_creation_input_tokens, u["r-2"].cache_read_input_tokens) == (0, prefix)
    assert (u["unmarked"].cache_creation_input_tokens, u["unmarked"].cache_read_input_tokens) == (0, 0)
    total = u["unmarked"].input_tokens
    assert u["r-1"].input_tokens + prefix == total and u["r-0"].input_tokens + prefix == total
    # through the adapter and the results parser: every input token counted, reads and writes apart, priced exactly
    price = PRICES.get(model)
    first = parse_line(to_openai_result_line(results["r-0"].model_dump(mode="json")))
    later = parse_line(to_openai_result_line(results["r-1"].model_dump(mode="json")))
    assert (first.prompt_tokens, first.cache_write_tokens, first.cached_tokens) == (total, prefix, 0)
    assert (later.prompt_tokens, later.cache_write_tokens, later.cached_tokens) == (total, 0, prefix)
    cost_first = billed_cost(price, first.prompt_tokens, first.cached_tokens, first.completion_tokens, first.cache_write_tokens)
    cost_later = billed_cost(price, later.prompt_tokens, later.cached_tokens, later.completion_tokens, later.cache_write_tokens)
    assert cost_first == pytest.approx(
        ((total - prefix) * 1.5 + prefix * price.spec.cache_write_per_1m + first.completion_tokens * 7.5) / 1e6  # type: ignore[operator]
    )
    assert cost_later == pytest.approx(((total - prefix) * 1.5 + prefix * 0.15 + later.completion_tokens * 7.5) / 1e6)


def test_anthropic_emulator_does_not_cache_a_prefix_under_the_models_minimum(emu: Emulator, clock: ManualClock) -> None:
    # claude-haiku-4-5 caches from 4,096 tokens: a marked ~2,000-token prefix is neither written nor read
    marked = [{"type": "text", "text": RUBRIC, "cache_control": {"type": "ephemeral"}}]
    requests = [
        {
            "custom_id": f"h-{i}",
            "params": {
                "model": "claude-haiku-4-5",
                "max_tokens": 100,
                "system": marked,
                "messages": [{"role": "user", "content": f"Essay {i}."}],
            },
        }
        for i in range(2)
    ]
    results = _anthropic_results(emu, clock, requests)
    for r in results.values():
        usage = r.result.message.usage  # type: ignore[union-attr]
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)


def _gemini_usages(emu: Emulator, clock: ManualClock, tmp_path: Path, model: str, lines: list[dict[str, Any]]) -> list[Any]:
    client = genai.Client(api_key=API_KEY, http_options=gtypes.HttpOptions(base_url=emu.root_url))
    p = tmp_path / "in.jsonl"
    p.write_bytes(jsonl(to_gemini_line(x) for x in lines))
    f = client.files.upload(file=p, config={"display_name": "in.jsonl", "mime_type": "jsonl"})
    assert f.name
    b = client.batches.create(model=model, src=f.name, config={"display_name": "job:0:1"})
    clock.advance(10)
    done = client.batches.get(name=b.name)  # type: ignore[arg-type]
    assert done.dest and done.dest.file_name
    out = {r["key"]: r for r in map(json.loads, client.files.download(file=done.dest.file_name).splitlines())}
    return [out[x["custom_id"]] for x in lines]


def test_gemini_emulator_caches_implicitly_from_the_models_minimum(emu: Emulator, clock: ManualClock, tmp_path: Path) -> None:
    lines = [chat_line(f"g-{i}", f"Essay {i}.", model="gemini-2.5-flash", system=RUBRIC) for i in range(3)]
    out = _gemini_usages(emu, clock, tmp_path, "gemini-2.5-flash", lines)
    metas = [gtypes.GenerateContentResponse.model_validate(o["response"]).usage_metadata for o in out]  # the SDK's type
    prefix = system_tokens(RUBRIC)
    assert [m.cached_content_token_count for m in metas] == [None, prefix, prefix]  # type: ignore[union-attr]
    assert all(m.prompt_token_count > prefix for m in metas)  # type: ignore[union-attr,operator]
    outcome = parse_line(gemini_result_line(out[1]))
    assert outcome.cached_tokens == prefix and outcome.prompt_tokens == metas[1].prompt_token_count  # type: ignore[union-attr]


def test_gemini_emulator_does_not_cache_under_the_pro_minimum(emu: Emulator, clock: ManualClock, tmp_path: Path) -> None:
    # gemini-2.5-pro caches implicitly from 4,096 tokens (the catalogue's min_cache_prefix)
    lines = [chat_line(f"p-{i}", f"Essay {i}.", model="gemini-2.5-pro", system=RUBRIC) for i in range(2)]
    out = _gemini_usages(emu, clock, tmp_path, "gemini-2.5-pro", lines)
    assert all("cachedContentTokenCount" not in o["response"]["usageMetadata"] for o in out)


# --- end to end: the daemon against the emulator ------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sandbox_anthropic_job_records_and_shows_what_caching_saved(tmp_path: Path) -> None:
    from batchgrader.core.log.state import fold
    from batchgrader.store.eventstore import EventStore
    from harness import FAST_CONFIG
    from test_anthropic_daemon import ANTHROPIC_KEY, run

    home = tmp_path / "home"
    (home / "inbox").mkdir(parents=True)
    (home / "config.yaml").write_text(
        FAST_CONFIG
        + f"provider: anthropic\nmodel: claude-sonnet-4-6\nreasoning_effort: none\nwrite_report: true\nsystem_prompt: {json.dumps(RUBRIC)}\n"
    )
    (home / "inbox" / "essays.csv").write_text("id,response\n" + "".join(f"{i},essay {i} on bridges\n" for i in range(5)))
    with Emulator(EmulatorConfig(api_key=ANTHROPIC_KEY, seed=7)) as emu:
        res = run(home, emu, "daemon", "--once")
        assert res.returncode == 0, res.stderr
        with EventStore(home / "batchgrader.db", readonly=True) as s:
            events = list(s.read())
        (job,) = fold(events).jobs.values()
        used = [e.payload for e in events if e.type == "TokensUsed"]
        prefix = system_tokens(RUBRIC)
        # one batch: the first request writes the prefix, the four others read it
        assert (job.cache_write_tokens, job.cached_tokens) == (prefix, 4 * prefix)
        price = PRICES.get("claude-sonnet-4-6")
        expected = sum(
            cache_saving(price, u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"], u["cache_write_tokens"])
            for u in used
        )
        assert job.cache_saved_usd == pytest.approx(expected) and expected > 0
        assert job.cost_usd == pytest.approx(
            sum(
                billed_cost(price, u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"], u["cache_write_tokens"])
                for u in used
            )
        )
        detail = run(home, emu, "status", job.job_id)
        assert "prompt cache" in detail.stdout and f"{4 * prefix:,} tokens read, {prefix:,} written" in detail.stdout
        costs = json.loads(run(home, emu, "costs", "--json").stdout)
        assert costs["totals"]["cache_saved_usd"] == pytest.approx(expected)  # a real job (its provider is the emulator)
        text = run(home, emu, "report", job.job_id).stdout
        assert f"cache     {4 * prefix:,} tokens read, {prefix:,} written; saved ${expected:,.4f}" in text
    (page,) = [p for p in (home / "outbox").rglob("*.html")]
    assert "prompt-cache writes (tokens)" in page.read_text() and "saved by prompt caching (USD)" in page.read_text()

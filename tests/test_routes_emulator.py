"""The synchronous routes against the emulator over real HTTP through the official SDK (issue 26):
its per-minute limits (429 with Retry-After and the providers' rate-limit headers), OpenAI's flex
tier where the model has it, and a 50-row file on ``route: online`` with limits low enough that
429s happen: every row answered once, no request sent before the Retry-After allowed."""

from __future__ import annotations

import csv
import io
from datetime import datetime

import openai
import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.store.eventstore import EventStore
from harness import FAST_CONFIG, TEST_KEY, bgctl

pytestmark = pytest.mark.timeout(180)
MESSAGES = [{"role": "user", "content": "grade this"}]


def test_over_the_per_minute_limit_a_429_carries_retry_after_and_the_rate_limit_headers():
    with Emulator(EmulatorConfig(api_key=TEST_KEY, sync_requests_per_minute=2, sync_limit_window_s=30.0)) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key=TEST_KEY, max_retries=0)
        for _ in range(2):
            client.chat.completions.create(model="gpt-5.4-mini", messages=MESSAGES, max_completion_tokens=20)
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(model="gpt-5.4-mini", messages=MESSAGES, max_completion_tokens=20)
        h = err.value.response.headers
        assert h["x-ratelimit-limit-requests"] == "2" and h["x-ratelimit-remaining-requests"] == "0"
        assert 0 < float(h["retry-after-ms"]) <= 30_000 and 1 <= int(h["retry-after"]) <= 30
        assert h["x-ratelimit-reset-requests"].endswith("s")
        assert err.value.code == "rate_limit_exceeded"
        # another model has its own limit
        client.chat.completions.create(model="gpt-4.1-nano", messages=MESSAGES, max_completion_tokens=20)


@pytest.mark.slow  # importing the anthropic SDK takes seconds on a loaded machine
def test_anthropic_429_carries_its_own_rate_limit_headers():
    import anthropic

    with Emulator(EmulatorConfig(api_key=TEST_KEY, sync_requests_per_minute=1)) as emu:
        client = anthropic.Anthropic(base_url=emu.root_url, api_key=TEST_KEY, max_retries=0)
        client.messages.create(model="claude-haiku-4-5", max_tokens=20, messages=MESSAGES)
        with pytest.raises(anthropic.RateLimitError) as err:
            client.messages.create(model="claude-haiku-4-5", max_tokens=20, messages=MESSAGES)
        h = err.value.response.headers
        assert h["anthropic-ratelimit-requests-limit"] == "1" and h["anthropic-ratelimit-requests-remaining"] == "0"
        assert datetime.fromisoformat(h["anthropic-ratelimit-requests-reset"].replace("Z", "+00:00"))
        assert int(h["retry-after"]) >= 1
        # the adapter hands the wait to the engine
        from batchgrader.provider.anthropic_batches import AnthropicBatchProvider
        from batchgrader.provider.protocol import ProviderRejected

        provider = AnthropicBatchProvider(TEST_KEY, emu.root_url, max_retries=0)
        line = {
            "custom_id": "r1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "claude-haiku-4-5", "messages": MESSAGES, "max_tokens": 20},
        }
        with pytest.raises(ProviderRejected) as rejected:
            provider.complete(line, "job")
        assert rejected.value.retryable and rejected.value.retry_after is not None and rejected.value.retry_after > 0


def test_flex_is_served_only_for_models_that_have_it_and_the_answer_says_so():
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key=TEST_KEY, max_retries=0)
        got = client.chat.completions.create(model="o4-mini", messages=MESSAGES, max_completion_tokens=2000, service_tier="flex")
        assert got.service_tier == "flex"
        plain = client.chat.completions.create(model="gpt-4.1-nano", messages=MESSAGES, max_completion_tokens=20)
        assert plain.service_tier == "default"
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="gpt-4.1-nano", messages=MESSAGES, max_completion_tokens=20, service_tier="flex")
        assert err.value.status_code == 400 and "flex" in str(err.value.message).lower()


@pytest.mark.slow
def test_a_50_row_file_online_under_a_low_limit_answers_every_row_once_and_waits_for_retry_after(home):
    home.config_file.write_text(FAST_CONFIG + "route: online\nonline_concurrency: 4\n")
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(50)))
    config = EmulatorConfig(api_key=TEST_KEY, sync_requests_per_minute=12, sync_limit_window_s=2.0)
    with Emulator(config) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url, timeout=150).returncode == 0
        log = list(emu.store.sync_limits().log)
        assert emu.batches_created() == 0
    statuses = [status for _, _, status, _ in log]
    assert statuses.count(200) == 50 and statuses.count(429) > 0  # every row answered once; 429s happened
    with EventStore(home.db, readonly=True) as s:
        events = list(s.read())
    (job,) = fold(events).jobs.values()
    assert job.ended == "completed"
    answered = [e.payload["custom_id"] for e in events if e.type == "OnlineRequestAnswered"]
    assert len(answered) == len(set(answered)) == 50
    # no request left before the Retry-After of a 429 seen before it had passed
    waits: list[float] = []
    for e in events:
        if e.type == "OnlineRequestFailed" and e.payload["retry_at"] is not None:
            waits.append(float(e.payload["retry_at"]))
        elif e.type == "OnlineRequestSent" and waits:
            assert datetime.fromisoformat(e.ts).timestamp() >= max(waits) - 0.005, e.payload
    assert waits
    rows = list(csv.DictReader(io.StringIO((home.outbox / "a_results.csv").read_text(encoding="utf-8"))))
    assert len(rows) == 50 and all(r["error"] == "" and r["answered_by"] == "online" for r in rows)

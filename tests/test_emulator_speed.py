"""The emulator does a provider's own work (counting, validating) off the request path, like a
real provider: token counts are cached by content, and a batch's input file is parsed and
counted in the background, so that no client request waits for it.  Real HTTP, real SDK."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.emulator.answers import _countable_messages
from batchgrader.emulator.background import TokenCache
from batchgrader.pipeline.tokens import ChatTokenCounter
from emulator_fixtures import (  # noqa: F401 - fixtures
    CHAT,
    MODEL,
    chat_line,
    clock,
    emu_factory,
    jsonl,
    read_jsonl,
    run_to_terminal,
    sdk_client,
    simple_input,
    upload,
    wait_for,
)

WORDS = "the a product quality service delivery price support team value order refund fast slow good poor".split()


def create_batch(client: openai.OpenAI, data: bytes) -> Any:
    f = upload(client, data)
    return client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")


def essays(n: int, words: int = 12) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        text = " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words + i % 5))
        rows.append(chat_line(f"row-{i}", f"Essay {i}: {text}", system="Grade the essay from 1 to 5."))
    return rows


def prompt_tokens(client: openai.OpenAI, batch: Any) -> dict[str, int]:
    lines = read_jsonl(client, batch.output_file_id)
    return {l["custom_id"]: l["response"]["body"]["usage"]["prompt_tokens"] for l in lines}


def exact(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts = ChatTokenCounter(MODEL, num_threads=1).count_many([_countable_messages(r["body"]["messages"]) for r in rows])
    return {r["custom_id"]: n for r, n in zip(rows, counts)}


# --- token counts cached by content ---------------------------------------------------------


def test_a_replanned_batch_of_the_same_requests_is_not_counted_again(emu_factory, clock):
    e = emu_factory()
    c = sdk_client(e)
    rows = essays(40)
    first = run_to_terminal(c, clock, create_batch(c, jsonl(rows)).id)
    assert first.status == "completed"
    assert prompt_tokens(c, first) == exact(rows)
    assert e.stats()["tokens_counted_requests"] == 40
    # the client re-plans the same rows into two smaller batches (same custom_ids, same bodies)
    halves = [run_to_terminal(c, clock, create_batch(c, jsonl(part)).id) for part in (rows[:25], rows[25:])]
    assert {**prompt_tokens(c, halves[0]), **prompt_tokens(c, halves[1])} == prompt_tokens(c, first)
    assert e.stats()["tokens_counted_requests"] == 40  # parsed again, counted never again
    # a message that differs (by one character, or only in its role) is counted, exactly
    changed = [dict(rows[3], custom_id="changed")]
    changed[0]["body"] = json.loads(json.dumps(rows[3]["body"]))
    changed[0]["body"]["messages"][1]["content"] += " Thanks, and many thanks again."
    role = [json.loads(json.dumps(rows[4]))]
    role[0]["custom_id"] = "role"
    role[0]["body"]["messages"][0]["name"] = "grader"
    third = run_to_terminal(c, clock, create_batch(c, jsonl(changed + role)).id)
    got = prompt_tokens(c, third)
    assert got == exact(changed + role)
    assert got["changed"] > prompt_tokens(c, first)["row-3"] and got["role"] > prompt_tokens(c, first)["row-4"]
    assert e.stats()["tokens_counted_requests"] == 42


def test_the_token_cache_is_bounded_and_stays_exact():
    cache = TokenCache(cap=8)
    requests = [[{"role": "user", "content": f"request number {i} " + "word " * i}] for i in range(20)]
    truth = ChatTokenCounter(MODEL, num_threads=1).count_many(requests)
    assert cache.count_many(MODEL, requests) == truth
    assert len(cache) <= 8 and cache.counted_requests == 20
    assert cache.count_many(MODEL, requests[-4:]) == truth[-4:]  # the newest entries are kept
    assert cache.counted_requests == 20
    assert cache.count_many(MODEL, requests[:2] + requests[:2]) == truth[:2] * 2  # the oldest were dropped
    assert cache.counted_requests == 22  # counted again, each distinct request once
    assert TokenCache().count_many("gpt-4", requests[:1]) == ChatTokenCounter("gpt-4", num_threads=1).count_many(requests[:1])


# --- validation off the request path --------------------------------------------------------


def big_input(n: int, words: int) -> bytes:
    """``n`` distinct chat requests of about ``words`` words each, built quickly."""
    lines = []
    for i in range(n):
        text = " ".join(WORDS[(i + j * j) % len(WORDS)] for j in range(words))
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"Review {i}: {text}"}]}
        lines.append(json.dumps({"custom_id": f"big-{i}", "method": "POST", "url": CHAT, "body": body}))
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.slow  # a large batch validated in the background
def test_requests_return_at_once_while_a_large_batch_is_being_validated(emu_factory):
    """On the real clock the parse-and-count of a 20,000-request file happens in the background:
    a retrieve of another batch and a create return at once while the large batch is still
    validating (before, the first request after its create did that work, under the lock)."""
    e = emu_factory(clock=time.time, validating_s=0.0, in_progress_s=3600.0)
    c = sdk_client(e, timeout=60.0)
    small = create_batch(c, simple_input(3))
    wait_for(lambda: c.batches.retrieve(small.id).status == "in_progress")
    big_file = upload(c, big_input(20_000, 60))
    small_file = upload(c, simple_input(2, prefix="other"))
    big = c.batches.create(input_file_id=big_file.id, endpoint=CHAT, completion_window="24h")
    t0 = time.monotonic()
    assert c.batches.retrieve(small.id).status == "in_progress"
    retrieve_s = time.monotonic() - t0
    t0 = time.monotonic()
    other = c.batches.create(input_file_id=small_file.id, endpoint=CHAT, completion_window="24h")
    create_s = time.monotonic() - t0
    assert retrieve_s < 1.0 and create_s < 1.0, (retrieve_s, create_s)
    assert c.batches.retrieve(big.id).status == "validating"  # its validation is still running
    seen = wait_for(lambda: (b := c.batches.retrieve(big.id)).status != "validating" and b, timeout=120)
    assert seen.status == "in_progress" and seen.request_counts.total == 20_000
    assert seen.in_progress_at >= seen.created_at
    # its requests run from the configured end of validating (here: its create), not from when
    # this process finished counting: the emulator's own CPU does not lengthen the batch
    inner = e.store.state.batches[big.id]
    assert inner.t_in_progress == inner.t_created + 0.0
    wait_for(lambda: c.batches.retrieve(other.id).status == "in_progress")  # validated in turn
    assert e.stats()["tokens_counted_requests"] == 20_000 + 3  # "other" repeats two of the small requests


def test_a_restart_mid_validation_still_validates_the_batch(tmp_path: Path):
    cfg = EmulatorConfig(clock=time.time, data_dir=str(tmp_path / "emu"), validating_s=0.0, in_progress_s=3600.0)
    with Emulator(cfg) as e1:
        c = sdk_client(e1)
        b = create_batch(c, big_input(3_000, 40))
    with Emulator(cfg) as e2:
        c = sdk_client(e2)
        seen = wait_for(lambda: (x := c.batches.retrieve(b.id)).status != "validating" and x, timeout=60)
        assert seen.status == "in_progress" and seen.request_counts.total == 3_000


# --- answers off the request path -----------------------------------------------------------

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "grade",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}, "reason": {"type": "string"}},
            "required": ["score", "reason"],
            "additionalProperties": False,
        },
    },
}


def undated(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Output lines without what names the batch (line and request ids) or dates the answer."""
    out = {}
    for line in lines:
        line = json.loads(json.dumps(line))
        del line["id"]
        if line["response"] is not None:
            del line["response"]["request_id"]
            line["response"]["body"].pop("created", None)
        out[line["custom_id"]] = line
    return out


def test_answers_drafted_in_the_background_are_the_answers_made_in_place(emu_factory, clock):
    rows = essays(30)
    rows[1]["body"]["response_format"] = SCHEMA
    rows[2]["body"]["n"] = 2
    rows[3]["body"]["max_completion_tokens"] = 3
    rows[4]["body"]["messages"][1]["content"] += " __FAIL_500__"
    data = jsonl(rows)
    manual = sdk_client(emu_factory())
    in_place = run_to_terminal(manual, clock, create_batch(manual, data).id)
    real = sdk_client(emu_factory(clock=time.time, validating_s=0.0, in_progress_s=0.3, finalizing_s=0.0))
    b = create_batch(real, data)
    drafted = wait_for(lambda: (x := real.batches.retrieve(b.id)).status == "completed" and x, timeout=30)
    assert drafted.request_counts == in_place.request_counts and drafted.usage == in_place.usage
    ok = read_jsonl(real, drafted.output_file_id)
    assert undated(ok) == undated(read_jsonl(manual, in_place.output_file_id))
    assert undated(read_jsonl(real, drafted.error_file_id)) == undated(read_jsonl(manual, in_place.error_file_id))
    assert all(drafted.in_progress_at <= l["response"]["body"]["created"] <= drafted.completed_at for l in ok)


@pytest.mark.slow
def test_a_retrieve_that_finds_a_large_batch_processed_returns_at_once(emu_factory):
    """On the real clock the answers of a running batch are drafted in the background, so the
    retrieve that finds all 20,000 requests processed (and the batch completed) only dates them
    and writes the result files (before, it generated every answer under the lock)."""
    run_s = 8.0  # long enough that a loaded machine's validation does not run past it
    e = emu_factory(clock=time.time, validating_s=0.0, in_progress_s=run_s, finalizing_s=0.0)
    c = sdk_client(e, timeout=60.0)
    rows = [
        json.dumps(
            {
                "custom_id": f"s-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {**json.loads(line)["body"], "response_format": SCHEMA},
            }
        )
        for i, line in enumerate(big_input(20_000, 30).decode().splitlines())
    ]
    data = ("\n".join(rows) + "\n").encode()
    # A batch runs from the configured end of validating (0 s here) however long its parse-and-count
    # takes, so a count slower than the run (a loaded machine) would leave nothing to draft in
    # the background.  The same file sent once before (and cancelled) leaves its counts cached:
    # the measured batch's validation is only its parsing.
    warm = create_batch(c, data)
    wait_for(lambda: e.background_jobs() == 0, timeout=120)
    c.batches.cancel(warm.id)
    b = create_batch(c, data)
    running = wait_for(lambda: (x := c.batches.retrieve(b.id)).status != "validating" and x, timeout=60)
    assert running.status == "in_progress"
    wait_for(lambda: e.background_jobs() == 0, timeout=60)  # every answer drafted (nothing retrieved meanwhile)
    wait_for(lambda: time.time() > running.in_progress_at + 1 + run_s + 0.5, timeout=30)  # all processed
    t0 = time.monotonic()
    done = c.batches.retrieve(b.id)
    took = time.monotonic() - t0
    assert done.status == "completed" and done.request_counts.completed == 20_000
    assert took < 1.0, took
    lines = read_jsonl(c, done.output_file_id)
    assert len(lines) == 20_000
    assert all(running.in_progress_at <= l["response"]["body"]["created"] <= done.completed_at for l in lines)

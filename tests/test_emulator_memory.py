"""The emulator's memory does not grow with a batch's size: a batch's input file and its answers
are kept on disk, its requests read again from the file when they are answered, and per request
only a few bytes (its prompt and cached tokens, how it fails) are held.  Real HTTP, real SDK."""

from __future__ import annotations

import tracemalloc

import pytest

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
    upload,
)

ROWS = 20_000
#: Traced bytes allowed while a 20,000-request batch is validated, run and finished: 8.7 MiB were
#: traced; holding the batch in memory (its parsed requests, answers and output file) took 89.5 MiB.
BOUND = 24 * 1024 * 1024


@pytest.mark.slow  # about 20 s of CPU (tracemalloc traces every allocation of the tokenizing)
def test_a_large_batch_is_validated_answered_and_finished_in_bounded_memory(emu_factory, clock):
    emu = emu_factory()
    client = sdk_client(emu, timeout=120.0)
    essay = "The product arrived on time and the support team answered every question politely. " * 3
    rows = [
        chat_line(f"row-{i}", f"Essay {i}: {essay}", system="Grade the essay from 1 to 5. Reply with the grade only.")
        for i in range(ROWS)
    ]
    f = upload(client, jsonl(rows))
    del rows
    ChatTokenCounter(MODEL, num_threads=1).count([{"role": "user", "content": "x"}])  # the encoding is loaded once
    tracemalloc.start()
    try:
        batch = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        done = run_to_terminal(client, clock, batch.id)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert done.status == "completed" and done.request_counts.completed == ROWS
    lines = read_jsonl(client, done.output_file_id)
    assert len({line["custom_id"] for line in lines}) == ROWS
    assert done.usage.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in lines)
    assert peak < BOUND, f"{peak / 2**20:.1f} MiB traced for a batch of {ROWS:,} requests"

"""The emulator's memory does not grow with a batch's size: an upload is received to disk as it
arrives, a batch's input file and its answers are kept on disk, its requests read again from the
file when they are answered, and per request only a few bytes (its prompt and cached tokens, how
it fails, its token count cached by content) are held.  Real HTTP, real SDK; memory traced with
``tracemalloc`` (the client's allocations included: it streams the file it is given open)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from emulator_fixtures import (  # noqa: F401 - fixtures
    CHAT,
    chat_line,
    clock,
    emu_factory,
    jsonl,
    read_jsonl,
    run_to_terminal,
    sdk_client,
)

#: An upload of 24 MiB is traced at under 2 MiB (blocks of 1 MiB are received at a time); held
#: whole while it arrives, the body alone is 24 MiB.
UPLOAD_MIB = 24
UPLOAD_BOUND = 8 * 2**20
#: Traced bytes per request, from the growth of the peak between a batch of SMALL and one of
#: LARGE requests, in each phase: about 110 (the token cache's entry, the plan's few bytes);
#: holding a batch's requests, answers or output in memory takes from 600 bytes (an answer line)
#: to several KiB a request.  Both sizes are above the 2,048 requests parsed at a time while a
#: batch is validated (``validation.PLAN_CHUNK``).
SMALL, LARGE = 2_100, 2_900
PER_REQUEST_BOUND = 400


def traced_peak(fn: Callable[[], Any]) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        out = fn()
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_an_upload_is_received_to_disk_not_held_in_memory(emu_factory, tmp_path: Path) -> None:
    emu = emu_factory()
    client = sdk_client(emu, timeout=60.0)
    line = jsonl([chat_line("row-0", "x" * 1000)])
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        for _ in range(UPLOAD_MIB * 2**20 // len(line)):
            fh.write(line)
    with open(path, "rb") as fh:
        peak, f = traced_peak(lambda: client.files.create(file=("big.jsonl", fh, "application/jsonl"), purpose="batch"))
    assert f.bytes == path.stat().st_size
    assert emu.file_bytes(f.id) == path.read_bytes()
    assert peak < UPLOAD_BOUND, f"{peak / 2**20:.1f} MiB traced while receiving a {UPLOAD_MIB} MiB upload"


def _phase_peaks(client: Any, clock: Any, tmp_path: Path, n: int) -> tuple[int, int]:
    """Traced peaks of a batch of ``n`` requests: while it is created and validated, and while
    it runs and finishes (apart, so that the validation's fixed work does not hide the rest)."""
    path = tmp_path / f"batch-{n}.jsonl"
    path.write_bytes(jsonl(chat_line(f"r{n}-{i}", f"Essay {n}-{i}: the product arrived on time.") for i in range(n)))
    with open(path, "rb") as fh:
        f = client.files.create(file=(path.name, fh, "application/jsonl"), purpose="batch")
    tracemalloc.start()
    try:
        batch = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        while (batch := client.batches.retrieve(batch.id)).status == "validating":
            clock.advance(0.05)
        validated = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        done = run_to_terminal(client, clock, batch.id)
        ran = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert done.status == "completed" and done.request_counts.completed == n
    lines = read_jsonl(client, done.output_file_id)
    assert len({line["custom_id"] for line in lines}) == n
    assert done.usage.input_tokens == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in lines)
    return validated, ran


@pytest.mark.slow  # a memory measurement of thousands of requests under tracemalloc
def test_a_batch_is_validated_answered_and_finished_in_memory_that_does_not_grow_with_it(
    emu_factory, clock, tmp_path: Path
) -> None:
    emu = emu_factory()
    client = sdk_client(emu, timeout=60.0)
    _phase_peaks(client, clock, tmp_path, 20)  # the tokenizer and the answer code are loaded once
    small = _phase_peaks(client, clock, tmp_path, SMALL)
    large = _phase_peaks(client, clock, tmp_path, LARGE)
    for phase, a, b in zip(("validating", "running and finishing"), small, large):
        per_request = (b - a) / (LARGE - SMALL)
        assert per_request < PER_REQUEST_BOUND, (
            f"{phase}: {per_request:.0f} bytes traced per request ({a / 2**20:.2f} MiB for {SMALL:,} requests, "
            f"{b / 2**20:.2f} MiB for {LARGE:,})"
        )

"""The provider client against the emulator: real SDK, real HTTP, scripted faults."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import openai
import pytest

from batchgrader.core.host.secrets import mask_secret
from batchgrader.emulator import FAULT_PROFILES, Fault
from batchgrader.provider.openai_api import (
    BatchInfo,
    FileInfo,
    OpenAIProvider,
    OutcomeUnknown,
    Provider,
    ProviderConfigError,
    ProviderRejected,
    ProviderUnavailable,
    create_batch_reconciled,
    parse_retry_after,
    reconcile_batch,
    reconcile_upload,
    upload_reconciled,
)
from emulator_fixtures import (  # noqa: F401 - fixtures
    API_KEY,
    CHAT,
    clock,
    emu,
    emu_factory,
    make_provider,
    provider,
    simple_input,
    sleeper,
    write_input,
)


@pytest.fixture
def input_path(tmp_path: Path) -> Path:
    return write_input(tmp_path, simple_input(3), "bg-job1-0-abcd1234.jsonl")


def uploaded(provider: OpenAIProvider, input_path: Path) -> FileInfo:
    return provider.upload(input_path, input_path.name)


def run_until_terminal(provider: OpenAIProvider, clock, batch_id: str, limit: int = 100) -> BatchInfo:
    for _ in range(limit):
        b = provider.retrieve(batch_id)
        if b.is_terminal:
            return b
        clock.advance(0.05)
    raise AssertionError("not terminal")


# --- plain calls ------------------------------------------------------------------------------


def test_upload_create_retrieve_return_plain_frozen_dataclasses(provider, emu, clock, input_path):
    assert isinstance(provider, Provider)
    f = uploaded(provider, input_path)
    assert type(f) is FileInfo and f.bytes == input_path.stat().st_size and f.filename == input_path.name and f.purpose == "batch"
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.id = "x"  # type: ignore[misc]
    b = provider.create_batch(f.id, CHAT, "24h", {"bg_key": "k1"})
    assert type(b) is BatchInfo and b.status == "validating" and b.input_file_id == f.id and dict(b.metadata) == {"bg_key": "k1"}
    with pytest.raises(TypeError):
        b.metadata["x"] = "y"  # type: ignore[index]
    done = run_until_terminal(provider, clock, b.id)
    assert done.status == "completed" and done.is_terminal and done.model == "gpt-5.4-mini"
    assert done.request_counts.total == 3 and done.request_counts.completed == 3
    assert done.usage is not None and done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens > 0
    assert done.completed_at is not None and done.output_file_id and done.errors == ()
    for value in dataclasses.asdict(done).values():
        assert not isinstance(value, openai.BaseModel)


def test_failed_batch_errors_are_plain_tuples(provider, clock):
    b = run_until_terminal(provider, clock, provider.create_batch("file-missing").id)
    assert b.status == "failed"
    (err,) = b.errors
    assert err.code == "invalid_request" and err.param == "file_id" and err.line is None


def test_find_files_and_find_batches(provider, clock, input_path, tmp_path):
    f = uploaded(provider, input_path)
    other = provider.upload(write_input(tmp_path, simple_input(4), "other.jsonl"), "other.jsonl")
    assert provider.find_files(input_path.name, input_path.stat().st_size) == [f]
    assert provider.find_files(input_path.name, input_path.stat().st_size + 1) == []
    assert provider.find_files("nope.jsonl", 10) == []
    b1 = provider.create_batch(f.id, metadata={"bg_key": "a", "bg_job": "j"})
    clock.advance(5)
    b2 = provider.create_batch(other.id, metadata={"bg_key": "b", "bg_job": "j"})
    assert [b.id for b in provider.find_batches(input_file_id=f.id)] == [b1.id]
    assert [b.id for b in provider.find_batches(metadata={"bg_job": "j"})] == [b1.id, b2.id]  # oldest first
    assert [b.id for b in provider.find_batches(metadata={"bg_key": "b"})] == [b2.id]
    assert [b.id for b in provider.find_batches(metadata={"bg_job": "j"}, created_after=b2.created_at)] == [b2.id]
    assert provider.find_batches(input_file_id=f.id, metadata={"bg_key": "b"}) == []


def test_listing_pages_through_many_batches(emu, input_path):
    p = make_provider(emu, list_page_size=2)
    f = uploaded(p, input_path)
    ids = [p.create_batch(f.id, metadata={"n": str(i)}).id for i in range(7)]
    assert [b.id for b in p.iter_batches()] == ids[::-1]
    page = p.list_batches(limit=3)
    assert [b.id for b in page.items] == ids[::-1][:3] and page.has_more and page.last_id == ids[4]
    assert [b.id for b in p.find_batches(metadata={"n": "0"})] == [ids[0]]
    assert emu.request_count("GET", "/v1/batches") == 1 + 4 + 4  # one page call, then 4 pages twice


def test_download_streams_to_disk_atomically(provider, emu, clock, input_path, tmp_path):
    f = uploaded(provider, input_path)
    b = run_until_terminal(provider, clock, provider.create_batch(f.id).id)
    dest = tmp_path / "out" / "result.jsonl"
    n = provider.download(b.output_file_id, dest)
    assert n == dest.stat().st_size == len(emu.file_bytes(b.output_file_id))
    assert dest.read_bytes() == emu.file_bytes(b.output_file_id)
    assert [p.name for p in dest.parent.iterdir()] == ["result.jsonl"]  # no temp file left


def test_a_download_cut_short_is_unavailable_and_the_next_one_succeeds(provider, emu, input_path, tmp_path):
    """The SDK retries a request, not a body that breaks off while it streams: that download is
    ProviderUnavailable (the engine downloads again later), and leaves no file behind."""
    f = uploaded(provider, input_path)
    emu.script_fault("GET", "/v1/files/{id}/content", "truncate")
    dest = tmp_path / "copy.jsonl"
    with pytest.raises(ProviderUnavailable, match="cut short|incomplete|peer closed"):
        provider.download(f.id, dest)
    assert not dest.exists() and not [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")]
    assert provider.download(f.id, dest) == input_path.stat().st_size
    assert dest.read_bytes() == input_path.read_bytes()
    assert emu.request_count("GET", "/v1/files/{id}/content") == 2


def test_download_of_a_missing_file_is_a_definite_failure(provider, emu, tmp_path):
    with pytest.raises(ProviderRejected) as ei:
        provider.download("file-nope", tmp_path / "x.jsonl")
    assert ei.value.status_code == 404 and "No such File object" in ei.value.message
    assert not (tmp_path / "x.jsonl").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]
    assert emu.request_count("GET", "/v1/files/{id}/content") == 1


def test_delete_file(provider, input_path):
    f = uploaded(provider, input_path)
    assert provider.delete_file(f.id) is True
    assert provider.delete_file(f.id) is False
    assert provider.find_files(f.filename, f.bytes) == []


# --- non-idempotent POSTs: sent once, classified ----------------------------------------------


@pytest.mark.parametrize(
    "fault, created",
    [
        (Fault("status", status=500), 0),
        (Fault("status", status=502), 0),
        (Fault("status", status=408), 0),
        (Fault("drop_before"), 0),
        (Fault("drop_after"), 1),
        (Fault("garbage"), 1),
    ],
)
def test_ambiguous_create_raises_outcome_unknown_and_is_sent_once(provider, emu, input_path, fault, created):
    f = uploaded(provider, input_path)
    emu.script_fault("POST", "/v1/batches", fault)
    with pytest.raises(OutcomeUnknown) as ei:
        provider.create_batch(f.id, metadata={"bg_key": "k"})
    assert ei.value.operation == "batches.create"
    assert emu.request_count("POST", "/v1/batches") == 1  # no SDK retry
    assert emu.batches_created() == created


def test_create_timeout_is_outcome_unknown(emu, input_path):
    f = uploaded(make_provider(emu), input_path)  # the upload with the usual timeout: 0.3 s is for the create alone
    p = make_provider(emu, timeout=0.3)
    emu.script_fault("POST", "/v1/batches", Fault("hang_after", seconds=5))
    with pytest.raises(OutcomeUnknown, match="Timeout"):
        p.create_batch(f.id)
    assert emu.batches_created() == 1 and emu.request_count("POST", "/v1/batches") == 1


def test_definite_rejections_carry_the_api_message(provider, emu, input_path):
    f = uploaded(provider, input_path)
    with pytest.raises(ProviderRejected) as ei:
        provider.create_batch(f.id, endpoint="/v1/bogus")
    e = ei.value
    assert (e.status_code, e.code, e.param) == (400, "invalid_value", "endpoint") and "Invalid value for 'endpoint'" in e.message
    assert not e.retryable
    emu.script_fault("POST", "/v1/batches", Fault("status", status=429, retry_after=3))
    with pytest.raises(ProviderRejected) as ei:
        provider.create_batch(f.id)
    assert ei.value.retryable and ei.value.retry_after == 3.0
    assert emu.request_count("POST", "/v1/batches") == 2 and emu.batches_created() == 0
    with pytest.raises(ProviderRejected) as ei:
        provider.upload(write_input(input_path.parent, b"a,b\n", "x.csv"), "x.csv")
    assert ei.value.status_code == 400 and "Must be .jsonl" in ei.value.message


# --- reconciliation: never submit twice -------------------------------------------------------


def test_create_then_connection_dropped_is_adopted_exactly_once(provider, emu, input_path):
    f = uploaded(provider, input_path)
    emu.script_fault("POST", "/v1/batches", "drop_after")
    sub = create_batch_reconciled(provider, f.id, CHAT, "24h", {"bg_key": "job1-0-a1"})
    assert sub.outcome == "adopted" and sub.batch is not None and sub.duplicates == ()
    assert sub.batch.input_file_id == f.id and sub.batch.metadata["bg_key"] == "job1-0-a1"
    assert "outcome unknown" in sub.cause
    assert emu.batches_created() == 1 and emu.request_count("POST", "/v1/batches") == 1
    assert [b["id"] for b in emu.stats()["batches"]] == [sub.batch.id]


def test_timeout_after_create_is_adopted(emu, input_path):
    f = uploaded(make_provider(emu), input_path)  # the upload with the usual timeout: 0.3 s is for the create alone
    p = make_provider(emu, timeout=0.3)
    emu.script_fault("POST", "/v1/batches", Fault("hang_after", seconds=5))
    sub = create_batch_reconciled(p, f.id, metadata={"bg_key": "t"})
    assert sub.outcome == "adopted" and emu.batches_created() == 1


def test_nothing_created_is_reported_and_a_retry_then_creates_one(provider, emu, input_path):
    f = uploaded(provider, input_path)
    emu.script_fault("POST", "/v1/batches", "drop_before")
    sub = create_batch_reconciled(provider, f.id, metadata={"bg_key": "x"})
    assert sub.outcome == "not_created" and sub.batch is None and emu.batches_created() == 0
    again = create_batch_reconciled(provider, f.id, metadata={"bg_key": "x"})
    assert again.outcome == "created" and emu.batches_created() == 1
    assert emu.request_count("POST", "/v1/batches") == 2


def test_settle_wait_lists_twice_before_concluding(provider, emu, sleeper, input_path):
    f = uploaded(provider, input_path)
    emu.script_fault("POST", "/v1/batches", Fault("status", status=503))
    before = emu.request_count("GET", "/v1/batches")
    sub = create_batch_reconciled(provider, f.id, metadata={"bg_key": "s"}, settle_s=30, sleep=sleeper)
    assert sub.outcome == "not_created" and sleeper.calls == [30]
    assert emu.request_count("GET", "/v1/batches") - before == 2


def test_duplicates_from_an_earlier_blind_retry_are_reported(provider, emu, clock, input_path):
    f = uploaded(provider, input_path)
    first = provider.create_batch(f.id, metadata={"bg_key": "d"})
    clock.advance(2)
    second = provider.create_batch(f.id, metadata={"bg_key": "d"})
    provider.create_batch(f.id, metadata={"bg_key": "other"})
    emu.script_fault("POST", "/v1/batches", "drop_before")
    sub = create_batch_reconciled(provider, f.id, metadata={"bg_key": "d"})
    assert sub.outcome == "adopted" and sub.batch.id == first.id and [d.id for d in sub.duplicates] == [second.id]


def test_reconciliation_that_cannot_list_does_not_claim_not_created(emu, input_path):
    p = make_provider(emu, max_retries=0)
    f = uploaded(p, input_path)
    emu.script_fault("POST", "/v1/batches", "drop_after")
    emu.script_fault("GET", "/v1/batches", Fault("status", status=500), times=10)
    with pytest.raises(OutcomeUnknown, match="reconciliation listing failed"):
        create_batch_reconciled(p, f.id, metadata={"bg_key": "z"})
    assert emu.request_count("POST", "/v1/batches") == 1  # still unknown: nothing re-sent
    emu.clear_faults()
    again = reconcile_batch(p, f.id, {"bg_key": "z"})  # the caller reconciles again, later
    assert again.outcome == "adopted" and emu.batches_created() == 1
    assert emu.request_count("POST", "/v1/batches") == 1


def test_upload_reconciled(provider, emu, input_path):
    emu.script_fault("POST", "/v1/files", "drop_after")
    res = upload_reconciled(provider, input_path, input_path.name)
    assert res.outcome == "adopted" and res.file.filename == input_path.name and res.file.bytes == input_path.stat().st_size
    assert emu.files_created() == 1 and emu.request_count("POST", "/v1/files") == 1
    emu.script_fault("POST", "/v1/files", "drop_before")
    other = input_path.with_name("second.jsonl")
    other.write_bytes(b'{"a": 1}\n')
    res2 = upload_reconciled(provider, other, other.name)
    assert res2.outcome == "not_created" and emu.files_created() == 1
    assert upload_reconciled(provider, other, other.name).outcome == "created"


# --- reads: the SDK's own retries, counted at the emulator --------------------------------------
# (the SDK sleeps for real between attempts: a 429 carries the emulator's small retry-after-ms, as
# the real API's does; a 5xx or a timeout waits the SDK's own backoff, 0.5 s then 1 s)


def test_a_rate_limited_read_is_retried_by_the_sdk_after_the_servers_wait(provider, emu, input_path):
    f = uploaded(provider, input_path)
    b = provider.create_batch(f.id)
    emu.script_fault("GET", "/v1/batches/{id}", Fault("status", status=429, retry_after=0.05), times=2)
    started = time.monotonic()
    assert provider.retrieve(b.id).id == b.id
    assert time.monotonic() - started >= 0.1  # retry-after-ms honoured twice
    assert emu.request_count("GET", "/v1/batches/{id}") == 3


def test_retry_after_ms_takes_precedence():
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "4"}) == 4.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=lambda: 1445412480.0) == 10.0
    assert parse_retry_after({"retry-after": "soon"}) is None and parse_retry_after({}) is None


@pytest.mark.slow  # waits out the SDK's own backoff (real time)
def test_a_server_error_and_a_dropped_connection_on_a_read_are_retried_then_succeed(provider, emu, input_path):
    f = uploaded(provider, input_path)
    b = provider.create_batch(f.id)
    emu.script_fault("GET", "/v1/batches/{id}", Fault("status", status=500))
    emu.script_fault("GET", "/v1/batches/{id}", Fault("drop_before"))
    assert provider.retrieve(b.id).id == b.id
    assert emu.request_count("GET", "/v1/batches/{id}") == 3  # READ_RETRIES (2) retries


def test_read_attempts_are_bounded_and_the_last_answer_is_reported(provider, emu):
    emu.script_fault("GET", "/v1/batches/{id}", Fault("status", status=429, retry_after=0.01), times=100)
    with pytest.raises(ProviderUnavailable) as ei:
        provider.retrieve("batch_x")
    assert ei.value.attempts == 3 and ei.value.status_code == 429 and ei.value.retry_after == 0.01
    assert emu.request_count("GET", "/v1/batches/{id}") == 3


@pytest.mark.slow  # waits out real timeouts
def test_a_read_that_times_out_is_bounded_by_attempts_times_the_timeout(emu):
    p = make_provider(emu, timeout=0.2, max_retries=1)
    emu.script_fault("GET", "/v1/batches", Fault("hang_after", seconds=5), times=10)
    started = time.monotonic()
    with pytest.raises(ProviderUnavailable, match="Timeout") as ei:
        p.list_batches()
    assert ei.value.attempts == 2 and emu.request_count("GET", "/v1/batches") == 2
    assert time.monotonic() - started < 2 * 0.2 + 0.5 + 1.0  # two timeouts, one backoff, slack


def test_a_too_long_retry_after_stops_retrying_and_reaches_the_engine(provider, emu):
    """The SDK waits a Retry-After of at most 120 s; a longer one is not retried, and the
    engine learns it from the final answer."""
    emu.script_fault("GET", "/v1/batches", Fault("status", status=429, retry_after=3600))
    with pytest.raises(ProviderUnavailable) as ei:
        provider.list_batches()
    assert ei.value.retry_after == 3600 and ei.value.attempts == 1
    assert emu.request_count("GET", "/v1/batches") == 1


def test_an_unreadable_read_body_is_unavailable_without_a_retry(provider, emu):
    emu.script_fault("GET", "/v1/batches", Fault("garbage"))
    with pytest.raises(ProviderUnavailable, match="unreadable|Expecting|JSON"):
        provider.list_batches()
    assert emu.request_count("GET", "/v1/batches") == 1
    assert provider.list_batches().items == ()


def test_definite_read_failures_are_not_retried(provider, emu, clock, input_path):
    with pytest.raises(ProviderRejected) as ei:
        provider.retrieve("batch_missing")
    assert ei.value.status_code == 404 and "No batch found" in ei.value.message
    assert emu.request_count("GET", "/v1/batches/{id}") == 1
    f = uploaded(provider, input_path)
    done = run_until_terminal(provider, clock, provider.create_batch(f.id).id)
    with pytest.raises(ProviderRejected) as ei:
        provider.cancel(done.id)
    assert ei.value.status_code == 409 and ei.value.message == "Cannot cancel a batch with status 'completed'."
    assert emu.request_count("POST", "/v1/batches/{id}/cancel") == 1


def test_cancel_asks_once_and_a_transient_error_is_asked_again_by_the_caller(emu, clock, input_path):
    """A cancel is never retried inside the call (that held every other job up for about 20 s):
    a transient error is ProviderUnavailable at once, and asking again works."""
    provider = make_provider(emu)
    f = uploaded(provider, input_path)
    b = provider.create_batch(f.id)
    emu.script_fault("POST", "/v1/batches/{id}/cancel", Fault("status", status=500))
    with pytest.raises(ProviderUnavailable):
        provider.cancel(b.id)
    assert emu.request_count("POST", "/v1/batches/{id}/cancel") == 1
    assert provider.cancel(b.id).status == "cancelling"
    assert run_until_terminal(provider, clock, b.id).status == "cancelled"


# --- secrets ----------------------------------------------------------------------------------


def test_api_key_never_appears_in_errors_reprs_or_logs(emu_factory, caplog, input_path):
    secret = "sk-live-SUPERSECRET-0123456789abcdef"
    e = emu_factory(api_key="sk-the-right-one-000000000", leak_key_in_errors=True)  # echoes the key verbatim
    p = make_provider(e, api_key=secret, max_retries=1)
    caplog.set_level(logging.DEBUG)
    texts = [repr(p), str(p)]
    with pytest.raises(ProviderRejected) as ei:
        p.retrieve("batch_x")
    assert ei.value.status_code == 401
    texts += [str(ei.value), repr(ei.value), ei.value.message]
    with pytest.raises(ProviderRejected) as ei2:
        p.upload(input_path, input_path.name)
    texts.append(str(ei2.value))
    e.script_fault("GET", "/v1/batches/{id}", Fault("status", status=429, retry_after=0.01))  # the SDK logs its retry
    e.script_fault("GET", "/v1/batches/{id}", "drop_before")
    with pytest.raises(ProviderUnavailable) as ei3:
        p.retrieve("batch_y")
    texts.append(str(ei3.value))
    e.script_fault("POST", "/v1/batches", "drop_after")
    with pytest.raises(OutcomeUnknown) as ei4:
        p.create_batch("file-x")
    texts.append(str(ei4.value))
    texts.append(caplog.text)
    assert ei.value.__cause__ is None and ei.value.__suppress_context__  # no SDK exception chained in
    joined = "\n".join(texts)
    assert secret not in joined
    assert mask_secret(secret) in ei.value.message  # scrubbed to the masked form
    with pytest.raises(TypeError):
        __import__("pickle").dumps(p)


def test_missing_key_is_a_config_error_and_env_is_read_like_the_sdk(emu, monkeypatch):
    with pytest.raises(ProviderConfigError, match="OPENAI_API_KEY"):
        OpenAIProvider()
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", emu.base_url)
    p = OpenAIProvider()
    assert p.base_url.rstrip("/") == emu.base_url
    assert p.list_batches().items == ()
    assert API_KEY not in repr(p)


# --- end to end under seeded chaos --------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_full_submission_under_chaos_creates_exactly_one_batch_per_intent(emu_factory, clock, tmp_path, seed):
    """A minimal caller loop (what the daemon will do) under every fault kind: each intent ends
    with exactly one uploaded file and one batch, and the results download intact.
    Deterministic: the emulator's faults are seeded, and reads are not retried inside a call
    (``max_retries=0``): the caller's loop asks again, as the engine does at its next tick."""
    rates = dataclasses.replace(
        FAULT_PROFILES["chaos"],
        rate_429=0.1,
        rate_500=0.1,
        rate_503=0.05,
        drop_before=0.1,
        drop_after=0.15,
        slow_delay_s=(0.0, 0.002),
        retry_after_s=0.01,
    )
    e = emu_factory(faults=rates, seed=seed)
    p = make_provider(e, max_retries=0)

    def once_per_intent(attempt, reconcile):
        """The caller protocol: one attempt; while the outcome is unknown only reconcile;
        re-send only after a listing said "not created" (or a definite 429)."""
        unknown = False
        for _ in range(100):
            try:
                r = reconcile() if unknown else attempt()
            except OutcomeUnknown:
                unknown = True
            except ProviderUnavailable:
                pass  # a listing failed: still unknown if it was, try again later
            except ProviderRejected as exc:
                if not exc.retryable:
                    raise
            else:
                if r.outcome != "not_created":
                    return r
                unknown = False
            clock.advance(1)
        raise AssertionError("no progress")

    def retrying(fn):
        for _ in range(50):
            try:
                return fn()
            except ProviderUnavailable:
                clock.advance(1)
        raise AssertionError("no progress")

    intents = 6
    batch_ids = []
    for chunk in range(intents):
        path = write_input(tmp_path, simple_input(3, prefix=f"c{chunk}"), f"bg-chaos-{seed}-{chunk}.jsonl")
        up = once_per_intent(
            lambda: upload_reconciled(p, path, path.name), lambda: reconcile_upload(p, path.name, path.stat().st_size)
        )
        key = {"bg_key": f"chaos-{seed}-{chunk}"}
        sub = once_per_intent(
            lambda: create_batch_reconciled(p, up.file.id, metadata=key), lambda: reconcile_batch(p, up.file.id, key)
        )
        assert sub.duplicates == ()
        batch_ids.append(sub.batch.id)
    for i, bid in enumerate(batch_ids):
        for _ in range(200):
            b = retrying(lambda: p.retrieve(bid))
            if b.is_terminal:
                break
            clock.advance(0.05)
        assert b.status == "completed"
        dest = tmp_path / f"out-{i}.jsonl"
        retrying(lambda: p.download(b.output_file_id, dest))
        assert dest.read_bytes() == e.file_bytes(b.output_file_id)
    stats = e.stats()
    assert stats["batches_created"] == intents, stats["faults_injected"]
    assert sorted(f["filename"] for f in stats["files"] if f["purpose"] == "batch") == sorted(
        f"bg-chaos-{seed}-{c}.jsonl" for c in range(intents)
    )
    assert sorted(b["metadata"]["bg_key"] for b in stats["batches"]) == sorted(f"chaos-{seed}-{c}" for c in range(intents))
    assert stats["faults_injected"].get("drop_after", 0) > 0  # ambiguous outcomes really happened

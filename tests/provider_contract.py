"""The contract every provider adapter keeps, written once and run against each provider's emulator
(``tests/test_provider_contract.py`` subclasses it per provider, as eventsourcing subclasses its
recorder tests per backend).

A subclass says how to build its engine-facing provider (:class:`~batchgrader.provider.protocol.Provider`)
against an emulator, which model its lines name and which emulator routes its calls take; every
test here then holds for it: a chunk runs end to end with exact usage, a cancel ends cancelled, a
create is sent once whatever its answer, a lost create reply is found again in the provider's own
records, reads are retried through transient faults, the synchronous call answers one line, and
no key leaks."""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from batchgrader.emulator import Emulator, EmulatorConfig, Fault, ManualClock
from batchgrader.pipeline.results import iter_outcomes, parse_line
from batchgrader.provider.protocol import (
    READ_RETRIES,
    OutcomeUnknown,
    ProviderConfigError,
    ProviderRejected,
    ProviderUnavailable,
)
from batchgrader.provider.reconcile import reconcile_batch
from emulator_fixtures import chat_line, jsonl

KEY = "contract-test-key-0123456789abcdef"


class ProviderContract:
    """Subclass and set the class attributes and :meth:`make`; name the subclass ``Test...``."""

    model: ClassVar[str]
    line_fields: ClassVar[dict[str, Any]] = {}  # extra fields of each request line (e.g. Azure's url)
    body_fields: ClassVar[dict[str, Any]] = {"max_completion_tokens": 200}
    create_route: ClassVar[tuple[str, str]]  # the emulator route of batches.create
    retrieve_route: ClassVar[tuple[str, str]]  # ... of reading one batch
    sync_route: ClassVar[tuple[str, str]]  # ... of the synchronous call
    key_variable: ClassVar[str]  # the environment variable a missing key names
    keeps_files: ClassVar[bool] = True  # False: the input is staged locally and sent in the create (Anthropic)
    keeps_metadata: ClassVar[bool] = True  # False: batches carry no metadata; found by input and custom_ids (Anthropic)

    def make(self, emu: Emulator, key: str | None = KEY) -> Any:
        raise NotImplementedError

    # --- fixtures ---------------------------------------------------------------------------------

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock(start=float(int(time.time())))  # reconciling compares batch times with the chunk file's

    @pytest.fixture
    def emu(self, clock: ManualClock) -> Iterator[Emulator]:
        with Emulator(
            EmulatorConfig(clock=clock, api_key=KEY, validating_s=1, in_progress_s=10, finalizing_s=1, extra_models=(self.model,))
        ) as e:
            yield e

    @pytest.fixture
    def provider(self, emu: Emulator) -> Any:
        return self.make(emu)

    def line(self, cid: str, text: str) -> dict[str, Any]:
        return {**chat_line(cid, text, model=self.model, system="You grade.", **self.body_fields), **self.line_fields}

    def chunk(self, tmp_path: Path, n: int, name: str = "bg-job1-c0000-a1.jsonl", prefix: str = "job1-r") -> Path:
        path = tmp_path / name
        path.write_bytes(jsonl(self.line(f"{prefix}{i}", f"Grade essay {i} about bridges.") for i in range(n)))
        return path

    def submit(self, provider: Any, path: Path, bg_key: str = "job1:0:1") -> Any:
        return provider.create_batch(provider.upload(path, path.name).id, metadata={"bg_key": bg_key, "bg_job": "job1"})

    # --- the contract -----------------------------------------------------------------------------

    def test_a_chunk_runs_end_to_end_and_its_usage_is_what_the_rows_report(self, provider, clock, tmp_path):
        path = self.chunk(tmp_path, 4)
        f = provider.upload(path, path.name)
        assert [x.id for x in provider.find_files(path.name)] == ([f.id] if self.keeps_files else [])
        b = provider.create_batch(f.id, metadata={"bg_key": "job1:0:1", "bg_job": "job1"})
        assert not b.is_terminal and b.input_file_id == f.id
        assert b.metadata.get("bg_key") == ("job1:0:1" if self.keeps_metadata else None)
        clock.advance(20)
        done = provider.retrieve(b.id)
        assert done.status == "completed" and done.output_file_id
        out = tmp_path / "out.jsonl"
        assert provider.download(done.output_file_id, out) == out.stat().st_size
        outcomes = {o.custom_id: o for o in iter_outcomes(out)}
        assert sorted(outcomes) == [f"job1-r{i}" for i in range(4)] and all(o.ok for o in outcomes.values())
        assert all(o.prompt_tokens > 0 and o.completion_tokens > 0 for o in outcomes.values())
        if done.usage is not None:  # the batch's own total, where the provider reports one
            assert sum(o.prompt_tokens for o in outcomes.values()) == done.usage.input_tokens
        assert provider.find_batches(f.id, {"bg_key": "job1:0:1"})[0].id == b.id

    def test_a_cancelled_batch_ends_cancelled(self, provider, clock, tmp_path):
        b = self.submit(provider, self.chunk(tmp_path, 3))
        provider.cancel(b.id)
        clock.advance(15)
        assert provider.retrieve(b.id).status == "cancelled"

    def test_an_answered_error_to_a_create_is_sent_once_and_classified(self, provider, emu, tmp_path):
        path = self.chunk(tmp_path, 1)
        f = provider.upload(path, path.name)
        method, route = self.create_route
        emu.script_fault(method, route, Fault("status", status=500))
        with pytest.raises(OutcomeUnknown):  # a 5xx may have been carried out: reconcile, never resend blindly
            provider.create_batch(f.id, metadata={"bg_key": "j:0:1"})
        emu.script_fault(method, route, Fault("status", status=429, retry_after=1))
        with pytest.raises(ProviderRejected) as refused:
            provider.create_batch(f.id, metadata={"bg_key": "j:0:1"})
        assert refused.value.retryable and refused.value.status_code == 429
        assert emu.request_count(method, route) == 2 and emu.batches_created() == 0

    def test_a_lost_create_reply_is_found_in_the_providers_records_and_adopted_once(self, emu, clock, tmp_path):
        sender = self.make(emu)
        path = self.chunk(tmp_path, 2)
        f = sender.upload(path, path.name)
        emu.script_fault(*self.create_route, Fault("drop_after"))
        with pytest.raises(OutcomeUnknown):
            sender.create_batch(f.id, metadata={"bg_key": "job1:0:1", "bg_job": "job1"})
        assert emu.batches_created() == 1  # carried out; only the reply was lost
        clock.advance(20)  # some providers tell batches apart only once they have ended
        restarted = self.make(emu)  # a new process: it knows no batch id
        found = reconcile_batch(restarted, f.id, {"bg_key": "job1:0:1", "bg_job": "job1"})
        assert found.outcome == "adopted" and found.batch is not None and not found.duplicates
        assert emu.batches_created() == 1

    @pytest.mark.slow  # waits out the SDKs' own backoff (real time)
    def test_reads_are_retried_through_transient_faults(self, provider, emu, tmp_path):
        b = self.submit(provider, self.chunk(tmp_path, 1))
        method, route = self.retrieve_route
        before = emu.request_count(method, route)
        # each adapter's SDK retries a read READ_RETRIES times; a 503 may say when to come back
        emu.script_fault(method, route, Fault("status", status=503, retry_after=0.01), times=READ_RETRIES)
        assert provider.retrieve(b.id).id == b.id
        assert emu.request_count(method, route) - before == READ_RETRIES + 1

    @pytest.mark.slow  # waits out the SDKs' own backoff (real time)
    def test_a_read_asked_to_wait_over_two_minutes_ends_at_once_and_carries_the_wait(self, provider, emu, tmp_path):
        """No SDK waits a Retry-After over 120 s inside a call (the daemon's tick would hang): the
        call ends and the wait reaches the engine."""
        b = self.submit(provider, self.chunk(tmp_path, 1))
        method, route = self.retrieve_route
        before = emu.request_count(method, route)
        emu.script_fault(method, route, Fault("status", status=429, retry_after=3600), times=READ_RETRIES + 1)
        started = time.monotonic()
        with pytest.raises((ProviderUnavailable, ProviderRejected)) as ended:
            provider.retrieve(b.id)
        assert time.monotonic() - started < 10 and ended.value.retry_after == 3600
        assert 1 <= emu.request_count(method, route) - before <= READ_RETRIES + 1

    def test_the_synchronous_call_answers_one_line_as_a_batch_output_line(self, provider, emu):
        out = provider.complete(self.line("job1-r0", "Grade essay 0."))
        outcome = parse_line(out)
        assert outcome.custom_id == "job1-r0" and outcome.ok and outcome.prompt_tokens > 0
        assert emu.request_count(*self.sync_route) == 1

    def test_the_key_never_appears_in_reprs_errors_or_pickles(self, emu):
        secret = "contract-secret-do-not-leak-0123456789"
        p = self.make(emu, key=secret)
        assert secret not in repr(p) and secret not in str(p)
        with pytest.raises(ProviderRejected) as refused:  # the emulator refuses the wrong key
            p.retrieve(self.unknown_batch_id())
        assert secret not in str(refused.value) and secret not in repr(refused.value)
        with pytest.raises(TypeError):
            pickle.dumps(p)

    def test_a_missing_key_is_a_config_error_naming_the_variable(self, emu, monkeypatch):
        monkeypatch.delenv(self.key_variable, raising=False)
        with pytest.raises(ProviderConfigError, match=self.key_variable):
            self.make(emu, key=None)

    def unknown_batch_id(self) -> str:
        return "batch_x"

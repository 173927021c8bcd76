"""The pure fold (batchgrader.state): every event type, every job state label, folding in
increments equals folding whole (property), purity, and golden event logs.

GOLDEN LOGS (tests/golden/*.jsonl + *.expected.json) are never edited once released: a log
records what a released version of the daemon wrote, and the current fold must keep reading it
the same way.  A new event version or a new scenario gets NEW files (v2_..., or a new name);
an old log whose reading must change needs an upcaster, not an edit.  They were recorded from
the real engine driving the local emulator (paths normalised to /home/grader/...).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgrader.core.log import payloads as P
from batchgrader.core.log import state as state_mod
from batchgrader.core.log.schema import EVENTS
from batchgrader.core.log.state import JOB_STATES, JobState, State, fold
from batchgrader.store.eventstore import Event

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_LOGS = sorted(p.stem for p in GOLDEN.glob("*.jsonl"))


# --- helpers ---------------------------------------------------------------------------------------


def load_log(name: str) -> list[Event]:
    out = []
    for line in (GOLDEN / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(Event(d["seq"], d["job_id"], d["job_seq"], d["type"], d["version"], d["ts"], d["payload"]))
    return out


class Log:
    """Builds a log of one job the way the store would number it."""

    def __init__(self, job_id: str = "job1", start_seq: int = 0):
        self.job_id, self.seq, self.job_seq, self.events = job_id, start_seq, 0, []

    def add(self, type_: str, ts: str | None = None, **payload: Any) -> Event:
        self.seq += 1
        self.job_seq += 1
        e = Event(
            self.seq,
            self.job_id,
            self.job_seq,
            type_,
            EVENTS[type_].version,
            ts or f"2026-01-02T03:04:{self.seq % 60:02d}+00:00",
            payload,
        )
        self.events.append(e)
        return e

    def job(self) -> JobState:
        return fold(self.events).jobs[self.job_id]


def chunk(index: int, requests: int = 2, tokens: int = 50) -> dict[str, Any]:
    return {
        "index": index,
        "start": index * requests,
        "end": (index + 1) * requests,
        "requests": requests,
        "input_tokens": tokens,
        "bytes": 300,
        "path": f"/w/chunks/chunk-{index:04d}.jsonl",
    }


def accepted(log: Log, sandbox: bool = False) -> None:
    log.add(
        "JobAccepted",
        file="a.csv",
        source="/h/inbox/a.csv",
        profile="p1",
        sha256="abc",
        bytes=10,
        input_path="/h/work/job1/input.csv",
        result_name="a_results.csv",
        sandbox=sandbox,
    )


def prepared(log: Log, n_chunks: int = 2, row_errors: list | None = None) -> None:
    log.add(
        "JobPrepared",
        format="csv",
        model="gpt-5.4-mini",
        encoding="o200k_base",
        rows=n_chunks * 2 + len(row_errors or []),
        requests=n_chunks * 2,
        input_tokens=50 * n_chunks,
        max_request_tokens=25,
        chunks=[chunk(i) for i in range(n_chunks)],
        row_errors=row_errors or [],
        estimate_usd={"input": 0.001, "max_output": 0.01, "max_total": 0.011},
        warnings=["w1"],
        requests_path="/h/work/job1/requests.jsonl",
    )


def submit(log: Log, c: int, attempt: int = 1, batch: str | None = None) -> None:
    log.add("UploadStarted", chunk=c, attempt=attempt, filename=f"bg-job1-c{c:04d}-a{attempt}.jsonl", bytes=300)
    log.add("FileUploaded", chunk=c, attempt=attempt, file_id=f"file-{c}-{attempt}", reconciled=False)
    log.add(
        "BatchCreateRequested",
        chunk=c,
        attempt=attempt,
        input_file_id=f"file-{c}-{attempt}",
        metadata={"bg_key": f"job1:{c}:{attempt}"},
    )
    log.add(
        "BatchCreated", chunk=c, attempt=attempt, batch_id=batch or f"batch_{c}_{attempt}", status="validating", reconciled=False
    )


def status(
    log: Log,
    c: int,
    st_: str,
    done: int = 0,
    failed: int = 0,
    total: int = 2,
    batch: str | None = None,
    errors: list | None = None,
) -> None:
    log.add(
        "BatchStatusChanged",
        chunk=c,
        batch_id=batch or f"batch_{c}_1",
        status=st_,
        request_counts={"total": total, "completed": done, "failed": failed},
        output_file_id=f"out-{c}" if st_ in ("completed", "expired", "cancelled") else None,
        error_file_id=None,
        errors=errors or [],
    )


def collect(
    log: Log,
    c: int,
    succeeded: int = 2,
    failed_ids: tuple[str, ...] = (),
    batch: str | None = None,
    cost: float = 0.001,
    final: str = "completed",
    day: str | None = "2026-01-02",
) -> None:
    b = batch or f"batch_{c}_1"
    log.add("OutputDownloadStarted", chunk=c, batch_id=b, file_id=f"out-{c}", kind="output")
    log.add("OutputDownloaded", chunk=c, batch_id=b, file_id=f"out-{c}", kind="output", path=f"/w/dl/{b}-output.jsonl", bytes=99)
    log.add(
        "TokensUsed",
        chunk=c,
        batch_id=b,
        model="gpt-5.4-mini",
        prompt_tokens=100,
        cached_tokens=10,
        completion_tokens=20,
        reasoning_tokens=0,
        cost_usd=cost,
        day=day,
    )
    if failed_ids:
        log.add(
            "RowsFailed",
            chunk=c,
            batch_id=b,
            rows=[{"custom_id": x, "code": "server_error", "message": "boom"} for x in failed_ids],
        )
    log.add(
        "ChunkCompleted",
        chunk=c,
        batch_id=b,
        status=final,
        succeeded=succeeded,
        failed=len(failed_ids),
        results_path=f"/w/results/chunk-{c:04d}.jsonl",
    )


def finish(log: Log, succeeded: int, failed: int, state: str = "completed") -> None:
    log.add("OutboxWriteStarted", path="/h/outbox/a_results.csv", error_path=None)
    log.add(
        "ResultWritten",
        path="/h/outbox/a_results.csv",
        rows=succeeded + failed,
        succeeded=succeeded,
        failed=failed,
        error_path=None,
    )
    log.add("InputArchived", path="/h/archive/a.csv")
    log.add("ProviderFilesDeleted", file_ids=["file-0-1"])
    log.add("JobCompleted", state=state, succeeded=succeeded, failed=failed)


# --- catalogue ---------------------------------------------------------------------------------------


def test_every_catalogued_event_type_has_a_handler():
    assert set(state_mod._HANDLERS) == set(EVENTS)


def test_each_handler_reads_the_payload_type_it_is_declared_for():
    from typing import get_type_hints

    from batchgrader.core.log.payloads import DECLARATIONS

    for name, handler in state_mod._HANDLERS.items():
        assert get_type_hints(handler, vars(state_mod))["p"] is DECLARATIONS[name].payload, name


def test_a_handler_is_declared_only_for_a_declared_payload_and_only_once():
    class NotAnEvent(dict):
        pass

    with pytest.raises(KeyError, match="NotAnEvent is not a declared event payload"):
        state_mod.folds(NotAnEvent)
    with pytest.raises(TypeError, match="JobHeld has two fold handlers"):
        state_mod.folds(P.JobHeld)(lambda s, job, p, e: None)


# --- each event type ---------------------------------------------------------------------------------


def test_file_rejected_ends_the_job_failed_and_remembers_the_fingerprint():
    log = Log("x-1")
    log.add(
        "FileRejected",
        file="notes.txt",
        path="/h/inbox/notes.txt",
        reason="unsupported",
        code="unsupported_format",
        fingerprint="fp1",
    )
    s = fold(log.events)
    job = s.jobs["x-1"]
    assert (job.rejected, job.ended, job.state, job.file) == (True, "failed", "failed", "notes.txt")
    assert job.error == {"code": "unsupported_format", "error": "unsupported", "stage": "inbox", "hint": ""}
    assert s.rejected == {"fp1": "x-1"}


def test_job_accepted_records_the_file_and_its_hash():
    log = Log()
    accepted(log, sandbox=True)
    s = fold(log.events)
    job = s.jobs["job1"]
    assert (job.file, job.profile, job.sha256, job.sandbox, job.result_name) == ("a.csv", "p1", "abc", True, "a_results.csv")
    assert job.created_ts == log.events[0].ts and job.version == 1
    assert s.sha_jobs == {"abc": ["job1"]}
    assert job.state == "preparing"


def test_job_prepared_plans_the_chunks():
    log = Log()
    accepted(log)
    prepared(log, 3, row_errors=[{"row": 7, "custom_id": "r7", "code": "too_long", "message": "m"}])
    job = log.job()
    assert job.prepared and job.rows == 7 and job.requests == 6 and job.model == "gpt-5.4-mini"
    assert sorted(job.chunks) == [0, 1, 2]
    assert job.chunks[1].input_tokens == 50 and job.chunks[1].custom_ids is None
    assert job.row_errors == {"r7": {"row": 7, "custom_id": "r7", "code": "too_long", "message": "m"}}
    assert job.estimate == {"input": 0.001, "max_output": 0.01, "max_total": 0.011} and job.warnings == ["w1"]
    assert job.state == "queued"


def test_held_and_released():
    log = Log()
    accepted(log)
    prepared(log)
    log.add("JobHeld", code="daily_cost_limit_usd", reason="over budget")
    assert log.job().state == "held" and log.job().held == {"code": "daily_cost_limit_usd", "reason": "over budget"}
    log.add("JobReleased", reason="budget allows it now", override=False)
    assert log.job().state == "queued" and not log.job().override_budget
    log.add("JobHeld", code="max_cost_per_job_usd", reason="too big")
    log.add("JobReleased", reason="user", override=True)
    assert log.job().held is None and log.job().override_budget


def test_upload_intent_and_outcomes():
    log = Log()
    accepted(log)
    prepared(log)
    log.add("UploadStarted", chunk=0, attempt=1, filename="f.jsonl", bytes=300)
    c = log.job().chunks[0]
    assert (c.upload, c.attempt, c.filename, c.open_intent) == ("started", 1, "f.jsonl", "upload")
    assert log.job().state == "submitting"
    log.add("FileUploaded", chunk=0, attempt=1, file_id="file-1", reconciled=True)
    c = log.job().chunks[0]
    assert (c.upload, c.file_id, c.open_intent) == ("done", "file-1", None)
    assert log.job().state == "submitting"
    log.add("UploadFailed", chunk=1, attempt=1, error="413 too large", definite=True)
    job = log.job()
    assert job.chunks[1].upload == "failed" and job.chunks[1].last_error == "413 too large" and job.last_error == "413 too large"


def test_batch_create_intent_and_outcomes():
    log = Log()
    accepted(log)
    prepared(log)
    log.add("UploadStarted", chunk=0, attempt=1, filename="f", bytes=1)
    log.add("FileUploaded", chunk=0, attempt=1, file_id="file-1", reconciled=False)
    log.add("BatchCreateRequested", chunk=0, attempt=1, input_file_id="file-1", metadata={"bg_key": "job1:0:1"})
    c = log.job().chunks[0]
    assert (c.create, c.metadata, c.open_intent, c.requested_ts) == (
        "requested",
        {"bg_key": "job1:0:1"},
        "create",
        log.events[-1].ts,
    )
    log.add("BatchCreateFailed", chunk=0, attempt=1, error="429 token limit", definite=True)
    assert log.job().chunks[0].create == "failed" and log.job().last_error == "429 token limit"
    log.add("BatchCreateRequested", chunk=0, attempt=1, input_file_id="file-1", metadata={"bg_key": "job1:0:1"})
    log.add("BatchCreated", chunk=0, attempt=1, batch_id="batch_A", status=None, reconciled=True)
    s = fold(log.events)
    c = s.jobs["job1"].chunks[0]
    assert (c.create, c.batch_id, c.status, c.in_flight) == ("done", "batch_A", "validating", True)
    assert s.batch_index == {"batch_A": ("job1", 0)}
    assert s.jobs["job1"].state == "running"


def test_batch_status_changed_updates_the_current_batch_only():
    log = Log()
    accepted(log)
    prepared(log)
    submit(log, 0)
    status(log, 0, "in_progress", done=1)
    c = log.job().chunks[0]
    assert c.status == "in_progress" and c.request_counts == {"total": 2, "completed": 1, "failed": 0}
    status(log, 0, "completed", done=2, batch="batch_OLD")  # a stale poll of another batch: ignored
    assert log.job().chunks[0].status == "in_progress"
    status(log, 0, "failed", errors=[{"code": "token_limit_exceeded", "message": "m", "line": None}])
    c = log.job().chunks[0]
    assert c.status == "failed" and c.batch_errors[0]["code"] == "token_limit_exceeded" and not c.in_flight


def test_downloads_tokens_rows_failed_and_chunk_completed():
    log = Log()
    accepted(log)
    prepared(log)
    submit(log, 0)
    status(log, 0, "completed", done=1, failed=1)
    log.add("OutputDownloadStarted", chunk=0, batch_id="batch_0_1", file_id="out-0", kind="output")
    assert log.job().chunks[0].downloads == {"output": {"state": "started", "file_id": "out-0", "path": None}}
    assert log.job().state == "downloading"
    log.add("OutputDownloaded", chunk=0, batch_id="batch_0_1", file_id="out-0", kind="output", path="/p", bytes=5)
    assert log.job().chunks[0].downloads["output"] == {"state": "done", "file_id": "out-0", "path": "/p", "bytes": 5}
    log.add(
        "TokensUsed",
        chunk=0,
        batch_id="batch_0_1",
        model="m",
        prompt_tokens=100,
        cached_tokens=40,
        completion_tokens=30,
        reasoning_tokens=5,
        cost_usd=0.25,
        day="2026-01-01",
    )
    log.add(
        "TokensUsed",
        chunk=0,
        batch_id="batch_0_1",
        model="m",
        prompt_tokens=1,
        cached_tokens=0,
        completion_tokens=2,
        reasoning_tokens=0,
        cost_usd=0.5,
        ts="2026-03-04T00:00:00+00:00",
    )  # no day: the event's UTC day
    log.add("RowsFailed", chunk=0, batch_id="batch_0_1", rows=[{"custom_id": "r2", "code": "server_error", "message": "500"}])
    log.add("ChunkCompleted", chunk=0, batch_id="batch_0_1", status="completed", succeeded=1, failed=1, results_path="/r")
    s = fold(log.events)
    job = s.jobs["job1"]
    assert (job.prompt_tokens, job.cached_tokens, job.completion_tokens, job.reasoning_tokens) == (101, 40, 32, 5)
    assert job.cost_usd == pytest.approx(0.75)
    assert s.spend_by_day == {"2026-01-01": 0.25, "2026-03-04": 0.5}
    assert s.tokens_by_day == {"2026-01-01": 130, "2026-03-04": 3}
    assert job.failed_rows == {"r2": {"code": "server_error", "message": "500", "chunk": 0}}
    c = job.chunks[0]
    assert (c.done, c.succeeded, c.failed, c.results_path) == (True, 1, 1, "/r")
    assert job.chunks_done == 1 and job.succeeded_rows == 1


def test_sandbox_usage_is_not_real_spend():
    log = Log()
    accepted(log, sandbox=True)
    prepared(log)
    log.add(
        "TokensUsed",
        chunk=0,
        batch_id="b",
        model="m",
        prompt_tokens=10,
        cached_tokens=0,
        completion_tokens=5,
        reasoning_tokens=0,
        cost_usd=2.0,
        day="2026-01-01",
    )
    s = fold(log.events)
    assert s.jobs["job1"].cost_usd == 2.0 and s.jobs["job1"].prompt_tokens == 10  # the job shows it (SIMULATED)
    assert s.spend_by_day == {} and s.tokens_by_day == {}  # the budgets never see it


def test_chunk_failed_retryable_and_final():
    log = Log()
    accepted(log)
    prepared(log)
    submit(log, 0)
    status(log, 0, "failed", errors=[{"code": "token_limit_exceeded", "message": "m"}])
    log.add("ChunkFailed", chunk=0, batch_id="batch_0_1", code="token_limit_exceeded", error="limit", retryable=True)
    c = log.job().chunks[0]
    assert not c.done and c.failure["retryable"] and c.failure["ts"] == log.events[-1].ts
    submit(log, 0, attempt=2)  # the next UploadStarted clears the failure
    c = log.job().chunks[0]
    assert c.failure is None and c.attempt == 2 and c.batch_id == "batch_0_2" and c.request_counts == {}
    log.add("ChunkFailed", chunk=1, batch_id=None, code="upload_rejected", error="bad file", retryable=False)
    c1 = log.job().chunks[1]
    assert c1.done and c1.failed == c1.requests == 2 and log.job().last_error == "bad file"


def test_retry_planned_adds_a_chunk_of_failed_rows():
    log = Log()
    accepted(log)
    prepared(log, 1)
    submit(log, 0)
    status(log, 0, "completed", done=1, failed=1)
    collect(log, 0, succeeded=1, failed_ids=("r2",))
    log.add(
        "RetryPlanned",
        chunk=1,
        source_chunks=[0],
        custom_ids=["r2"],
        requests=1,
        input_tokens=25,
        bytes=150,
        path="/w/chunks/retry0001-0001.jsonl",
        manual=False,
    )
    job = log.job()
    assert job.chunks[1].custom_ids == ["r2"] and job.chunks[1].requests == 1
    assert job.failed_rows == {} and job.row_attempts == {"r2": 1}
    assert job.state == "submitting"  # chunk 0 was uploaded earlier; the retry chunk waits to be sent
    log.add("RetryRequested", reason="again")
    log.add(
        "RetryPlanned",
        chunk=2,
        source_chunks=[1],
        custom_ids=["r2"],
        requests=1,
        input_tokens=25,
        bytes=150,
        path="/p",
        manual=True,
    )
    job = log.job()
    assert job.row_attempts == {"r2": 2} and not job.retry_requested


def test_job_end_events():
    log = Log()
    accepted(log)
    prepared(log, 1)
    submit(log, 0)
    status(log, 0, "completed", done=2)
    collect(log, 0)
    log.add("OutboxWriteStarted", path="/h/outbox/a_results.csv", error_path=None)
    job = log.job()
    assert job.outbox == "started" and job.result_path == "/h/outbox/a_results.csv" and job.state == "downloading"
    log.add("ResultWritten", path="/h/outbox/a_results.csv", rows=2, succeeded=2, failed=0, error_path=None)
    log.add("InputArchived", path="/h/archive/a.csv")
    log.add("ProviderFilesDeleted", file_ids=["file-0-1", "out-0"])
    job = log.job()
    assert (job.outbox, job.archived_path, job.provider_files_deleted) == ("done", "/h/archive/a.csv", True)
    log.add("JobCompleted", state="completed", succeeded=2, failed=0)
    assert log.job().state == "completed" and log.job().terminal


def test_job_failed_records_the_error():
    log = Log()
    accepted(log)
    log.add("JobFailed", code="bad_input", error="line 3: bad quote", stage="prepare", hint="fix it")
    job = log.job()
    assert job.state == "failed" and job.error == {
        "code": "bad_input",
        "error": "line 3: bad quote",
        "stage": "prepare",
        "hint": "fix it",
    }
    assert job.last_error == "line 3: bad quote"


def test_cancel_requested_then_cancelled():
    log = Log()
    accepted(log)
    prepared(log)
    submit(log, 0)
    log.add("CancelRequested", reason="user")
    assert log.job().cancel_requested and log.job().state == "running"
    log.add("JobCancelled", succeeded=0, failed=4)
    assert log.job().state == "cancelled"


def test_retry_requested_reopens_a_finished_job_and_input_restored():
    log = Log()
    accepted(log)
    log.add("JobFailed", code="missing_pricing", error="no price", stage="prepare", hint="h")
    log.add("OutboxWriteStarted", path=None, error_path="/h/outbox/a_error.txt")
    log.add("ResultWritten", path=None, rows=0, succeeded=0, failed=0, error_path="/h/outbox/a_error.txt")
    log.add("InputArchived", path="/h/failed/a.csv")
    log.add("RetryRequested", reason="fixed the price")
    job = log.job()
    assert job.ended is None and job.error is None and job.retry_requested and job.outbox == "none"
    assert job.state == "preparing"
    log.add("InputRestored", path="/h/work/job1/input.csv")
    job = log.job()
    assert job.archived_path is None and job.input_path == "/h/work/job1/input.csv"


def test_retry_requested_on_a_held_job_overrides_the_budget():
    log = Log()
    accepted(log)
    prepared(log)
    log.add("JobHeld", code="max_cost_per_job_usd", reason="too big")
    log.add("RetryRequested", reason="submit anyway")
    job = log.job()
    assert job.held is None and job.override_budget and job.state == "queued"


def test_an_event_already_folded_is_ignored():
    log = Log()
    accepted(log)
    prepared(log)
    log.add(
        "TokensUsed",
        chunk=0,
        batch_id="b",
        model="m",
        prompt_tokens=10,
        cached_tokens=0,
        completion_tokens=1,
        reasoning_tokens=0,
        cost_usd=1.0,
        day="2026-01-01",
    )
    s = fold(log.events)
    s.apply(log.events[-1])  # replayed (same seq): no double counting
    assert s.jobs["job1"].cost_usd == 1.0 and s.spend_by_day == {"2026-01-01": 1.0}


# --- job state labels ----------------------------------------------------------------------------------


def _label_logs() -> dict[str, Log]:
    logs: dict[str, Log] = {}
    log = Log()
    accepted(log)
    prepared(log)
    logs["queued"] = log

    log = Log()
    accepted(log)
    logs["preparing"] = log

    log = Log()
    accepted(log)
    prepared(log)
    log.add("UploadStarted", chunk=0, attempt=1, filename="f", bytes=1)
    logs["submitting"] = log

    log = Log()
    accepted(log)
    prepared(log)
    submit(log, 0)
    status(log, 0, "in_progress", done=1)
    logs["running"] = log

    log = Log()
    accepted(log)
    prepared(log, 1)
    submit(log, 0)
    status(log, 0, "completed", done=2)
    logs["downloading"] = log

    log = Log()
    accepted(log)
    prepared(log)
    log.add("JobHeld", code="daily_token_limit", reason="r")
    logs["held"] = log

    log = Log()
    accepted(log)
    prepared(log, 1)
    submit(log, 0)
    status(log, 0, "completed", done=2)
    collect(log, 0)
    finish(log, 2, 0)
    logs["completed"] = log

    log = Log()
    accepted(log)
    prepared(log, 1)
    submit(log, 0)
    status(log, 0, "completed", done=1, failed=1)
    collect(log, 0, succeeded=1, failed_ids=("r2",))
    finish(log, 1, 1, state="completed_with_errors")
    logs["completed_with_errors"] = log

    log = Log()
    accepted(log)
    log.add("JobFailed", code="empty_input", error="no rows", stage="prepare", hint="h")
    logs["failed"] = log

    log = Log()
    accepted(log)
    prepared(log)
    log.add("CancelRequested", reason="r")
    log.add("JobCancelled", succeeded=0, failed=4)
    logs["cancelled"] = log
    return logs


@pytest.mark.parametrize("label", JOB_STATES)
def test_job_state_label(label: str):
    assert _label_logs()[label].job().state == label


def test_the_label_examples_cover_every_state():
    assert set(_label_logs()) == set(JOB_STATES)


def test_submitting_covers_uploaded_chunks_waiting_for_create():
    log = Log()
    accepted(log)
    prepared(log)
    log.add("UploadStarted", chunk=0, attempt=1, filename="f", bytes=1)
    log.add("FileUploaded", chunk=0, attempt=1, file_id="file-1", reconciled=False)
    assert log.job().state == "submitting"


def test_downloading_while_the_last_chunk_is_merged_and_the_result_written():
    log = Log()
    accepted(log)
    prepared(log, 1)
    submit(log, 0)
    status(log, 0, "completed", done=2)
    collect(log, 0)
    assert log.job().state == "downloading"


# --- increments, purity ------------------------------------------------------------------------------


def _interleave(logs: list[list[Event]], picks: list[int]) -> list[Event]:
    """Merge several jobs' logs in an order chosen by ``picks`` (each job keeps its own order) and
    renumber the global seq as the store would."""
    queues = [list(lg) for lg in logs]
    out: list[Event] = []
    i = 0
    while any(queues):
        live = [q for q in queues if q]
        q = live[picks[i % len(picks)] % len(live)] if picks else live[0]
        i += 1
        e = q.pop(0)
        out.append(dataclasses.replace(e, seq=len(out) + 1))
    return out


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(st.sampled_from(GOLDEN_LOGS), min_size=1, max_size=4),
    picks=st.lists(st.integers(0, 7), max_size=40),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_folding_in_increments_equals_folding_whole(names: list[str], picks: list[int], cuts: list[int]):
    logs = []
    for k, name in enumerate(names):  # the same golden log may appear twice: give it its own job id
        logs.append([dataclasses.replace(e, job_id=f"{e.job_id}-{k}") for e in load_log(name)])
    events = _interleave(logs, picks)
    whole = fold(events)
    points = sorted({min(c, len(events)) for c in cuts})
    state = None
    prev = 0
    for p in points + [len(events)]:
        state = fold(events[prev:p], state)
        prev = p
    assert dataclasses.asdict(state) == dataclasses.asdict(whole)


def test_fold_is_pure():
    events = load_log("v1_failed_rows_retry")
    before = copy.deepcopy(events)
    a, b = fold(events), fold(events)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert events == before  # payloads untouched

    initial = fold(events[:20])
    snapshot = copy.deepcopy(dataclasses.asdict(initial))
    after = fold(events[20:], initial)
    assert dataclasses.asdict(initial) == snapshot  # the initial state is not mutated
    assert after is not initial
    assert dataclasses.asdict(after) == dataclasses.asdict(a)


def test_fold_restores_the_garbage_collector_setting():
    import gc

    events = load_log("v1_happy_multichunk")
    assert gc.isenabled()
    fold(events)
    assert gc.isenabled()
    gc.disable()
    try:
        fold(events)
        assert not gc.isenabled()
    finally:
        gc.enable()

    def failing_log():  # and after an error too (a log that cannot be read to the end)
        yield events[0]
        raise OSError("disk I/O error")

    with pytest.raises(OSError):
        fold(failing_log())
    assert gc.isenabled()


# --- golden logs ---------------------------------------------------------------------------------------


def summary(s: State) -> dict[str, Any]:
    """What a golden log is checked against: the parts of the fold a user or the engine relies on."""
    jobs = {}
    for job in s.jobs.values():
        jobs[job.job_id] = {
            "state": job.state,
            "file": job.file,
            "profile": job.profile,
            "sandbox": job.sandbox,
            "version": job.version,
            "prepared": job.prepared,
            "model": job.model,
            "rows": job.rows,
            "requests": job.requests,
            "chunks_total": job.chunks_total,
            "chunks_done": job.chunks_done,
            "succeeded_rows": job.succeeded_rows,
            "failed_rows": sorted(job.failed_rows),
            "row_errors": sorted(job.row_errors),
            "row_attempts": dict(sorted(job.row_attempts.items())),
            "prompt_tokens": job.prompt_tokens,
            "cached_tokens": job.cached_tokens,
            "completion_tokens": job.completion_tokens,
            "reasoning_tokens": job.reasoning_tokens,
            "cost_usd": round(job.cost_usd, 12),
            "held": job.held,
            "cancel_requested": job.cancel_requested,
            "ended": job.ended,
            "error_code": (job.error or {}).get("code"),
            "outbox": job.outbox,
            "result_path": job.result_path,
            "error_path": job.error_path,
            "archived_path": job.archived_path,
            "provider_files_deleted": job.provider_files_deleted,
            "chunks": [
                {
                    "index": c.index,
                    "requests": c.requests,
                    "input_tokens": c.input_tokens,
                    "retry_of": c.custom_ids,
                    "attempt": c.attempt,
                    "batch_id": c.batch_id,
                    "status": c.status,
                    "request_counts": c.request_counts,
                    "done": c.done,
                    "failure": (c.failure or {}).get("code"),
                    "succeeded": c.succeeded,
                    "failed": c.failed,
                }
                for c in sorted(job.chunks.values(), key=lambda c: c.index)
            ],
        }
    return {
        "last_seq": s.last_seq,
        "jobs": jobs,
        "rejected": s.rejected,
        "batches": sorted(s.batch_index),
        "spend_by_day": {k: round(v, 12) for k, v in sorted(s.spend_by_day.items())},
        "tokens_by_day": dict(sorted(s.tokens_by_day.items())),
    }


def test_golden_logs_exist():
    assert {
        "v1_happy_multichunk",
        "v1_failed_rows_retry",
        "v1_rejected_file",
        "v1_held",
        "v1_cancelled",
        "v1_expired_batch",
    } <= set(GOLDEN_LOGS)
    for name in GOLDEN_LOGS:
        assert (GOLDEN / f"{name}.expected.json").exists(), f"{name}.jsonl has no expected summary"


@pytest.mark.parametrize("name", GOLDEN_LOGS)
def test_golden_log_folds_to_its_expected_summary(name: str):
    expected = json.loads((GOLDEN / f"{name}.expected.json").read_text(encoding="utf-8"))
    got = json.loads(json.dumps(summary(fold(load_log(name)))))  # tuples -> lists, int keys -> str, as stored
    assert got == expected


@pytest.mark.parametrize("name", GOLDEN_LOGS)
def test_golden_log_folded_in_single_steps_equals_whole(name: str):
    events = load_log(name)
    s = State()
    for e in events:
        s = fold([e], s)
    assert dataclasses.asdict(s) == dataclasses.asdict(fold(events))

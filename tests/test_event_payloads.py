"""Typed events: each type declares its payload fields; append refuses a missing or misspelt one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from batchgrader.core.log.events import new_event
from batchgrader.core.log.schema import EVENTS, EventPayloadError, check_payload
from batchgrader.store.eventstore import EventStore, NewEvent, UnknownEventType

GOLDEN = Path(__file__).parent / "golden"

ACCEPTED = {
    "file": "a.csv",
    "source": "inbox/a.csv",
    "profile": "default",
    "sha256": "0" * 64,
    "bytes": 10,
    "input_path": "work/j/input.csv",
    "result_name": "a_results.csv",
    "sandbox": False,
}


def test_a_complete_payload_is_appended(tmp_path):
    with EventStore(tmp_path / "e.db") as store:
        (ev,) = store.append("j", [NewEvent("JobAccepted", ACCEPTED)], expected_version=0)
        assert ev.payload == ACCEPTED


@pytest.mark.parametrize(
    "payload, needle",
    [
        ({k: v for k, v in ACCEPTED.items() if k != "sha256"}, "missing sha256"),
        ({**ACCEPTED, "profle": "x"}, "unknown field 'profle' (did you mean 'profile'?)"),
    ],
)
def test_a_missing_or_misspelt_field_is_refused_and_nothing_is_written(tmp_path, payload, needle):
    with pytest.raises(EventPayloadError, match=re.escape(needle)):
        NewEvent("JobAccepted", payload)  # fails where the event is made
    with EventStore(tmp_path / "e.db") as store:
        good, bad = NewEvent("JobAccepted", ACCEPTED), NewEvent("JobAccepted", dict(ACCEPTED))
        bad.payload.clear()
        bad.payload.update(payload)  # changed after it was made: append checks again
        with pytest.raises(EventPayloadError, match=re.escape(needle)):
            store.append("j", [good, bad], expected_version=0)
        assert store.last_seq() == 0  # the whole append is refused, the valid event too


def test_an_unknown_type_is_refused():
    with pytest.raises(UnknownEventType, match="JobComplete"):
        NewEvent("JobComplete", {"state": "completed", "succeeded": 1, "failed": 0})
    with pytest.raises(EventPayloadError, match="did you mean 'JobCompleted'"):
        check_payload("JobComplete", {})


def test_optional_fields_may_be_left_out():
    assert EVENTS["JobPrepared"].optional == {"settings", "deadline_at", "text_encoding", "empty_rows"}
    prepared = {f: None for f in EVENTS["JobPrepared"].required}
    check_payload("JobPrepared", prepared)
    check_payload("JobPrepared", {**prepared, "settings": {}})
    with pytest.raises(EventPayloadError, match="missing chunks"):
        check_payload("JobPrepared", {k: v for k, v in prepared.items() if k != "chunks"})


@pytest.mark.parametrize("log", sorted(p.name for p in GOLDEN.glob("*.jsonl")))
def test_every_golden_event_matches_its_declared_fields(log):
    for line in (GOLDEN / log).read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            check_payload(d["type"], d["payload"])


def test_new_event_builds_a_checked_event_from_keywords():
    ev = new_event("JobHeld", code="max_cost_per_job_usd", reason="over budget")
    assert ev == NewEvent("JobHeld", {"code": "max_cost_per_job_usd", "reason": "over budget"})
    assert new_event("RetryRequested", reason="r").payload == {"reason": "r"}  # an optional field left out
    assert new_event("RetryRequested", reason="r", max_completion_tokens=9).payload["max_completion_tokens"] == 9


@pytest.mark.parametrize(
    "type_, payload, error, needle",
    [
        ("JobHold", {"code": "c", "reason": "r"}, UnknownEventType, "unknown event type 'JobHold' (did you mean 'JobHeld'?)"),
        ("JobHeld", {"code": "c"}, EventPayloadError, "JobHeld v1: missing reason"),
        (
            "JobHeld",
            {"code": "c", "reason": "r", "reson": "x"},
            EventPayloadError,
            "unknown field 'reson' (did you mean 'reason'?)",
        ),
    ],
)
def test_new_event_refuses_an_unknown_type_a_missing_field_or_an_unknown_field(type_, payload, error, needle):
    with pytest.raises(error, match=re.escape(needle)):
        new_event(type_, **payload)


def test_an_unknown_type_is_a_payload_error_too():
    with pytest.raises(EventPayloadError):
        new_event("Nope")

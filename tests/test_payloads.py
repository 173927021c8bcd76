"""The typed payloads (core/log/payloads.py) and the event catalogue (core/log/schema.py) agree, and the
fold reads typed payloads: a required field missing from a stored event sets its job aside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_type_hints

import pytest

from batchgrader.core.log import payloads
from batchgrader.core.log.schema import EVENTS
from batchgrader.core.log.state import fold
from batchgrader.store.eventstore import Event

GOLDEN = Path(__file__).parent / "golden"


def test_every_event_type_has_a_typed_payload_with_the_same_fields():
    assert set(payloads.PAYLOADS) == set(EVENTS)
    for name, td in payloads.PAYLOADS.items():
        et = EVENTS[name]
        assert set(get_type_hints(td)) == set(et.fields), name
        assert td.__required_keys__ == et.required, name  # type: ignore[attr-defined]
        assert td.__optional_keys__ == et.optional, name  # type: ignore[attr-defined]


def test_a_declaration_names_exactly_its_payload_fields_and_a_name_once():
    from typing import NotRequired, TypedDict

    with pytest.raises(TypeError, match="the meanings name"):

        @payloads.event(1, "test", {"a": "the a"})
        class Mismatched(TypedDict):
            a: int
            b: NotRequired[str]

    with pytest.raises(TypeError, match="'JobHeld' is declared twice"):

        @payloads.event(1, "test", {"code": "c", "reason": "r"})
        class JobHeld(TypedDict):
            code: str
            reason: str

    assert payloads.declaration_of(payloads.JobHeld).payload is payloads.JobHeld  # the real one is untouched


def _golden_events() -> list[Event]:
    out = []
    for path in sorted(GOLDEN.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                d = json.loads(line)
                out.append(Event(d["seq"], d["job_id"], d["job_seq"], d["type"], d["version"], d["ts"], d["payload"]))
    return out


def test_golden_payloads_have_every_field_their_typed_payload_requires():
    for e in _golden_events():
        td = payloads.PAYLOADS[e.type]
        assert td.__required_keys__ <= e.payload.keys(), (e.type, td.__required_keys__ - e.payload.keys())  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("type_", "payload", "field"),
    [
        ("JobAccepted", {"file": "a.csv", "profile": "default"}, "source"),
        ("JobHeld", {"code": "max_cost_per_job_usd"}, "reason"),
    ],
)
def test_a_stored_event_missing_a_required_field_sets_its_job_aside(type_, payload, field):
    ts = "2026-01-02T03:04:05+00:00"
    other = {
        "file": "b.csv",
        "source": "/in/b.csv",
        "profile": "default",
        "sha256": "s",
        "bytes": 1,
        "input_path": "/w/b",
        "result_name": "b_results.csv",
        "sandbox": False,
    }
    events = [Event(1, "bad", 1, type_, 1, ts, payload), Event(2, "good", 1, "JobAccepted", 1, ts, other)]
    s = fold(events)
    assert s.jobs["bad"].corrupt and field in s.jobs["bad"].corrupt  # read, not defaulted
    assert not s.jobs["good"].corrupt and s.jobs["good"].source == "/in/b.csv"  # the others go on


def test_tokens_used_without_day_counts_on_the_events_own_day():
    p = {"chunk": 0, "batch_id": "b", "model": "m", "prompt_tokens": 1, "cached_tokens": 0}
    p |= {"completion_tokens": 2, "reasoning_tokens": 0, "cost_usd": 0.5}
    s = fold([Event(1, "j", 1, "TokensUsed", 1, "2026-03-04T00:00:00+00:00", p)])
    assert s.spend_by_day == {"2026-03-04": 0.5} and s.tokens_by_day == {"2026-03-04": 3}

"""The event catalogue as the store reads it, and the SQL schema of the event log.

Events are immutable, past-tense facts.  Each type is declared once, in
:mod:`batchgrader.core.log.payloads`; :data:`EVENTS` is the view of those declarations that appending
(:func:`check_payload`) and reading (:func:`upcast`) use.  Each type has a version; a payload
written by an older version is upcast when read, the stored row is never rewritten.
The field tables of ``docs/events.md`` are generated from the declarations
(:mod:`batchgrader.core.log.eventdocs`); ``tests/test_docs.py`` fails when they are stale.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from batchgrader.core.log.payloads import DECLARATIONS, EventDeclaration


@dataclass(frozen=True)
class EventType:
    name: str
    version: int
    step: str  # which step emits it
    fields: Mapping[str, str]  # payload field -> meaning (every field, required or optional)
    intent_for: str | None = None  # for intents: the outcome event(s) that close them
    optional: frozenset[str] = frozenset()  # fields a payload may leave out

    @property
    def required(self) -> frozenset[str]:
        return frozenset(self.fields) - self.optional


def _event_type(d: EventDeclaration) -> EventType:
    return EventType(d.name, d.version, d.step, d.meanings, d.intent_for, d.optional)


#: event name -> its type, derived from the declarations in :mod:`batchgrader.core.log.payloads`
EVENTS: dict[str, EventType] = {name: _event_type(d) for name, d in DECLARATIONS.items()}


class EventPayloadError(ValueError):
    """An event to append is not in the catalogue, or its payload misses or misspells a field."""


def unknown_type_message(type_: str) -> str:
    near = difflib.get_close_matches(type_, EVENTS, n=1)
    return f"unknown event type {type_!r}" + (f" (did you mean {near[0]!r}?)" if near else "")


def check_payload(type_: str, payload: Mapping[str, Any]) -> None:
    """Refuse, before anything is written, an unknown event type or a payload with a missing
    required field or a field the type does not declare."""
    et = EVENTS.get(type_)
    if et is None:
        raise EventPayloadError(unknown_type_message(type_))
    problems = []
    missing = sorted(et.required - payload.keys())
    if missing:
        problems.append("missing " + ", ".join(missing))
    for key in sorted(payload.keys() - et.fields.keys()):
        near = difflib.get_close_matches(key, et.fields, n=1)
        problems.append(f"unknown field {key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    if problems:
        raise EventPayloadError(f"{type_} v{et.version}: " + "; ".join(problems) + f"; fields: {', '.join(et.fields)}")


# Upcasters: (type, from_version) -> function(payload) -> payload of from_version + 1.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


def upcast(type_: str, version: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Bring a stored payload to the current version of its type."""
    current = EVENTS[type_].version if type_ in EVENTS else version
    while version < current:
        payload = UPCASTERS[(type_, version)](payload)
        version += 1
    return payload


SCHEMA_VERSION = 1

EVENTS_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS events (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,  -- global order (the notification log)
        job_id   TEXT    NOT NULL,
        job_seq  INTEGER NOT NULL,                   -- per-job order, 1, 2, 3...
        type     TEXT    NOT NULL,
        version  INTEGER NOT NULL,
        ts       TEXT    NOT NULL,                   -- UTC ISO-8601 when recorded
        payload  TEXT    NOT NULL,                   -- JSON
        UNIQUE (job_id, job_seq)
    )""",
    """CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are immutable'); END""",
    """CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END""",
)

"""The event records: :class:`NewEvent` (an event to append, its payload checked against the
catalogue in :mod:`batchgrader.core.log.schema` where it is made; :func:`new_event` builds one from
keywords) and :class:`Event` (an event read from the log), plus :data:`CORRUPT_KEY`, the payload
marker of an event this code cannot read.

They live in ``core`` so that the fold (:mod:`batchgrader.core.log.state`) needs nothing from the
store; :mod:`batchgrader.store.eventstore` writes and reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchgrader.core.log.schema import EVENTS, EventPayloadError, check_payload, unknown_type_message

CORRUPT_KEY = "__bg_corrupt__"  # payload of an event this code cannot read (the fold sets the job aside)


class UnknownEventType(EventPayloadError):
    """The event type is not declared (a :class:`EventPayloadError`, so one ``except`` catches both)."""


@dataclass(frozen=True)
class NewEvent:
    type: str
    payload: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type not in EVENTS:
            raise UnknownEventType(unknown_type_message(self.type))
        check_payload(self.type, self.payload)  # a missing or misspelt field fails here, where it is made


@dataclass(frozen=True)
class Event:
    seq: int
    job_id: str
    job_seq: int
    type: str
    version: int
    ts: str
    payload: dict[str, Any]


def new_event(type_: str, /, **payload: Any) -> NewEvent:
    """The event ``type_`` with ``payload`` as keywords, checked against its declaration here:
    :class:`UnknownEventType` for an undeclared type, :class:`EventPayloadError` for a missing
    required field or a field the type does not declare (each naming the near miss)."""
    return NewEvent(type_, payload)

"""The event records: :class:`NewEvent` (an event to append, its payload checked against the
catalogue in :mod:`batchgrader.core.schema` where it is made) and :class:`Event` (an event read
from the log), plus :data:`CORRUPT_KEY`, the payload marker of an event this code cannot read.

They live in ``core`` so that the fold (:mod:`batchgrader.core.state`) needs nothing from the
store; :mod:`batchgrader.store.eventstore` writes and reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchgrader.core.schema import EVENTS, check_payload

CORRUPT_KEY = "__bg_corrupt__"  # payload of an event this code cannot read (the fold sets the job aside)


class UnknownEventType(ValueError):
    pass


@dataclass(frozen=True)
class NewEvent:
    type: str
    payload: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type not in EVENTS:
            raise UnknownEventType(f"unknown event type {self.type!r}")
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

"""How an event type is declared: :func:`event` on its payload ``TypedDict`` records an
:class:`EventDeclaration` (name, version, emitting step, payload type, what each field means) in
:data:`DECLARATIONS`.  The declarations themselves are in :mod:`batchgrader.core.log.payloads` (and
:mod:`batchgrader.core.log.payloads_chunks`, which it imports)."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar


@dataclass(frozen=True)
class EventDeclaration:
    """One event type: its name, version, emitting step, payload type and field meanings."""

    name: str
    version: int
    step: str
    payload: type
    meanings: Mapping[str, str]  # field -> what it means, in the payload's field order
    intent_for: str | None = None  # for an intent: the outcome event(s) that close it, "A|B"

    @property
    def optional(self) -> frozenset[str]:
        return frozenset(getattr(self.payload, "__optional_keys__", ()))


#: event name -> its declaration, in the order declared (payloads_chunks first: payloads imports it)
DECLARATIONS: dict[str, EventDeclaration] = {}

_T = TypeVar("_T", bound=type)


def event(version: int, step: str, meanings: Mapping[str, str], intent_for: str | None = None) -> Callable[[_T], _T]:
    """Declare the decorated payload ``TypedDict`` as the event type of the same name."""

    def declare(payload: _T) -> _T:
        fields = list(payload.__annotations__)
        if list(meanings) != fields:
            raise TypeError(f"{payload.__name__}: the meanings name {list(meanings)}, the payload declares {fields}")
        if payload.__name__ in DECLARATIONS:
            raise TypeError(f"event {payload.__name__!r} is declared twice")
        DECLARATIONS[payload.__name__] = EventDeclaration(payload.__name__, version, step, payload, dict(meanings), intent_for)
        return payload

    return declare


def declaration_of(payload: type) -> EventDeclaration:
    """The declaration of the event whose payload type is ``payload``."""
    declared = DECLARATIONS.get(payload.__name__)
    if declared is None or declared.payload is not payload:
        raise KeyError(f"{payload.__name__} is not a declared event payload")
    return declared

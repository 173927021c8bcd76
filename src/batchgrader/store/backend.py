"""The event store as an interface, its two recorders, and the factory that picks one.

:class:`EventLog` is what the daemon, the CLI and the library ask of an event log; it has two
implementations (as pyeventsourcing has a recorder per database):

- :class:`~batchgrader.store.eventstore.EventStore`: the SQLite file in the home (the default,
  one daemon per home);
- :class:`~batchgrader.store.pgstore.PostgresEventStore`: a PostgreSQL database that several
  daemons share (``store_url: postgresql://...``; the ``[postgres]`` extra).

Both keep the same events (names, versions, payload bytes), fold to the same state and keep the
same read models in the append's transaction; ``tests/test_store_contract.py`` runs one suite
against both.  :func:`open_store` chooses by ``store_url``; :func:`decide_and_append` is the
optimistic write loop: fold, decide, append, and on a conflict fold again and decide again;
:class:`Follower` tails the log from the last position seen (what another daemon appended);
:func:`catch_up` folds that into a daemon's state and :func:`emit_decided` is a daemon's append
on a shared log (catch up, decide, append; on a conflict catch up and decide again).

Beside the log each store keeps the answers store (``store.answers``) and answers the learned
batch run times (``store.learned_run_times``), so a daemon asks its store, never a connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from batchgrader.core.host.home import Home
from batchgrader.core.log.events import Event, NewEvent
from batchgrader.core.log.state import JobState, State, fold
from batchgrader.store.eventstore import ConcurrencyError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
#: appends tried by :func:`decide_and_append` before its ConcurrencyError is let through
DECIDE_ATTEMPTS = 5


class EventLog(Protocol):
    """What every event store offers (see the module docstring)."""

    readonly: bool

    @property
    def where(self) -> str: ...

    def append(
        self,
        job_id: str,
        events: Iterable[NewEvent],
        expected_version: int | None = None,
        also: Callable[[Any], None] | None = None,
    ) -> list[Event]: ...

    def read(self, after: int = 0, job_id: str | None = None, limit: int | None = None) -> Iterator[Event]: ...

    def last_seq(self) -> int: ...

    def wait_for_append(self, after: int, timeout: float) -> bool: ...

    def read_model(self, table: str) -> list[dict[str, Any]]: ...

    def write(self) -> AbstractContextManager[Any]: ...

    def check_file(self) -> None: ...

    @property
    def answers(self) -> Any: ...

    def learned_run_times(self, models: Iterable[tuple[str, bool]]) -> dict[tuple[str, bool], list[float]]: ...

    def unavailable(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a lost or refused connection to this store (the server cut it,
        restarted, or cannot be reached): what was being done is tried again at the next tick."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


def is_postgres_url(location: str | Path | None) -> bool:
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


def store_location(home: Home, store_url: str | None) -> str | Path:
    """Where a home's event log is: ``store_url`` when set, else the SQLite file in the home."""
    return store_url if store_url else home.db


def configured_store_url(home: Home) -> str | None:
    """The ``store_url`` a home's daemon runs with (``BATCHGRADER_STORE_URL``, else
    ``config.yaml``), for the commands that read its log.  When the configuration cannot be read,
    the environment's value alone (checked as the setting checks it), else None."""
    from batchgrader.core.configuration.config import load_config

    try:
        return load_config(home).default.store_url
    except Exception:  # noqa: BLE001 - `bgctl config show` names the problem; status still answers
        import os

        from batchgrader.core.configuration.config_values import _store_url
        from batchgrader.core.configuration.settings import env_name

        try:
            return _store_url(os.environ.get(env_name("store_url")))
        except ValueError:
            return None


def open_log(location: str | Path, *, readonly: bool = False, read_models: bool = True) -> EventLog:
    """Open the event log at ``location`` (a ``postgresql://`` URL or an SQLite file), with the
    backend's read models kept in each append's transaction (``read_models``; never read-only)."""
    if is_postgres_url(location):
        from batchgrader.store.pg_readmodels import projectors as pg_projectors
        from batchgrader.store.pgstore import PostgresEventStore

        return PostgresEventStore(
            str(location), readonly=readonly, projectors=pg_projectors() if read_models and not readonly else ()
        )
    from batchgrader.store.eventstore import EventStore
    from batchgrader.store.readmodels import projectors

    return EventStore(Path(location), readonly=readonly, projectors=projectors() if read_models and not readonly else ())


def open_store(home: Home, store_url: str | None = None, *, readonly: bool = False, read_models: bool = True) -> EventLog:
    """The event log of a home: PostgreSQL when ``store_url`` (the setting, or the environment's
    ``BATCHGRADER_STORE_URL`` through the configuration) names one, else the home's SQLite file."""
    return open_log(store_location(home, store_url), readonly=readonly, read_models=read_models)


class Follower:
    """A reader tailing the log: each :meth:`poll` returns the events committed since the last
    one it returned, waiting up to ``timeout`` for one (a ``NOTIFY`` on PostgreSQL).  It tracks
    the last position seen, never the next expected (positions may have gaps), and re-reads from
    there after any reconnect, so no event is missed even when a notification is."""

    def __init__(self, store: EventLog, after: int = 0) -> None:
        self.store = store
        self.last = after

    def poll(self, timeout: float = 0.0) -> list[Event]:
        deadline = time.monotonic() + timeout
        while True:
            new = list(self.store.read(after=self.last))
            if new:
                self.last = new[-1].seq
                return new
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            # a wake-up may be stale (a notification of an event already read) or a reconnect: read again
            self.store.wait_for_append(self.last, left)


def decide_and_append(
    store: EventLog,
    job_id: str,
    decide: Callable[[JobState | None], list[NewEvent]],
    attempts: int = DECIDE_ATTEMPTS,
    also: Callable[[Any], None] | None = None,
    current: Callable[[], JobState | None] | None = None,
    append: Callable[..., list[Event]] | None = None,
) -> list[Event]:
    """Fold the job, ask ``decide`` what to append given its state (None: a new job), append it
    at the version folded; when another writer appended first (:class:`ConcurrencyError`), fold
    again and decide again.  Returns the events stored (none when ``decide`` says nothing).
    ``current``: the job's state brought up to date (default: folded from the store's log);
    ``append``: how it is appended (default ``store.append``; a daemon's under its leases)."""
    for attempt in range(1, attempts + 1):
        job = current() if current is not None else fold(store.read(job_id=job_id)).jobs.get(job_id)
        new = decide(job)
        if not new:
            return []
        try:
            return (append or store.append)(job_id, new, expected_version=job.version if job else 0, also=also)
        except ConcurrencyError:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def catch_up(state: State, follower: Follower, timeout: float = 0.0) -> list[Event]:
    """Fold into ``state`` every event committed since ``follower`` last read (what other daemons
    appended, and this one's own appends), in log order; returns them.

    A daemon on a shared log calls it before it decides, and after its own append instead of
    applying what the append returned: :meth:`State.apply` skips an event at or below the last
    position folded, so applying an own event first would drop another daemon's event committed
    just before it.  ``follower`` starts where ``state`` was folded to (``Follower(store, state.last_seq)``)."""
    new = follower.poll(timeout)
    for e in new:
        state.apply(e)
    return new


def emit_decided(
    store: EventLog,
    state: State,
    follower: Follower,
    job_id: str,
    decide: Callable[[JobState | None], list[NewEvent]],
    also: Callable[[Any], None] | None = None,
    attempts: int = DECIDE_ATTEMPTS,
    append: Callable[..., list[Event]] | None = None,
) -> list[Event]:
    """A daemon's append on a log other daemons append to: catch up, ask ``decide`` (the job's
    state, None for a new job) what to append, append it at the job's version; when another
    daemon appended to the job first (:class:`ConcurrencyError`), catch up and decide again
    (:func:`decide_and_append`).  The events stored are folded into ``state`` by a last
    :func:`catch_up`, in log order with anything else committed meanwhile; returns them."""

    def current() -> JobState | None:
        catch_up(state, follower)
        return state.jobs.get(job_id)

    stored = decide_and_append(store, job_id, decide, attempts=attempts, also=also, current=current, append=append)
    catch_up(state, follower)
    return stored

"""The daemon's providers by name (:class:`Providers`), each built at its first use, so that a
job's call reaches the provider recorded for the job (``Context.provider_for``) and nothing else.

A provider is built by the function the daemon registers for its name (its SDK imported, its
client constructed, the sandbox's emulator started), at the first :meth:`Providers.get`, or ahead
of it by :meth:`Providers.prefetch` in a thread of its own while the job that needs it is still
read and counted, or while its file becomes stable in the inbox (or, for the inbox's own files,
from the daemon's first scan) when the answers store holds nothing it could answer: a daemon whose
jobs are answered from the answers store never builds one.
:meth:`Providers.of` puts one provider behind every name (tick tests, tools).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from batchgrader.provider.protocol import Provider, ProviderConfigError

log = logging.getLogger("batchgrader.provider")


class Providers:
    """Provider name -> its :class:`~batchgrader.provider.protocol.Provider`, built once (under a
    lock: the tick thread and a prefetching thread never build one twice)."""

    def __init__(self, builders: Mapping[str, Callable[[], Provider]], every: Provider | None = None) -> None:
        self._builders = dict(builders)
        self._every = every
        self._built: dict[str, Provider] = {}
        self._lock = threading.Lock()
        self._prefetching: dict[str, threading.Thread] = {}
        self._on_page: Callable[[], None] | None = None

    @classmethod
    def of(cls, provider: Provider | None) -> Providers:
        """``provider`` answers for every name (none: no provider is configured)."""
        return cls({}, every=provider)

    def __repr__(self) -> str:
        return f"Providers(configured={sorted(self._builders)}, built={sorted(self._built)})"

    def __reduce__(self) -> Any:
        raise TypeError("providers hold API keys and cannot be pickled")

    @property
    def base_url(self) -> str:
        """The API base of the one provider behind every name (empty for a daemon's own providers,
        whose queue is named by the configured ``base_url``)."""
        return str(getattr(self._every, "base_url", "") or "")

    def names(self) -> list[str]:
        """The providers that can be reached (for the one behind every name: ``openai``)."""
        return sorted(self._builders) if self._every is None else ["openai"]

    def is_built(self, name: str) -> bool:
        return self._every is not None or name in self._built

    def built(self) -> dict[str, Provider]:
        """The providers built so far, by name (a listing asks only those: a provider never built
        has no batch in flight from this process, and one of an earlier process is built by the
        retrieve of its job's batch)."""
        if self._every is not None:
            return {"openai": self._every}
        with self._lock:
            return dict(self._built)

    def get(self, name: str) -> Provider:
        """Provider ``name``, built now if it is not yet; a name this daemon has no builder for is
        refused (:class:`~batchgrader.provider.protocol.ProviderConfigError`)."""
        if self._every is not None:
            return self._every
        got = self._built.get(name)
        if got is not None:
            return got
        build = self._builders.get(name)
        if build is None:
            raise ProviderConfigError(f"provider {name!r} is not configured in this daemon (a profile using it needs a restart)")
        with self._lock:
            got = self._built.get(name)
            if got is None:
                got = build()
                if self._on_page is not None and hasattr(got, "on_page"):
                    got.on_page = self._on_page
                self._built[name] = got
                log.info("provider %s ready", name)
        return got

    def prefetch(self, name: str, after: threading.Thread | None = None) -> threading.Thread | None:
        """Build provider ``name`` in a thread of its own (once, and not once built), once ``after``
        (another build under way) has ended: its SDK's import and its client's construction
        overlap the preparation of the job that will call it.  A build that fails is built again
        by :meth:`get`, which reports it (a :meth:`get` meanwhile builds it at once, without
        waiting for ``after``).  Returns the thread started (None: nothing to do)."""
        if self._every is not None or name in self._built or name not in self._builders or name in self._prefetching:
            return None

        def build() -> None:
            if after is not None:
                after.join()
            try:
                self.get(name)
            except Exception as exc:  # reported by the call that needs it
                log.debug("building provider %s ahead: %s", name, exc)

        thread = threading.Thread(target=build, name=f"prefetch-{name}", daemon=True)
        self._prefetching[name] = thread
        thread.start()
        return thread

    def set_on_page(self, fn: Callable[[], None]) -> None:
        """The listing heartbeat (one call per page listed), given to every provider that pages,
        those built later too."""
        self._on_page = fn
        for p in self.built().values():
            if hasattr(p, "on_page"):
                p.on_page = fn

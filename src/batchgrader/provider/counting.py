"""The counting hook: exact input tokens from a provider's own (free) counting endpoint.

tiktoken gives OpenAI's (and Azure OpenAI's) exact count offline.  For a provider whose
tokenizer is not public (Anthropic ``messages.count_tokens``; Gemini ``models.count_tokens``) the
only exact figure is the provider's own answer (Gemini's counts the whole
``GenerateContentRequest``: see ``GeminiBatchProvider.count_tokens``), so a provider adapter may offer the
:class:`TokenCounter` capability:

    ``count_tokens(lines) -> list[int]``: the exact input tokens of each OpenAI-shaped batch
    line (``{"custom_id", "method", "url", "body"}``), in order; raises
    :class:`~batchgrader.provider.openai_api.ProviderError` when the endpoint cannot answer.

:func:`exact_counts` puts a cache in front of it (:class:`CountCache`, keyed by the provider
and the request key of :mod:`batchgrader.pipeline.answerkey`, so a request counted once is never
counted again, by ``bgctl count`` or by the daemon) and sends only the lines it has not seen, in
slices of :data:`SLICE`.  It never raises: when counting is impossible (no key, the endpoint
fails, too many requests to count one by one) the answer says why, and the caller keeps its
tiktoken figures, labelled as an estimate.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from batchgrader.core.configuration.providers import PROVIDER_FACTS
from batchgrader.pipeline.answerkey import request_key
from batchgrader.provider.protocol import ProviderError

log = logging.getLogger(__name__)

#: requests sent to a counting endpoint per slice (each slice is counted, then cached)
SLICE = 100
#: above this many uncached requests a file is not counted one by one; its counts stay estimates
MAX_UNCACHED = 20_000
#: the daemon counts fewer while planning a job: one call per request, on the tick thread (every
#: other job waits), and the counting endpoints are rate limited (Anthropic: 100 requests per
#: minute at usage tier 1, 2,000 at tier 2; Gemini through Vertex AI / Firebase: 3,000 per minute;
#: docs/providers.md).  Above it the job's counts all stay estimates, labelled so in
#: ``InputTokensCounted`` (the reason names the remedy), ``bgctl status`` and the daemon's log:
#: run `bgctl count` first for a larger file, whose counts the daemon then finds in the cache
DAEMON_MAX_UNCACHED = 2_000
#: the cache file in the home
CACHE_FILE = "token_counts.sqlite"
#: providers whose local (tiktoken) count is their exact count: no counting endpoint needed (core/configuration/providers.py)
OFFLINE_EXACT = frozenset(name for name, f in PROVIDER_FACTS.items() if f.offline_exact)


@runtime_checkable
class TokenCounter(Protocol):
    """The capability a provider adapter offers when its provider has a counting endpoint.

    ``name`` is the cache namespace (the provider's name, ``sandbox`` for the emulator)."""

    name: str

    def count_tokens(self, lines: Sequence[Mapping[str, Any]]) -> list[int]: ...


@dataclass(frozen=True)
class Counted:
    """What :func:`exact_counts` found: ``counts`` (one per line) when every line has an exact
    count, else None and ``reason`` says why.  ``cached`` lines came from the cache, ``sent``
    lines were counted by the endpoint now."""

    counts: list[int] | None
    source: str
    cached: int = 0
    sent: int = 0
    reason: str | None = None
    capped: bool = False  # more uncached requests than the caller counts one by one

    @property
    def exact(self) -> bool:
        return self.counts is not None

    def as_dict(self) -> dict[str, Any]:
        """``token_count`` in ``bgctl count --json``."""
        out = {"exact": self.exact, "source": self.source, "cached": self.cached, "sent": self.sent, "reason": self.reason}
        if self.capped:
            out["capped"] = True
        return out


class CountCache:
    """Exact counts by (provider, request key) in a small SQLite file of its own (never the
    event log: ``bgctl count`` writes it without the daemon).  Concurrent writers are fine
    (``INSERT OR REPLACE`` of facts that do not change)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS token_counts ("
            " provider TEXT NOT NULL, key TEXT NOT NULL, tokens INTEGER NOT NULL, ts REAL NOT NULL,"
            " PRIMARY KEY (provider, key))"
        )

    @classmethod
    def of_home(cls, home: Any) -> CountCache:
        return cls(Path(home.root) / CACHE_FILE)

    def get(self, provider: str, keys: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in range(0, len(keys), 500):
            part = list(keys[i : i + 500])
            marks = ",".join("?" * len(part))
            rows = self.conn.execute(
                f"SELECT key, tokens FROM token_counts WHERE provider = ? AND key IN ({marks})", [provider, *part]
            )
            out.update({k: int(t) for k, t in rows})
        return out

    def put(self, provider: str, counts: Mapping[str, int], now: float | None = None) -> None:
        ts = time.time() if now is None else now
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(
                "INSERT OR REPLACE INTO token_counts (provider, key, tokens, ts) VALUES (?, ?, ?, ?)",
                [(provider, k, int(v), ts) for k, v in counts.items()],
            )

    def close(self) -> None:
        self.conn.close()


def exact_counts(
    counter: TokenCounter | None,
    lines: Sequence[bytes | str | Mapping[str, Any]],
    cache: CountCache | None = None,
    *,
    max_uncached: int = MAX_UNCACHED,
    progress: Callable[[], None] = lambda: None,
) -> Counted:
    """Exact input tokens of every line from ``counter`` (behind ``cache``), or why not."""
    if counter is None:
        return Counted(None, "estimate", reason="no counting endpoint (no API key for it)")
    source = f"{counter.name} counting endpoint"
    requests = [dict(x) if isinstance(x, Mapping) else json.loads(x) for x in lines]
    keys = [request_key(counter.name, r) for r in requests]
    known = cache.get(counter.name, keys) if cache is not None else {}
    missing: dict[str, dict[str, Any]] = {}
    for k, r in zip(keys, requests, strict=True):
        if k not in known and k not in missing:
            missing[k] = r
    if len(missing) > max_uncached:
        return Counted(
            None,
            "estimate",
            cached=len(keys) - len(missing),
            reason=f"{len(missing):,} requests not counted yet (more than {max_uncached:,} are not counted one by one)",
            capped=True,
        )
    todo = list(missing.items())
    sent = 0
    for i in range(0, len(todo), SLICE):
        part = todo[i : i + SLICE]
        try:
            answer = counter.count_tokens([r for _, r in part])
        except ProviderError as exc:
            log.warning("token counting through %s failed: %s (the counts stay estimates)", counter.name, exc)
            return Counted(None, "estimate", cached=len(keys) - len(missing), sent=sent, reason=f"counting failed: {exc}")
        if len(answer) != len(part):
            return Counted(None, "estimate", reason=f"{counter.name} answered {len(answer)} counts for {len(part)} requests")
        progress()  # a heartbeat per slice (the daemon's watchdog)
        got = {k: int(n) for (k, _), n in zip(part, answer, strict=True)}
        known.update(got)
        sent += len(part)
        if cache is not None:
            cache.put(counter.name, got)
    return Counted([known[k] for k in keys], source, cached=len(keys) - len(missing), sent=sent)


def count_hook(
    counter: TokenCounter | None,
    cache: CountCache | None,
    *,
    max_uncached: int = MAX_UNCACHED,
    progress: Callable[[], None] = lambda: None,
) -> Callable[[list[bytes]], tuple[list[int] | None, dict[str, Any]]]:
    """The hook as :func:`batchgrader.pipeline.reuse.preview` (and the daemon's planning) call it:
    request lines -> (exact counts or None, :meth:`Counted.as_dict`)."""

    def run(lines: list[bytes]) -> tuple[list[int] | None, dict[str, Any]]:
        found = exact_counts(counter, lines, cache, max_uncached=max_uncached, progress=progress)
        return found.counts, found.as_dict()

    return run


def counter_for(provider: str, settings: Any) -> TokenCounter | None:
    """The counting hook of ``provider`` configured by ``settings`` (a profile), or None when the
    provider has none or its key is not set."""
    from batchgrader.provider.registry import PROVIDERS  # the registry names each provider's hook

    spec = PROVIDERS.get(provider)
    return spec.counter(settings) if spec is not None and spec.counter is not None else None


def plan_with_exact_counts(
    prep: Any,
    requests_path: Path,
    provider: str,
    counter: TokenCounter | None,
    cache: CountCache | None,
    limits: Any,
    *,
    max_uncached: int = MAX_UNCACHED,
    progress: Callable[[], None] = lambda: None,
) -> dict[str, Any] | None:
    """The daemon's job planning through the counting hook: for a provider whose tokenizer is not
    public, count every request the job can send with the provider's endpoint (cached) and plan
    the chunks on those exact counts (:func:`batchgrader.pipeline.reuse.apply_exact_counts`), or
    keep the tiktoken estimates.  Returns the ``InputTokensCounted`` payload (``input_tokens``
    included), or None for a provider whose local count is exact already."""
    from batchgrader.pipeline.reuse import apply_exact_counts

    if provider in OFFLINE_EXACT:
        return None
    hook = count_hook(counter, cache, max_uncached=max_uncached, progress=progress)
    info = apply_exact_counts(prep, requests_path, hook, limits)
    if info.get("capped"):
        # the whole job keeps its estimates (a plan is made on one kind of count); say what to do
        info["reason"] = (
            f"{info.get('reason')}; the daemon counts at most {max_uncached:,} uncached requests of a job itself: "
            "run `bgctl count FILE --profile NAME` before submitting, and the daemon finds its counts in the cache"
        )
        log.warning("input tokens of this %s job stay estimates: %s", provider, info["reason"])
    return {
        "exact": bool(info.get("exact")),
        "source": info.get("source") if info.get("exact") else "estimate",
        "input_tokens": int(prep.input_tokens),
        "reason": info.get("reason"),
    }

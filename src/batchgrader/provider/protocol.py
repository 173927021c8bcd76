"""The provider interface: the :class:`Provider` protocol the engine calls, the frozen values it
returns (files, batches, pages), the errors it raises, and how many times every client retries a read.

Clients: :mod:`batchgrader.provider.openai_api` (OpenAI and compatible APIs, the emulator),
:mod:`batchgrader.provider.anthropic_api`, :mod:`batchgrader.provider.memory` (in memory, for tick tests).
"""

from __future__ import annotations

import email.utils
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
#: the endpoint of a batch of chat completions (an OpenAI batch's endpoint is the ``url`` of its lines)
DEFAULT_ENDPOINT = "/v1/chat/completions"


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class BatchErrorInfo:
    code: str | None
    message: str | None
    param: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class BatchUsage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class FileInfo:
    id: str
    filename: str
    bytes: int
    purpose: str
    created_at: int
    status: str | None = None
    expires_at: int | None = None


class FrozenMap(dict):  # type: ignore[type-arg]
    """A read-only dict (hashable, picklable, JSON-serialisable, works with dataclasses.asdict)."""

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("FrozenMap is read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> Any:
        return (FrozenMap, (dict(self),))

    def __copy__(self) -> FrozenMap:
        return self

    def __deepcopy__(self, memo: Any) -> FrozenMap:
        return self


def _frozen_map(m: Mapping[str, str] | None) -> FrozenMap:
    return FrozenMap(m or {})


@dataclass(frozen=True)
class BatchInfo:
    id: str
    status: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    model: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    request_counts: RequestCounts = RequestCounts()
    errors: tuple[BatchErrorInfo, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=FrozenMap)
    usage: BatchUsage | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class BatchPage:
    items: tuple[BatchInfo, ...]
    has_more: bool
    last_id: str | None


def _file_info(obj: Any) -> FileInfo:
    return FileInfo(
        id=obj.id,
        filename=obj.filename,
        bytes=int(obj.bytes),
        purpose=str(obj.purpose),
        created_at=int(obj.created_at),
        status=getattr(obj, "status", None),
        expires_at=getattr(obj, "expires_at", None),
    )


def _batch_info(obj: Any) -> BatchInfo:
    rc = obj.request_counts
    errors: tuple[BatchErrorInfo, ...] = ()
    if obj.errors is not None and obj.errors.data:
        errors = tuple(BatchErrorInfo(e.code, e.message, e.param, e.line) for e in obj.errors.data)
    usage = None
    if obj.usage is not None:
        u = obj.usage
        usage = BatchUsage(
            input_tokens=u.input_tokens or 0,
            cached_tokens=(u.input_tokens_details.cached_tokens if u.input_tokens_details else 0) or 0,
            output_tokens=u.output_tokens or 0,
            reasoning_tokens=(u.output_tokens_details.reasoning_tokens if u.output_tokens_details else 0) or 0,
            total_tokens=u.total_tokens or 0,
        )
    return BatchInfo(
        id=obj.id,
        status=str(obj.status),
        endpoint=obj.endpoint,
        input_file_id=obj.input_file_id,
        completion_window=obj.completion_window,
        created_at=int(obj.created_at),
        model=getattr(obj, "model", None),
        output_file_id=obj.output_file_id,
        error_file_id=obj.error_file_id,
        # Azure reports null counts in a failed batch: read as 0
        request_counts=RequestCounts(rc.total or 0, rc.completed or 0, rc.failed or 0) if rc is not None else RequestCounts(),
        errors=errors,
        metadata=_frozen_map(obj.metadata),
        usage=usage,
        in_progress_at=obj.in_progress_at,
        expires_at=obj.expires_at,
        finalizing_at=obj.finalizing_at,
        completed_at=obj.completed_at,
        failed_at=obj.failed_at,
        expired_at=obj.expired_at,
        cancelling_at=obj.cancelling_at,
        cancelled_at=obj.cancelled_at,
    )


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------


class ProviderError(Exception):
    """Base class. Messages are scrubbed of the API key."""


class ProviderConfigError(ProviderError):
    """The client cannot be built (no API key, bad base URL)."""


class ProviderRejected(ProviderError):
    """The API definitely refused the call (a 4xx answer). Nothing was created.

    ``retryable`` is true for 429 (rate limited: the same call may succeed later)."""

    def __init__(
        self,
        operation: str,
        status_code: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ):
        self.operation = operation
        self.status_code = status_code
        self.message = message
        self.code = code
        self.param = param
        self.type = type
        self.request_id = request_id
        self.retry_after = retry_after
        detail = f"{operation}: HTTP {status_code}"
        if code:
            detail += f" ({code})"
        super().__init__(f"{detail}: {message}")

    @property
    def retryable(self) -> bool:
        return self.status_code == 429


class OutcomeUnknown(ProviderError):
    """A non-idempotent call may or may not have taken effect (connection closed, timeout, 5xx).

    Reconcile (``find_batches`` / ``find_files``) before sending it again."""

    def __init__(self, operation: str, cause: str, *, status_code: int | None = None, request_id: str | None = None):
        self.operation = operation
        self.cause = cause
        self.status_code = status_code
        self.request_id = request_id
        super().__init__(f"{operation}: outcome unknown ({cause}); reconcile before re-sending")


class ProviderUnavailable(ProviderError):
    """A read kept failing with transient errors until the attempts ran out (or the server
    asked to wait longer than we are willing to block)."""

    def __init__(
        self, operation: str, attempts: int, cause: str, *, status_code: int | None = None, retry_after: float | None = None
    ):
        self.operation = operation
        self.attempts = attempts
        self.cause = cause
        self.status_code = status_code
        self.retry_after = retry_after
        super().__init__(f"{operation}: gave up after {attempts} attempt(s): {cause}")


# ----------------------------------------------------------------------------------------------
# read retries
# ----------------------------------------------------------------------------------------------

RETRYABLE_STATUSES = frozenset({408, 409, 429})


#: How many times an adapter's SDK retries a read (retrieve, list, download) after its first
#: attempt; writes are never retried (sent once, then reconciled).  One figure for every provider:
#: the openai and anthropic SDKs' ``max_retries``, google-genai's ``HttpRetryOptions.attempts - 1``.
#: With ``request_timeout_seconds`` (the longest silence of one attempt) it bounds a read:
#: ``(READ_RETRIES + 1) * request_timeout_seconds`` plus the backoff between attempts.
READ_RETRIES = 2

#: The longest Retry-After an SDK waits inside a call (openai's ``MAX_RETRY_AFTER_DELAY``; the
#: Anthropic adapter holds its SDK to it): a longer one ends the call and reaches the engine.
MAX_SDK_WAIT_S = 120.0


def parse_retry_after(headers: Mapping[str, str] | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, else ``retry-after`` (seconds or
    an HTTP date). None when absent or unparseable."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if parsed is None:
        return None
    return max(0.0, parsed.timestamp() - now())


# ----------------------------------------------------------------------------------------------
# the interface
# ----------------------------------------------------------------------------------------------


@runtime_checkable
class Provider(Protocol):
    """What the engine needs from a provider, and nothing more: the calls it makes
    (``upload``, ``create_batch``, ``retrieve``, ``cancel``, ``download``, ``delete_file``), the
    two listings it reconciles with (``find_files``, ``find_batches``; see :func:`reconcile_upload`
    and :func:`reconcile_batch`), ``list_batches``, one page of which refreshes up to 100
    batches in flight per poll round (:func:`list_statuses`), and ``complete``, one request
    through the synchronous API (a job's preflight).

    Writes (``upload``, ``create_batch``) are sent once: an ambiguous failure raises
    :class:`OutcomeUnknown` and the caller reconciles before sending again.  A definite refusal
    raises :class:`ProviderRejected`.  :class:`~batchgrader.provider.openai_api.OpenAIProvider`
    talks to the real API (or the emulator), :class:`~batchgrader.provider.anthropic_batches.AnthropicBatchProvider`
    to Anthropic, :class:`batchgrader.provider.memory.MemoryProvider` keeps everything in memory.

    Optional attributes, used only when present: ``base_url`` (whose queue a learned limit
    belongs to), ``on_page`` (set by the engine, called after each listing page to keep the
    watchdog fed).  The daemon holds one per provider name (:class:`~batchgrader.provider.pool.Providers`)
    and calls the one recorded for the job (``Context.provider_for``).
    ``tests/test_protocol.py`` checks that this protocol is exactly what the engine calls."""

    def upload(self, path: str | os.PathLike[str], filename: str) -> FileInfo: ...

    def find_files(self, filename: str, size: int | None = None, created_after: int | None = None) -> list[FileInfo]: ...

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str | None = None,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
    ) -> BatchInfo:
        """Create a batch of the uploaded file, once.  ``endpoint`` None: the ``url`` the file's
        request lines carry (``/v1/chat/completions``, or ``/v1/responses`` for a job sent through
        the Responses API), which an OpenAI batch must name."""
        ...

    def find_batches(
        self, input_file_id: str | None = None, metadata: Mapping[str, str] | None = None, created_after: int | None = None
    ) -> list[BatchInfo]: ...

    def retrieve(self, batch_id: str) -> BatchInfo: ...

    def cancel(self, batch_id: str) -> BatchInfo: ...

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage: ...

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int: ...

    def delete_file(self, file_id: str) -> bool: ...

    def complete(self, line: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
        """One request line through the provider's synchronous API (the preflight), sent once, with
        exactly the body its batch would carry: the answer as an OpenAI batch output line.  A 4xx
        raises :class:`ProviderRejected`; a 5xx, a timeout or a lost reply :class:`OutcomeUnknown`
        or :class:`ProviderUnavailable`.  ``job_id``: the job it is sent for."""
        ...


def content_text(content: Any) -> str:
    """A chat message's ``content`` as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""

"""The batch provider client: one interface over the OpenAI Files + Batches API.

Rules this module enforces (see ``reliability-notes.md`` §2 and ``openai-batch-api-facts.md`` §5):

* **Never submit twice.** ``files.create`` and ``batches.create`` are sent exactly once
  (``max_retries=0``; the API honours no idempotency key).  A definite refusal (a 4xx with the
  API's message) raises :class:`ProviderRejected`; an ambiguous outcome (connection closed,
  timeout, 5xx, 408) raises :class:`OutcomeUnknown` and the caller must *reconcile* — list and
  match — before any re-send.  :func:`create_batch_reconciled` and :func:`upload_reconciled`
  implement that protocol.
* **Reads retry on our terms.** The SDK's own retries are turned off for every call (the client
  is built with ``max_retries=0``); retrieve/list/cancel/download retry 408/409/429/5xx and
  connection errors with exponential backoff plus jitter, honouring ``retry-after-ms`` /
  ``retry-after``, a bounded number of times, through an injectable ``sleep``.
* **No SDK objects leak out**: everything returned is a frozen dataclass.
* **The API key never appears** in exception messages, reprs or logs.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

import httpx2
import openai

from batchgrader.fsio import TMP_PREFIX, fsync_dir
from batchgrader.secrets import mask_secret

log = logging.getLogger(__name__)

T = TypeVar("T")

TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
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
        request_counts=RequestCounts(rc.total, rc.completed, rc.failed) if rc is not None else RequestCounts(),
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
# retry policy
# ----------------------------------------------------------------------------------------------

RETRYABLE_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for reads: attempt n (0-based) waits ``min(base * 2**n, max_delay)`` scaled by a
    jitter factor in ``[1 - jitter, 1]``; a server ``retry-after(-ms)`` wins when it is larger.
    A requested wait above ``max_retry_after`` stops retrying (:class:`ProviderUnavailable`)."""

    max_attempts: int = 6
    base_delay: float = 0.5
    max_delay: float = 30.0
    jitter: float = 0.25
    max_retry_after: float = 120.0

    def backoff(self, retries_taken: int, rng: random.Random) -> float:
        d = min(self.base_delay * (2.0**retries_taken), self.max_delay)
        return d * (1.0 - self.jitter * rng.random())


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
    and :func:`reconcile_batch`), and ``list_batches``, one page of which refreshes up to 100
    batches in flight per poll round (:func:`list_statuses`).

    Writes (``upload``, ``create_batch``) are sent once: an ambiguous failure raises
    :class:`OutcomeUnknown` and the caller reconciles before sending again.  A definite refusal
    raises :class:`ProviderRejected`.  :class:`OpenAIProvider` talks to the real API (or the
    emulator); :class:`batchgrader.provider.memory.MemoryProvider` keeps everything in memory."""

    def upload(self, path: str | os.PathLike[str], filename: str) -> FileInfo: ...

    def find_files(self, filename: str, size: int | None = None, created_after: int | None = None) -> list[FileInfo]: ...

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str = DEFAULT_ENDPOINT,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
    ) -> BatchInfo: ...

    def find_batches(
        self, input_file_id: str | None = None, metadata: Mapping[str, str] | None = None, created_after: int | None = None
    ) -> list[BatchInfo]: ...

    def retrieve(self, batch_id: str) -> BatchInfo: ...

    def cancel(self, batch_id: str) -> BatchInfo: ...

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage: ...

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int: ...

    def delete_file(self, file_id: str) -> bool: ...


# ----------------------------------------------------------------------------------------------
# OpenAI implementation
# ----------------------------------------------------------------------------------------------


class _Transient(Exception):
    """Internal: a retryable failure of one attempt."""

    def __init__(self, cause: str, status_code: int | None = None, retry_after: float | None = None):
        super().__init__(cause)
        self.cause = cause
        self.status_code = status_code
        self.retry_after = retry_after


class OpenAIProvider:
    """:class:`Provider` on the official ``openai`` SDK; any OpenAI-compatible Batch API works
    through ``base_url``.  ``api_key``/``base_url`` default to ``OPENAI_API_KEY`` /
    ``OPENAI_BASE_URL`` exactly as the SDK reads them."""

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        *,
        connect_timeout: float = 5.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        organization: str | None = None,
        project: str | None = None,
        list_page_size: int = 100,
    ):
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.list_page_size = max(1, min(100, list_page_size))
        self.on_page: Callable[[], None] = lambda: None  # called per listing page (a watchdog heartbeat)
        try:
            self._client = openai.OpenAI(
                api_key=api_key,
                base_url=base_url,
                organization=organization,
                project=project,
                timeout=httpx2.Timeout(timeout, connect=connect_timeout),
                max_retries=0,  # our policy, not the SDK's; POSTs are never retried
            )
        except openai.OpenAIError as exc:
            # The SDK's message names the missing setting, never a key value; scrub anyway.
            raise ProviderConfigError(self._scrub_with(api_key, str(exc))) from None
        key = self._client.api_key
        self._secret = key if isinstance(key, str) and key else None
        self.base_url = str(self._client.base_url)

    # --- secret hygiene ----------------------------------------------------------------------

    @staticmethod
    def _scrub_with(secret: str | None, text: str) -> str:
        if secret and secret in text:
            text = text.replace(secret, mask_secret(secret) or "****")
        return text

    def _scrub(self, text: str) -> str:
        return self._scrub_with(self._secret, text)

    def __repr__(self) -> str:
        return f"OpenAIProvider(base_url={self.base_url!r}, api_key={mask_secret(self._secret)!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:  # never pickle a live client with its key
        raise TypeError("OpenAIProvider cannot be pickled")

    # --- error classification ------------------------------------------------------------------

    def _status_details(self, exc: openai.APIStatusError) -> tuple[str, str | None, str | None, str | None]:
        body = exc.body
        message = None
        if isinstance(body, dict):
            message = body.get("message")
        if not isinstance(message, str) or not message:
            try:
                message = exc.response.text[:500] or exc.message
            except Exception:  # the body of a streamed response may be unreadable
                message = exc.message
        return self._scrub(message), exc.code, exc.param, exc.type

    def _rejected(self, op: str, exc: openai.APIStatusError) -> ProviderRejected:
        message, code, param, etype = self._status_details(exc)
        return ProviderRejected(
            op,
            exc.status_code,
            message,
            code=code,
            param=param,
            type=etype,
            request_id=exc.request_id,
            retry_after=parse_retry_after(exc.response.headers),
        )

    def _describe(self, exc: BaseException) -> str:
        parts = [f"{type(exc).__name__}: {exc}"]
        cause = exc.__cause__ or exc.__context__
        if cause is not None and cause is not exc:
            parts.append(f"{type(cause).__name__}: {cause}")
        return self._scrub("; ".join(parts))

    def _once(self, op: str, fn: Callable[[], T]) -> T:
        """A non-idempotent call: exactly one attempt, classified."""
        try:
            return fn()
        except openai.APIStatusError as exc:
            if exc.status_code == 408 or exc.status_code >= 500:
                message, _, _, _ = self._status_details(exc)
                raise OutcomeUnknown(
                    op, f"HTTP {exc.status_code}: {message}", status_code=exc.status_code, request_id=exc.request_id
                ) from None
            raise self._rejected(op, exc) from None
        except openai.APIConnectionError as exc:  # includes APITimeoutError
            raise OutcomeUnknown(op, self._describe(exc)) from None
        except httpx2.HTTPError as exc:
            raise OutcomeUnknown(op, self._describe(exc)) from None
        except openai.APIError as exc:  # e.g. a 200 whose body is not the expected object
            raise OutcomeUnknown(op, self._describe(exc)) from None
        except ValueError as exc:  # a 200 whose body is not JSON (the SDK lets JSONDecodeError out)
            raise OutcomeUnknown(op, f"unreadable response body: {self._describe(exc)}") from None

    def _with_retries(self, op: str, fn: Callable[[], T], *, retry_statuses: frozenset[int] = RETRYABLE_STATUSES) -> T:
        """An idempotent call: retried on transient failures per :class:`RetryPolicy`."""
        policy = self.retry
        last: _Transient | None = None
        for attempt in range(policy.max_attempts):
            try:
                try:
                    return fn()
                except openai.APIStatusError as exc:
                    if exc.status_code in retry_statuses or exc.status_code >= 500:
                        message, _, _, _ = self._status_details(exc)
                        raise _Transient(
                            f"HTTP {exc.status_code}: {message}", exc.status_code, parse_retry_after(exc.response.headers)
                        ) from None
                    raise self._rejected(op, exc) from None
                except openai.APIConnectionError as exc:
                    raise _Transient(self._describe(exc)) from None
                except httpx2.HTTPError as exc:  # e.g. a body cut short while streaming
                    raise _Transient(self._describe(exc)) from None
                except openai.APIResponseValidationError as exc:
                    raise _Transient(self._describe(exc)) from None
                except ValueError as exc:  # a body that is not JSON (the SDK lets JSONDecodeError out)
                    raise _Transient(f"unreadable response body: {self._describe(exc)}") from None
            except _Transient as t:
                last = t
                if attempt + 1 >= policy.max_attempts:
                    break
                delay = policy.backoff(attempt, self.rng)
                if t.retry_after is not None:
                    if t.retry_after > policy.max_retry_after:
                        raise ProviderUnavailable(
                            op, attempt + 1, t.cause, status_code=t.status_code, retry_after=t.retry_after
                        ) from None
                    delay = max(delay, t.retry_after)
                log.info(
                    "%s: transient failure (%s); retry %d/%d in %.2fs", op, t.cause, attempt + 1, policy.max_attempts - 1, delay
                )
                self.sleep(delay)
        assert last is not None
        raise ProviderUnavailable(op, policy.max_attempts, last.cause, status_code=last.status_code, retry_after=last.retry_after)

    # --- files ---------------------------------------------------------------------------------

    def upload(self, path: str | os.PathLike[str], filename: str) -> FileInfo:
        """Upload a batch input file (purpose ``batch``), once. Raises ProviderRejected or
        OutcomeUnknown (then reconcile with :meth:`find_files`)."""
        with open(path, "rb") as fh:  # streamed by the HTTP client, not read into memory here
            obj = self._once(
                "files.create",
                lambda: self._client.files.create(file=(filename, fh, "application/jsonl"), purpose="batch"),
            )
        return _file_info(obj)

    def find_files(self, filename: str, size: int | None = None, created_after: int | None = None) -> list[FileInfo]:
        """Uploaded batch files named ``filename`` (and of ``size`` bytes), oldest first.
        Pages newest first and stops at files older than ``created_after``."""
        out: list[FileInfo] = []
        after: str | None = None
        while True:
            page_args: dict[str, Any] = {"after": after} if after else {}
            self.on_page()
            page = self._with_retries(
                "files.list",
                lambda page_args=page_args: self._client.files.list(purpose="batch", order="desc", limit=1000, **page_args),  # type: ignore[misc]
            )
            items = [_file_info(o) for o in page.data]
            if after is not None and any(f.id == after for f in items):
                break  # the provider ignored the cursor and sent an earlier page again
            stop = False
            for f in items:
                if created_after is not None and f.created_at < created_after:
                    stop = True
                    break
                if f.filename == filename and (size is None or f.bytes == size):
                    out.append(f)
            if stop or not items or page.has_more is False or items[-1].id == after:
                break  # (a cursor that does not advance would page forever)
            after = items[-1].id
        out.sort(key=lambda f: (f.created_at, f.id))
        return out

    def delete_file(self, file_id: str) -> bool:
        """Delete a file; True when deleted, False when it did not exist (already gone)."""
        try:
            res = self._with_retries(
                "files.delete", lambda: self._client.files.delete(file_id), retry_statuses=frozenset({408, 429})
            )
        except ProviderRejected as exc:
            if exc.status_code == 404:
                return False
            raise
        return bool(res.deleted)

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int:
        """Stream a file's content to ``dest_path`` (temp file in the same directory, fsync,
        rename). Returns the byte count. A body cut short is retried like any transient error."""
        dest = Path(dest_path)
        dest.parent.mkdir(parents=True, exist_ok=True)

        def attempt() -> int:
            fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{dest.name}.", suffix=".part", dir=dest.parent)
            tmp = Path(tmp_name)
            try:
                n = 0
                with os.fdopen(fd, "wb") as out:
                    with self._client.files.with_streaming_response.content(
                        file_id, extra_headers={"Accept-Encoding": "identity"}
                    ) as resp:
                        expected = resp.headers.get("content-length")
                        for chunk in resp.iter_bytes(1 << 20):
                            out.write(chunk)
                            n += len(chunk)
                        raw = _raw_bytes_received(resp, n)
                    if expected is not None and expected.isdigit() and int(expected) != raw:
                        raise _Transient(f"download of {file_id} cut short: {n} of {expected} bytes")
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, dest)
                fsync_dir(dest.parent)
                return n
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise

        def guarded() -> int:
            try:
                return attempt()
            except _Transient:
                raise
            except OSError as exc:
                if isinstance(exc, (ConnectionError, TimeoutError)):
                    raise _Transient(self._describe(exc)) from None
                raise

        # A _Transient raised by ``guarded`` itself is retried like the SDK's transient errors.
        return self._with_retries("files.content", guarded)

    # --- batches -------------------------------------------------------------------------------

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str = DEFAULT_ENDPOINT,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
    ) -> BatchInfo:
        """Create a batch, once. Raises ProviderRejected or OutcomeUnknown (then reconcile with
        :meth:`find_batches`; never re-send blindly)."""
        kwargs: dict[str, Any] = {"input_file_id": input_file_id, "endpoint": endpoint, "completion_window": completion_window}
        if metadata is not None:
            kwargs["metadata"] = dict(metadata)
        return _batch_info(self._once("batches.create", lambda: self._client.batches.create(**kwargs)))

    def retrieve(self, batch_id: str) -> BatchInfo:
        return _batch_info(self._with_retries("batches.retrieve", lambda: self._client.batches.retrieve(batch_id)))

    def cancel(self, batch_id: str) -> BatchInfo:
        """Ask for cancellation (idempotent on the API side). A 409 — the batch is already
        completed/failed/expired — is a definite :class:`ProviderRejected`, not retried."""
        return _batch_info(
            self._with_retries(
                "batches.cancel", lambda: self._client.batches.cancel(batch_id), retry_statuses=frozenset({408, 429})
            )
        )

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage:
        """One page of batches, newest first (``limit`` 1–100)."""
        kwargs: dict[str, Any] = {"limit": limit}
        if after:
            kwargs["after"] = after
        self.on_page()
        page = self._with_retries("batches.list", lambda: self._client.batches.list(**kwargs))
        items = tuple(_batch_info(b) for b in page.data)
        has_more = bool(page.has_more) if page.has_more is not None else bool(items)
        return BatchPage(items, has_more, items[-1].id if items else None)

    def iter_batches(self, created_after: int | None = None) -> Iterator[BatchInfo]:
        """All batches newest first, stopping at the first one created before ``created_after``."""
        after: str | None = None
        while True:
            page = self.list_batches(limit=self.list_page_size, after=after)
            if after is not None and any(b.id == after for b in page.items):
                return  # the provider ignored the cursor and sent an earlier page again
            for b in page.items:
                if created_after is not None and b.created_at < created_after:
                    return
                yield b
            if not page.has_more or page.last_id is None or page.last_id == after:
                return  # (a cursor that does not advance would page forever)
            after = page.last_id

    def find_batches(
        self,
        input_file_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
        created_after: int | None = None,
    ) -> list[BatchInfo]:
        """Batches matching ``input_file_id`` and containing every ``metadata`` pair, oldest
        first.  The API cannot filter, so this pages ``batches.list`` (newest first) back to
        ``created_after``."""
        out = [b for b in self.iter_batches(created_after) if batch_matches(b, input_file_id, metadata)]
        out.sort(key=lambda b: (b.created_at, b.id))
        return out


def _raw_bytes_received(resp: Any, decoded: int) -> int:
    """Bytes received on the wire (before any Content-Encoding was undone): what Content-Length
    counts.  A compressing proxy can ignore ``Accept-Encoding: identity``."""
    http = getattr(resp, "http_response", None)
    n = getattr(http, "num_bytes_downloaded", None)
    return int(n) if isinstance(n, int) else decoded


def list_statuses(provider: Provider, wanted: set[str], max_pages: int | None = None) -> dict[str, BatchInfo]:
    """The current state of every batch in ``wanted`` from paged ``batches.list`` calls (newest
    first, 100 a page): one call per 100 batches instead of one ``retrieve`` per batch.  Stops
    once every wanted batch was seen, at the last page, or after ``max_pages`` (default: two
    pages more than the wanted batches fill; batches in flight are among the newest).  Batches
    not found are absent from the answer (the caller retrieves them)."""
    found: dict[str, BatchInfo] = {}
    after: str | None = None
    pages = 0
    limit = max_pages if max_pages is not None else len(wanted) // 100 + 3
    while len(found) < len(wanted) and pages < limit:
        page = provider.list_batches(limit=100, after=after)
        pages += 1
        for b in page.items:
            if b.id in wanted:
                found[b.id] = b
        if not page.has_more or page.last_id is None:
            break
        after = page.last_id
    return found


def batch_matches(b: BatchInfo, input_file_id: str | None, metadata: Mapping[str, str] | None) -> bool:
    """A batch is ours when its input file and every ``metadata`` pair match.  A provider that
    drops metadata (the batch comes back with none) is matched on the input file alone, so a
    batch that exists is never taken for absent (one uploaded file backs one chunk attempt)."""
    if input_file_id is not None and b.input_file_id != input_file_id:
        return False
    if metadata:
        if not b.metadata and input_file_id is not None:
            return True  # metadata dropped by the provider: the input file id decides
        for k, v in metadata.items():
            if b.metadata.get(k) != v:
                return False
    return True


# ----------------------------------------------------------------------------------------------
# reconciliation (never submit twice)
# ----------------------------------------------------------------------------------------------

Outcome = Literal["created", "adopted", "not_created"]


@dataclass(frozen=True)
class BatchSubmission:
    """Result of :func:`create_batch_reconciled`.

    ``created``: the one call succeeded.  ``adopted``: the call's outcome was unknown and a
    matching batch was found (``batch``; further matches in ``duplicates``, oldest first — the
    caller should cancel them).  ``not_created``: the outcome was unknown and the listing found
    nothing; the caller may retry (with a fresh intent record), never blindly in a loop."""

    outcome: Outcome
    batch: BatchInfo | None
    duplicates: tuple[BatchInfo, ...] = ()
    cause: str | None = None


@dataclass(frozen=True)
class UploadResult:
    outcome: Outcome
    file: FileInfo | None
    duplicates: tuple[FileInfo, ...] = ()
    cause: str | None = None


def reconcile_batch(
    provider: Provider,
    input_file_id: str,
    metadata: Mapping[str, str] | None = None,
    *,
    created_after: int | None = None,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
    cause: str | None = None,
) -> BatchSubmission:
    """List and match only (no create): ``adopted`` (oldest match; the rest in ``duplicates``)
    or ``not_created``.  With ``settle_s`` > 0, an empty listing is repeated once after that
    wait (a request may still have been in flight).  A failing listing raises
    :class:`ProviderUnavailable`: the outcome is still unknown, run this again later."""
    found = provider.find_batches(input_file_id=input_file_id, metadata=metadata, created_after=created_after)
    if not found and settle_s > 0:
        sleep(settle_s)
        found = provider.find_batches(input_file_id=input_file_id, metadata=metadata, created_after=created_after)
    if not found:
        return BatchSubmission("not_created", None, (), cause)
    return BatchSubmission("adopted", found[0], tuple(found[1:]), cause)


def create_batch_reconciled(
    provider: Provider,
    input_file_id: str,
    endpoint: str = DEFAULT_ENDPOINT,
    completion_window: str = "24h",
    metadata: Mapping[str, str] | None = None,
    *,
    created_after: int | None = None,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> BatchSubmission:
    """Try ``create_batch`` once; on :class:`OutcomeUnknown` list and match by
    ``input_file_id`` and ``metadata`` (:func:`reconcile_batch`) and adopt the oldest match.
    Only when the listing finds nothing is ``not_created`` reported; the caller may then send
    again (after recording a new attempt), never blindly in a loop.

    Raises :class:`ProviderRejected` (definitely not created) and :class:`OutcomeUnknown` when
    the create was ambiguous *and* the listing failed too — the caller must then call
    :func:`reconcile_batch` until it answers, and must not call this function again."""
    try:
        return BatchSubmission("created", provider.create_batch(input_file_id, endpoint, completion_window, metadata))
    except OutcomeUnknown as exc:
        first = exc
        log.warning("batches.create outcome unknown (%s); reconciling by listing", exc.cause)
    try:
        return reconcile_batch(
            provider, input_file_id, metadata, created_after=created_after, settle_s=settle_s, sleep=sleep, cause=str(first)
        )
    except ProviderUnavailable as exc:
        raise OutcomeUnknown("batches.create", f"{first.cause}; reconciliation listing failed too: {exc}") from None


def reconcile_upload(
    provider: Provider,
    filename: str,
    size: int,
    *,
    created_after: int | None = None,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
    cause: str | None = None,
) -> UploadResult:
    """List and match only (no upload): a batch file with this name and byte size."""
    found = provider.find_files(filename, size, created_after)
    if not found and settle_s > 0:
        sleep(settle_s)
        found = provider.find_files(filename, size, created_after)
    if not found:
        return UploadResult("not_created", None, (), cause)
    return UploadResult("adopted", found[0], tuple(found[1:]), cause)


def upload_reconciled(
    provider: Provider,
    path: str | os.PathLike[str],
    filename: str,
    *,
    created_after: int | None = None,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> UploadResult:
    """Upload once; on :class:`OutcomeUnknown` look for a batch file with the same name and byte
    size (:func:`reconcile_upload`) and adopt the oldest.  ``filename`` should be unique per
    intent (e.g. include a content hash), since files carry no metadata.  Raises like
    :func:`create_batch_reconciled`."""
    size = Path(path).stat().st_size
    try:
        return UploadResult("created", provider.upload(path, filename))
    except OutcomeUnknown as exc:
        first = exc
        log.warning("files.create outcome unknown (%s); reconciling by listing", exc.cause)
    try:
        return reconcile_upload(
            provider, filename, size, created_after=created_after, settle_s=settle_s, sleep=sleep, cause=str(first)
        )
    except ProviderUnavailable as exc:
        raise OutcomeUnknown("files.create", f"{first.cause}; reconciliation listing failed too: {exc}") from None

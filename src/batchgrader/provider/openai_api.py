"""The batch provider client: one interface over the OpenAI Files + Batches API.

Rules this module enforces (see ``reliability-notes.md`` §2 and ``openai-batch-api-facts.md`` §5):

* **Never submit twice.** ``files.create`` and ``batches.create`` are sent exactly once
  (``max_retries=0``; the API honours no idempotency key).  A definite refusal (a 4xx with the
  API's message) raises :class:`ProviderRejected`; an ambiguous outcome (connection closed,
  timeout, 5xx, 408) raises :class:`OutcomeUnknown` and the caller must *reconcile* — list and
  match — before any re-send.  :func:`create_batch_reconciled` and :func:`upload_reconciled`
  implement that protocol.
* **Reads retry through the SDK.** retrieve, list, files list, download and delete go through a
  copy of the client with ``max_retries`` (:data:`~batchgrader.provider.protocol.READ_RETRIES`
  by default): the SDK retries 408/409/429/5xx, connection errors and timeouts, honouring
  ``retry-after-ms`` / ``retry-after`` up to 120 s (docs/providers.md, "Read retries").  What
  is still failing after the last attempt raises :class:`ProviderUnavailable` carrying the
  final answer's ``Retry-After``; the engine asks again at a later tick.  ``cancel`` is sent once.
* **No SDK objects leak out**: everything returned is a frozen dataclass.
* **The API key never appears** in exception messages, reprs or logs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import openai

from batchgrader.core.host.secrets import mask_secret
from batchgrader.fsio import TMP_PREFIX, fsync_dir
from batchgrader.pipeline.catalogue import EMBEDDINGS_URL, RESPONSES_URL
from batchgrader.provider.protocol import (
    DEFAULT_ENDPOINT,
    READ_RETRIES,
    RETRYABLE_STATUSES,
    TERMINAL_STATUSES,
    BatchErrorInfo,
    BatchInfo,
    BatchPage,
    BatchUsage,
    FileInfo,
    FrozenMap,
    OutcomeUnknown,
    Provider,
    ProviderConfigError,
    ProviderError,
    ProviderRejected,
    ProviderUnavailable,
    RequestCounts,
    _batch_info,
    _file_info,
    parse_retry_after,
)
from batchgrader.provider.reconcile import (
    BatchSubmission,
    Outcome,
    UploadResult,
    batch_matches,
    create_batch_reconciled,
    list_statuses,
    reconcile_batch,
    reconcile_upload,
    upload_reconciled,
)
from batchgrader.provider.tls import httpx_context

log = logging.getLogger(__name__)

T = TypeVar("T")


__all__ = [
    "BatchErrorInfo",
    "BatchInfo",
    "BatchPage",
    "BatchSubmission",
    "BatchUsage",
    "DEFAULT_ENDPOINT",
    "FileInfo",
    "FrozenMap",
    "OpenAIProvider",
    "Outcome",
    "OutcomeUnknown",
    "Provider",
    "ProviderConfigError",
    "ProviderError",
    "ProviderRejected",
    "ProviderUnavailable",
    "READ_RETRIES",
    "RETRYABLE_STATUSES",
    "RequestCounts",
    "TERMINAL_STATUSES",
    "UploadResult",
    "batch_matches",
    "create_batch_reconciled",
    "list_statuses",
    "parse_retry_after",
    "reconcile_batch",
    "reconcile_upload",
    "upload_reconciled",
]


# ----------------------------------------------------------------------------------------------
# OpenAI implementation
# ----------------------------------------------------------------------------------------------


class _HttpClient(openai.DefaultHttpxClient):
    """The HTTP client the SDK would make (``openai.DefaultHttpxClient``: its limits, redirects;
    closed when it is collected, as the SDK's own is), given the process's one TLS context of the
    SDK's own making (:func:`batchgrader.provider.tls.httpx_context`)."""

    def __init__(self) -> None:
        super().__init__(verify=httpx_context())

    def __del__(self) -> None:
        if not self.is_closed:
            try:
                self.close()
            except Exception:  # noqa: S110 - at collection, as the SDK's own wrapper
                pass


class OpenAIProvider:
    """:class:`Provider` on the official ``openai`` SDK; any OpenAI-compatible Batch API works
    through ``base_url``.  ``api_key``/``base_url`` default to ``OPENAI_API_KEY`` /
    ``OPENAI_BASE_URL`` exactly as the SDK reads them.  ``timeout`` bounds each attempt (the
    longest silence of the server); ``max_retries`` is how many times the SDK retries a read."""

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        *,
        connect_timeout: float = 5.0,
        max_retries: int = READ_RETRIES,
        organization: str | None = None,
        project: str | None = None,
        list_page_size: int = 100,
    ):
        self.max_retries = max_retries
        self.list_page_size = max(1, min(100, list_page_size))
        self.on_page: Callable[[], None] = lambda: None  # called per listing page (a watchdog heartbeat)
        try:
            self._client = self._make_client(
                api_key=api_key,
                base_url=base_url,
                organization=organization,
                project=project,
                timeout=httpx2.Timeout(timeout, connect=connect_timeout),
                http_client=_HttpClient(),
            )
        except openai.OpenAIError as exc:
            # The SDK's message names the missing setting, never a key value; scrub anyway.
            raise ProviderConfigError(self._scrub_with(api_key, str(exc))) from None
        # reads: the SDK's own retries; writes (self._client) are sent once
        self._reads = self._client.with_options(max_retries=max_retries)
        key = self._client.api_key
        self._secret = key if isinstance(key, str) and key else None
        self.base_url = str(self._client.base_url)
        self._line_urls: dict[str, str] = {}  # file id -> the ``url`` of its request lines (read at upload)

    def _make_client(self, **kwargs: Any) -> openai.OpenAI:
        """The SDK client (on ``kwargs["http_client"]``) for writes, which never retries (a subclass may build another flavour,
        e.g. ``AzureOpenAI``); reads use a copy with ``max_retries``."""
        return openai.OpenAI(**kwargs, max_retries=0)  # writes are sent once and reconciled

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

    def _read(self, op: str, fn: Callable[[], T], *, transient: frozenset[int] = RETRYABLE_STATUSES) -> T:
        """An idempotent call, classified once the SDK's retries (if ``fn`` uses ``self._reads``)
        are spent: a ``transient`` status, a 5xx, no reply or an unreadable body is
        :class:`ProviderUnavailable` (with the final answer's Retry-After), any other 4xx
        :class:`ProviderRejected`."""
        try:
            return fn()
        except openai.APIStatusError as exc:
            if exc.status_code in transient or exc.status_code >= 500:
                message, _, _, _ = self._status_details(exc)
                raise ProviderUnavailable(
                    op,
                    _attempts(exc.response.request),
                    f"HTTP {exc.status_code}: {message}",
                    status_code=exc.status_code,
                    retry_after=parse_retry_after(exc.response.headers),
                ) from None
            raise self._rejected(op, exc) from None
        except openai.APIConnectionError as exc:  # includes APITimeoutError
            raise ProviderUnavailable(op, _attempts(exc.request), self._describe(exc)) from None
        except (httpx2.HTTPError, openai.APIResponseValidationError) as exc:  # e.g. a body cut short while streaming
            raise ProviderUnavailable(op, 1, self._describe(exc)) from None
        except ValueError as exc:  # a body that is not JSON (the SDK lets JSONDecodeError out)
            raise ProviderUnavailable(op, 1, f"unreadable response body: {self._describe(exc)}") from None

    # --- files ---------------------------------------------------------------------------------

    def upload(self, path: str | os.PathLike[str], filename: str) -> FileInfo:
        """Upload a batch input file (purpose ``batch``), once. Raises ProviderRejected or
        OutcomeUnknown (then reconcile with :meth:`find_files`)."""
        with open(path, "rb") as fh:  # streamed by the HTTP client, not read into memory here
            url = _line_url(fh.readline())
            fh.seek(0)
            obj = self._once(
                "files.create",
                lambda: self._client.files.create(
                    file=(filename, fh, "application/jsonl"), purpose="batch", **self._upload_options()
                ),
            )
        info = _file_info(obj)
        if url is not None:
            self._line_urls[info.id] = url
        return info

    def _upload_options(self) -> dict[str, Any]:
        """Extra ``files.create`` arguments (none for OpenAI: batch files expire after 30 days)."""
        return {}

    def find_files(self, filename: str, size: int | None = None, created_after: int | None = None) -> list[FileInfo]:
        """Uploaded batch files named ``filename`` (and of ``size`` bytes), oldest first.
        Pages newest first and stops at files older than ``created_after``."""
        out: list[FileInfo] = []
        after: str | None = None
        while True:
            page_args: dict[str, Any] = {"after": after} if after else {}
            self.on_page()
            page = self._read(
                "files.list",
                lambda page_args=page_args: self._reads.files.list(purpose="batch", order="desc", limit=1000, **page_args),  # type: ignore[misc]
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
            res = self._read("files.delete", lambda: self._reads.files.delete(file_id), transient=frozenset({408, 429}))
        except ProviderRejected as exc:
            if exc.status_code == 404:
                return False
            raise
        return bool(res.deleted)

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int:
        """Stream a file's content to ``dest_path`` (temp file in the same directory, fsync,
        rename). Returns the byte count.  The SDK retries the request; a body cut short while it
        streams is :class:`ProviderUnavailable` (the engine downloads again later)."""
        dest = Path(dest_path)
        dest.parent.mkdir(parents=True, exist_ok=True)

        def attempt() -> int:
            fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{dest.name}.", suffix=".part", dir=dest.parent)
            tmp = Path(tmp_name)
            try:
                n = 0
                with os.fdopen(fd, "wb") as out:
                    with self._reads.files.with_streaming_response.content(
                        file_id, extra_headers={"Accept-Encoding": "identity"}
                    ) as resp:
                        expected = resp.headers.get("content-length")
                        for chunk in resp.iter_bytes(1 << 20):
                            out.write(chunk)
                            n += len(chunk)
                        raw = _raw_bytes_received(resp, n)
                    if expected is not None and expected.isdigit() and int(expected) != raw:
                        raise ProviderUnavailable("files.content", 1, f"download of {file_id} cut short: {n} of {expected} bytes")
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
            except (ConnectionError, TimeoutError) as exc:  # the socket, while the body streams
                raise ProviderUnavailable("files.content", 1, self._describe(exc)) from None

        return self._read("files.content", guarded)

    # --- batches -------------------------------------------------------------------------------

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str | None = None,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
    ) -> BatchInfo:
        """Create a batch, once. Raises ProviderRejected or OutcomeUnknown (then reconcile with
        :meth:`find_batches`; never re-send blindly).  ``endpoint`` None: the ``url`` of the
        file's request lines (:meth:`endpoint_of_file`), which the batch must name."""
        if endpoint is None:
            endpoint = self.endpoint_of_file(input_file_id)
        kwargs: dict[str, Any] = {"input_file_id": input_file_id, "endpoint": endpoint, "completion_window": completion_window}
        if metadata is not None:
            kwargs["metadata"] = dict(metadata)
        return _batch_info(self._once("batches.create", lambda: self._client.batches.create(**kwargs)))

    def endpoint_of_file(self, file_id: str) -> str:
        """The ``url`` of an uploaded file's request lines: remembered from :meth:`upload`, else
        (a file uploaded by an earlier process) read from the head of the file's content at the
        provider; :data:`DEFAULT_ENDPOINT` when the file cannot be read (a provider that refuses to
        send batch input back: its batches of chat lines, the only kind before the Responses API,
        are created as before)."""
        url = self._line_urls.get(file_id)
        if url is not None:
            return url

        def head() -> bytes:
            with self._reads.files.with_streaming_response.content(file_id) as resp:
                first = b""
                for chunk in resp.iter_bytes(1 << 16):
                    first += chunk
                    if b"\n" in first:
                        break
                return first.split(b"\n", 1)[0]

        try:
            url = _line_url(self._read("files.content", head))
        except ProviderRejected as exc:
            log.warning("could not read the request lines of %s (%s); creating its batch for %s", file_id, exc, DEFAULT_ENDPOINT)
            return DEFAULT_ENDPOINT
        url = url or DEFAULT_ENDPOINT
        self._line_urls[file_id] = url
        return url

    def complete(self, line: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
        """One request line through the synchronous API with exactly the body a batch would carry
        (``client.responses.create`` for a line whose ``url`` is the Responses API's,
        ``client.embeddings.create`` for an embeddings line, else
        ``client.chat.completions.create``), sent once (a 5xx or a lost reply is
        :class:`OutcomeUnknown`, a 4xx :class:`ProviderRejected`): the answer as a batch output
        line, for :func:`~batchgrader.pipeline.results.parse_line`."""
        import inspect

        create: Callable[..., Any]
        if line.get("url") == RESPONSES_URL:
            op, create = "responses.create", self._client.responses.create
        elif line.get("url") == EMBEDDINGS_URL:
            op, create = "embeddings.create", self._client.embeddings.create
        else:
            op, create = "chat.completions.create", self._client.chat.completions.create
        known = set(inspect.signature(create).parameters)
        kwargs = {k: v for k, v in line["body"].items() if k in known}
        extra = {k: v for k, v in line["body"].items() if k not in known}  # sent as they are, in the same body
        resp = self._once(op, lambda: create(**kwargs, extra_body=extra or None))
        out = resp.model_dump(mode="json", exclude_unset=True)
        return {"custom_id": line["custom_id"], "response": {"status_code": 200, "body": out}, "error": None}

    def retrieve(self, batch_id: str) -> BatchInfo:
        return _batch_info(self._read("batches.retrieve", lambda: self._reads.batches.retrieve(batch_id)))

    def cancel(self, batch_id: str) -> BatchInfo:
        """Ask for cancellation, once (idempotent on the API side: the engine asks again at its
        next tick, rather than holding every other job up with retries inside one).  A 409 — the
        batch is already completed/failed/expired — is a definite :class:`ProviderRejected`; a
        transient failure (408, 429, 5xx, no reply) is :class:`ProviderUnavailable`."""
        return _batch_info(
            self._read("batches.cancel", lambda: self._client.batches.cancel(batch_id), transient=frozenset({408, 429}))
        )

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage:
        """One page of batches, newest first (``limit`` 1–100)."""
        kwargs: dict[str, Any] = {"limit": limit}
        if after:
            kwargs["after"] = after
        self.on_page()
        page = self._read("batches.list", lambda: self._reads.batches.list(**kwargs))
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


def _line_url(raw: bytes) -> str | None:
    """The ``url`` of a JSONL request line (None: not a request line)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    url = obj.get("url") if isinstance(obj, dict) else None
    return url if isinstance(url, str) and url else None


def _attempts(request: httpx2.Request | None) -> int:
    """How many times the SDK sent the request that failed last (it numbers its retries in the
    ``x-stainless-retry-count`` header)."""
    raw = request.headers.get("x-stainless-retry-count", "0") if request is not None else "0"
    return int(raw) + 1 if raw.isdigit() else 1


def _raw_bytes_received(resp: Any, decoded: int) -> int:
    """Bytes received on the wire (before any Content-Encoding was undone): what Content-Length
    counts.  A compressing proxy can ignore ``Accept-Encoding: identity``."""
    http = getattr(resp, "http_response", None)
    n = getattr(http, "num_bytes_downloaded", None)
    return int(n) if isinstance(n, int) else decoded

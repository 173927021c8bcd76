"""The engine's :class:`~batchgrader.provider.openai_api.Provider` protocol on the Gemini Batch
API, through the official ``google-genai`` SDK (imported when the first Gemini provider is made,
not when ``bgctl`` starts).

* ``upload`` converts the chunk file into Gemini's JSONL input (``{"key", "request"}`` lines,
  :func:`~batchgrader.provider.gemini_api.to_gemini_line`), writes it next to the chunk, and
  uploads it once with the Files API (resumable upload); the converted file is then removed.  The file's ``display_name`` is the
  deterministic upload name plus ``|`` and the model (the create call needs the model, and the
  file is the only record that survives a restart).  ``find_files`` matches by that name alone:
  the uploaded file is the converted JSONL, so its size is not the chunk's.
* ``create_batch`` reads the model from the file, then creates the batch once
  (``models/{model}:batchGenerateContent``) with ``display_name`` = the chunk attempt's
  ``bg_key``.  The SDK is built without retries for writes: a connection error or a 5xx
  answer raises :class:`OutcomeUnknown`, and the engine reconciles.
* ``find_batches`` is that reconciliation: it lists the batches and matches ``display_name``
  against the wanted ``bg_key`` / ``bg_job`` (docs/providers.md, "Reconciling a Gemini
  create").  Gemini batches carry no input file in the listing, so the matched batch's input
  is the given file, or the file uploaded under the attempt's upload name.
* ``retrieve`` / ``cancel`` / ``list_batches`` give :class:`BatchInfo` in the job model's
  statuses (``JOB_STATE_*`` mapped by :data:`~batchgrader.provider.gemini_api.STATE_TO_STATUS`).
  The SDK does not expose the API's ``batchStats``, so ``request_counts`` stay 0 until the
  results are merged.  An ended batch's ``output_file_id`` is its responses file
  (``files/...``), or ``gemini-inline:<batch>`` for a batch created with inline requests;
  ``download`` writes either as OpenAI-shaped lines (atomically).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from batchgrader.core.host.secrets import mask_secret
from batchgrader.core.rules.decide import upload_name
from batchgrader.fsio import atomic_write_bytes
from batchgrader.provider.gemini_api import (
    FILE_KEPT_S,
    MAX_FILE_BYTES,
    GeminiBatch,
    batch_of,
    key_problem,
    model_of,
    parse_display_name,
    to_gemini_line,
    to_gemini_request,
    to_openai_result_line,
)
from batchgrader.provider.protocol import (
    READ_RETRIES,
    BatchInfo,
    BatchPage,
    FileInfo,
    FrozenMap,
    OutcomeUnknown,
    ProviderConfigError,
    ProviderRejected,
    ProviderUnavailable,
    RequestCounts,
    parse_retry_after,
)
from batchgrader.provider.tls import genai_client_args

T = TypeVar("T")
INLINE_PREFIX = "gemini-inline:"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
_SEP = "|"


def _transport_errors() -> tuple[type[BaseException], ...]:
    out: list[type[BaseException]] = [OSError]
    for mod in ("httpx", "httpx2"):
        try:
            out.append(__import__(mod).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(out)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in path.read_bytes().splitlines() if raw.strip()]


def _info(b: GeminiBatch, input_file_id: str = "") -> BatchInfo:
    status = b.status
    output = None
    if b.is_terminal:
        output = b.output_file or (INLINE_PREFIX + b.name if b.inlined else None)
    return BatchInfo(
        id=b.name,
        status=status,
        endpoint="/v1/chat/completions",
        input_file_id=input_file_id,
        completion_window="48h",
        created_at=b.created_at,
        model=b.model,
        output_file_id=output,
        request_counts=RequestCounts(),
        metadata=FrozenMap(parse_display_name(b.display_name)),
        completed_at=b.ended_at if status == "completed" else None,
        failed_at=b.ended_at if status == "failed" else None,
        cancelled_at=b.ended_at if status == "cancelled" else None,
        expired_at=b.ended_at if status == "expired" else None,
        expires_at=b.created_at + 48 * 3600 if b.created_at else None,
    )


def _file_info(f: Any) -> FileInfo:
    from batchgrader.provider.gemini_api import _ts

    shown = (f.display_name or "").split(_SEP)[0]
    state = f.state.value if hasattr(f.state, "value") else f.state
    return FileInfo(
        id=str(f.name),
        filename=shown,
        bytes=int(f.size_bytes or 0),
        purpose="batch",
        created_at=_ts(f.create_time) or 0,
        status=str(state) if state else None,
        expires_at=_ts(f.expiration_time),
    )


class GeminiBatchProvider:
    """:class:`Provider` for Gemini (see the module docstring)."""

    def __init__(
        self, api_key: str | None, base_url: str | None = None, *, timeout: float = 120.0, max_retries: int = READ_RETRIES
    ):
        if not api_key:
            raise ProviderConfigError(
                "no Gemini API key: set GEMINI_API_KEY (or GOOGLE_API_KEY) in the environment or secrets.env"
            )
        from google import genai
        from google.genai import errors, types

        self._errors = errors
        self._soft_errors: tuple[type[BaseException], ...] = (ValueError, KeyError, *_transport_errors())
        self._key = api_key
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        ms = int(timeout * 1000)
        # one SDK client (its HTTP clients and their TLS contexts built once), which never retries:
        # writes are sent once; each read asks for the SDK's retries of 408/429/5xx and connection
        # errors in its own config (``_read``), as often as the other SDKs and with their backoff
        # (0.5 s doubling to 8 s; docs/providers.md)
        # its TLS contexts: the SDK's own, built once per process (provider/tls.py)
        client_args, async_client_args = genai_client_args()
        options = types.HttpOptions(
            base_url=self.base_url, timeout=ms, client_args=client_args, async_client_args=async_client_args
        )
        self._client = genai.Client(api_key=api_key, http_options=options)
        retry = types.HttpRetryOptions(attempts=max_retries + 1, initial_delay=0.5, max_delay=8.0, jitter=0.25)
        self._retried = types.HttpOptions(retry_options=retry)
        self._inputs: dict[str, str] = {}  # batch name -> input file (this process only)
        self._models: dict[str, str] = {}  # input file -> model (this process only)

    def __repr__(self) -> str:
        return f"GeminiBatchProvider(api_key={mask_secret(self._key)!r})"

    def __reduce__(self) -> Any:  # never pickle a live client with its key
        raise TypeError("GeminiBatchProvider holds an API key and cannot be pickled")

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, mask_secret(self._key) or "***") if self._key else text

    def _read(self, **config: Any) -> Any:  # each call's own *Config dict
        """A read's request config: ``config`` with the SDK's retries (the client's own options
        otherwise: base URL, timeout, key)."""
        return {**config, "http_options": self._retried}

    def _call(self, op: str, fn: Callable[[], T], *, idempotent: bool = True) -> T:
        try:
            return fn()
        except self._errors.APIError as e:
            code = int(e.code or 500)
            message = self._scrub(str(e.message or e))
            headers = getattr(getattr(e, "response", None), "headers", None)
            retry_after = parse_retry_after(headers) if headers is not None else None  # a 429's wait
            if code >= 500 or code == 408 or (code == 429 and idempotent):  # a read asked to wait: transient
                if not idempotent:
                    raise OutcomeUnknown(op, f"HTTP {code}: {message}", status_code=code) from None
                raise ProviderUnavailable(op, 1, f"HTTP {code}: {message}", status_code=code, retry_after=retry_after) from None
            raise ProviderRejected(op, code, message, type=e.status, code=e.status, retry_after=retry_after) from None
        except self._soft_errors as e:  # transport errors; UnknownApiResponseError is a ValueError
            cause = self._scrub(f"{type(e).__name__}: {e}")
            if not idempotent:
                raise OutcomeUnknown(op, cause) from None
            raise ProviderUnavailable(op, 1, cause) from None

    # --- files -------------------------------------------------------------------------------

    def upload(self, path: str | os.PathLike[str], filename: str) -> FileInfo:
        src = Path(path)
        lines = _lines(src)
        problem = None if lines else f"{filename}: no requests"
        models = {model_of(line) for line in lines}
        if len(models) > 1:
            problem = f"{filename}: a Gemini batch runs one model, this chunk names {sorted(models)}"
        for line in lines:
            if problem is None and key_problem(str(line.get("custom_id") or "")):
                problem = f"{key_problem(str(line.get('custom_id') or ''))}; choose an id_column whose values fit, or leave id_column unset"
        data = b"".join(json.dumps(to_gemini_line(line), ensure_ascii=False).encode("utf-8") + b"\n" for line in lines)
        if problem is None and len(data) > MAX_FILE_BYTES:
            problem = f"{filename}: a Gemini batch input file holds at most 2 GB; this chunk is {len(data):,} bytes"
        if problem:
            raise ProviderRejected("stage requests", 400, problem, type="INVALID_ARGUMENT")
        staged = src.with_name(src.name + ".gemini.jsonl")
        atomic_write_bytes(staged, data)
        model = models.pop()
        config = {"display_name": f"{filename}{_SEP}{model}", "mime_type": "jsonl"}
        try:
            f = self._call("files.upload", lambda: self._client.files.upload(file=staged, config=config), idempotent=False)  # type: ignore[arg-type]
        finally:
            staged.unlink(missing_ok=True)  # only the upload needs it; it is written again for another
        self._models[str(f.name)] = model
        return _file_info(f)

    def _files(self) -> Iterator[Any]:
        pager = self._call("files.list", lambda: self._client.files.list(config=self._read(page_size=100)))
        while True:
            yield from pager.page
            if not pager.config.get("page_token"):
                return
            pager = self._call("files.list", lambda: self._client.files.list(config=dict(pager.config)))  # type: ignore[arg-type]  # noqa: B023

    def find_files(self, filename: str, size: int | None = None, created_after: int | None = None) -> list[FileInfo]:
        out = [
            _file_info(f)
            for f in self._files()
            if (f.display_name or "").split(_SEP)[0] == filename
            and (created_after is None or _file_info(f).created_at >= created_after)
        ]
        out.sort(key=lambda f: (f.created_at, f.id))
        return out

    def delete_file(self, file_id: str) -> bool:
        if file_id.startswith(INLINE_PREFIX):
            return True  # inline responses live in the batch: nothing to delete
        try:
            self._call("files.delete", lambda: self._client.files.delete(name=file_id, config=self._read()))
        except ProviderRejected as exc:
            if exc.status_code in (403, 404):  # Google answers 403 for a file that does not exist (any more)
                return False
            raise
        return True

    def _model_of_file(self, file_id: str) -> str:
        model = self._models.get(file_id)
        if model is None:
            f = self._call("files.get", lambda: self._client.files.get(name=file_id, config=self._read()))
            shown = f.display_name or ""
            if _SEP not in shown:
                raise ProviderRejected("create batch", 400, f"{file_id} was not uploaded by bgctl (no model in its name)")
            model = self._models[file_id] = shown.split(_SEP, 1)[1]
        return model

    # --- batches -----------------------------------------------------------------------------

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str | None = None,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
    ) -> BatchInfo:
        model = self._model_of_file(input_file_id)
        display = (metadata or {}).get("bg_key") or input_file_id
        obj = self._call(
            "batches.create",
            lambda: self._client.batches.create(model=model, src=input_file_id, config={"display_name": display}),
            idempotent=False,
        )
        b = batch_of(obj)
        self._inputs[b.name] = input_file_id
        return _info(b, input_file_id)

    def _batches(self, page_size: int = 100) -> Iterator[GeminiBatch]:
        pager = self._call("batches.list", lambda: self._client.batches.list(config=self._read(page_size=page_size)))
        while True:
            for obj in pager.page:
                yield batch_of(obj)
            if not pager.config.get("page_token"):
                return
            pager = self._call("batches.list", lambda: self._client.batches.list(config=dict(pager.config)))  # type: ignore[arg-type]  # noqa: B023

    def find_batches(
        self, input_file_id: str | None = None, metadata: Mapping[str, str] | None = None, created_after: int | None = None
    ) -> list[BatchInfo]:
        """Our batches whose ``display_name`` (the ``bg_key``) carries every ``metadata`` pair,
        created since ``created_after``; oldest first.  Without metadata nothing can be ours."""
        if not metadata:
            return []
        uploads: dict[str, list[FileInfo]] | None = None
        found: list[BatchInfo] = []
        for b in self._batches():
            meta = parse_display_name(b.display_name)
            if not meta or any(meta.get(k) != v for k, v in metadata.items()):
                continue
            if created_after is not None and b.created_at < created_after:
                continue
            source = input_file_id or self._inputs.get(b.name)
            if source is None:  # recovery: the file uploaded under the attempt's upload name
                if uploads is None:
                    uploads = {}
                    for f in self._files():
                        fi = _file_info(f)
                        uploads.setdefault(fi.filename, []).append(fi)
                name = upload_name(meta["bg_job"], int(meta["bg_chunk"]), int(meta["bg_attempt"]))
                files = sorted(uploads.get(name, []), key=lambda f: (f.created_at, f.id))
                source = files[0].id if files else ""
            found.append(_info(b, source))
        found.sort(key=lambda b: (b.created_at, b.id))
        return found

    def complete(self, line: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
        """One request line through the synchronous API (``client.models.generate_content``, sent
        once) with the request a batch would carry: the answer as an OpenAI batch output line (a
        blocked prompt: the ``refused`` error line a batch gives)."""
        from google.genai import types

        request = to_gemini_request(line["body"])
        config = dict(request.get("generationConfig") or {})
        if request.get("systemInstruction"):
            config["systemInstruction"] = request["systemInstruction"]
        model = str(line["body"]["model"])
        resp = self._call(
            "models.generate_content",
            lambda: self._client.models.generate_content(
                model=model,
                contents=request["contents"],
                config=types.GenerateContentConfig.model_validate(config),
            ),
            idempotent=False,
        )
        data = resp.model_dump(mode="json", by_alias=True, exclude_none=True)
        return to_openai_result_line({"key": line["custom_id"], "response": data})

    def retrieve(self, batch_id: str) -> BatchInfo:
        b = batch_of(self._call("batches.get", lambda: self._client.batches.get(name=batch_id, config=self._read())))
        return _info(b, self._inputs.get(batch_id, ""))

    def cancel(self, batch_id: str) -> BatchInfo:
        info = self.retrieve(batch_id)
        if info.is_terminal:
            raise ProviderRejected("batches.cancel", 400, f"batch {batch_id} has already ended ({info.status})")
        self._call("batches.cancel", lambda: self._client.batches.cancel(name=batch_id))
        return self.retrieve(batch_id)

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage:
        config: dict[str, Any] = {"page_size": max(1, min(limit, 100))}
        if after:
            config["page_token"] = after
        pager = self._call("batches.list", lambda: self._client.batches.list(config=self._read(**config)))
        items = tuple(_info(b, self._inputs.get(b.name, "")) for b in (batch_of(o) for o in pager.page))
        token = pager.config.get("page_token")
        return BatchPage(items, bool(token), token or None)

    # --- results -----------------------------------------------------------------------------

    def result_lines(self, file_id: str) -> Iterator[dict[str, Any]]:
        """An ended batch's results as OpenAI-shaped lines."""
        if file_id.startswith(INLINE_PREFIX):
            obj = self._call(
                "batches.get", lambda: self._client.batches.get(name=file_id[len(INLINE_PREFIX) :], config=self._read())
            )
            for i, r in enumerate((obj.dest.inlined_responses if obj.dest else None) or []):
                raw = r.model_dump(mode="json", by_alias=True, exclude_none=True)
                key = (r.metadata or {}).get("key") or str(i)
                item = (
                    {"key": key, "response": _camel(raw.get("response") or {})}
                    if r.response
                    else {"key": key, "error": raw.get("error") or {}}
                )
                yield to_openai_result_line(item)
            return
        data: bytes = self._call("files.download", lambda: self._client.files.download(file=file_id, config=self._read()))
        for text in data.splitlines():
            if text.strip():
                yield to_openai_result_line(json.loads(text))

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int:
        data = b"".join(json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n" for line in self.result_lines(file_id))
        atomic_write_bytes(Path(dest_path), data)
        return len(data)

    def count_tokens(self, model: str, line: Mapping[str, Any]) -> int:
        """Input tokens of one request from the free ``models.countTokens`` endpoint, counted as
        the batch will send it: the line's whole ``GenerateContentRequest`` (system instruction
        and generation config included) goes in the API's ``generateContentRequest`` field.

        The SDK's ``count_tokens`` has no such field and, on the Gemini Developer API, refuses
        ``CountTokensConfig(system_instruction=..., generation_config=...)`` before sending
        (google-genai 3.4.0 ``_CountTokensConfig_to_mldev``); the request body is therefore
        given through the SDK's documented ``HttpOptions.extra_body`` (merged into the JSON
        body as it is).  The SDK also requires ``contents``: the same contents go at the top
        level, which the API ignores when ``generateContentRequest`` is set
        (https://ai.google.dev/api/tokens, docs/providers.md "Exact token counts")."""
        from google.genai import types

        request = to_gemini_line({"custom_id": "count", "body": line["body"]})["request"]
        full = {"model": f"models/{model.removeprefix('models/')}", **request}
        config = types.CountTokensConfig(
            http_options=types.HttpOptions(extra_body={"generateContentRequest": full}, retry_options=self._retried.retry_options)
        )
        res = self._call(
            "models.count_tokens",
            lambda: self._client.models.count_tokens(model=model, contents=request["contents"], config=config),
        )
        return int(res.total_tokens or 0)

    def count_contents_tokens(self, model: str, line: Mapping[str, Any]) -> int:
        """The tokens of the line's ``contents`` alone (the SDK's plain ``count_tokens``): what the
        endpoint would answer if it ignored ``generateContentRequest``."""
        request = to_gemini_line({"custom_id": "count", "body": line["body"]})["request"]
        res = self._call(
            "models.count_tokens",
            lambda: self._client.models.count_tokens(model=model, contents=request["contents"], config=self._read()),
        )
        return int(res.total_tokens or 0)


class GeminiTokenCounter:
    """The counting hook's ``TokenCounter`` capability for Gemini (``name`` and
    ``count_tokens(lines) -> list[int]``, the protocol of ``provider/counting.py``): the exact
    input tokens of each OpenAI-shaped batch line from the free ``models.countTokens`` endpoint
    (the whole request, :meth:`GeminiBatchProvider.count_tokens`), one call per line,
    ``workers`` at a time.  The hook caches the counts.

    Before its first count of a request with a system prompt it checks once that the endpoint
    honoured ``generateContentRequest``: the full request must count more tokens than its
    ``contents`` alone.  An endpoint that ignored it would give counts without the system
    prompt; the check turns that into a :class:`ProviderRejected`, so the counts stay labelled
    estimates instead of being called exact."""

    def __init__(self, provider: GeminiBatchProvider, name: str = "gemini", workers: int = 8):
        self.provider = provider
        self.name = name
        self.workers = max(1, workers)
        self._checked = False

    def __repr__(self) -> str:
        return f"GeminiTokenCounter({self.name!r}, {self.provider!r})"

    def _check(self, lines: Sequence[Mapping[str, Any]], counts: list[int]) -> None:
        for line, n in zip(lines, counts, strict=True):
            if any(m.get("role") in ("system", "developer") for m in line["body"].get("messages") or []):
                alone = self.provider.count_contents_tokens(model_of(line), line)
                if n <= alone:
                    raise ProviderRejected(
                        "models.count_tokens",
                        400,
                        f"the counting endpoint ignored generateContentRequest ({n} tokens with the system prompt, "
                        f"{alone} without): its counts would leave the system prompt out",
                        type="FAILED_PRECONDITION",
                    )
                self._checked = True
                return

    def count_tokens(self, lines: Sequence[Mapping[str, Any]]) -> list[int]:
        from concurrent.futures import ThreadPoolExecutor

        def one(line: Mapping[str, Any]) -> int:
            return self.provider.count_tokens(model_of(line), line)

        if len(lines) <= 1 or self.workers == 1:
            counts = [one(line) for line in lines]
        else:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(lines))) as pool:
                counts = list(pool.map(one, lines))
        if not self._checked:
            self._check(lines, counts)
        return counts


def gemini_counter(settings: Any) -> GeminiTokenCounter | None:
    """The Gemini counting hook of a profile's settings; None without a key (counts stay estimates)."""
    key = settings.get("gemini_api_key")
    if not key:
        return None
    timeout = float(settings.get("request_timeout_seconds") or 120.0)
    return GeminiTokenCounter(GeminiBatchProvider(key, settings.get("gemini_base_url"), timeout=timeout))


def _camel(obj: Any) -> Any:
    """SDK snake_case JSON -> the REST API's camelCase (for inline responses)."""
    if isinstance(obj, dict):
        return {_camel_key(k): _camel(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_camel(v) for v in obj]
    return obj


def _camel_key(k: str) -> str:
    head, *rest = k.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


__all__ = ["FILE_KEPT_S", "INLINE_PREFIX", "GeminiBatchProvider", "GeminiTokenCounter", "gemini_counter"]

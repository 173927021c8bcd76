"""HTTP: routes, request parsing, fault application and the OpenAI wire format."""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import time
import uuid
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from batchgrader.emulator.anthropic import AnthropicApiError, anthropic_error_type
from batchgrader.emulator.common import ApiError, _error_body, _mask_presented_key, _server_error_body
from batchgrader.emulator.config import TERMINAL_STATUSES
from batchgrader.emulator.faults import Fault
from batchgrader.emulator.gemini import GeminiApiError, gemini_error_body
from batchgrader.emulator.upload import BodyReader, FileBody, Part, receive_multipart, receive_to_file

if TYPE_CHECKING:
    from batchgrader.emulator.server import Emulator

log = logging.getLogger(__name__)


_ROUTES: list[tuple[str, re.Pattern[str], str, str]] = [
    ("POST", re.compile(r"^/v1/files$"), "/v1/files", "create_file"),
    ("GET", re.compile(r"^/v1/files$"), "/v1/files", "list_files"),
    ("GET", re.compile(r"^/v1/files/(?P<id>[^/]+)$"), "/v1/files/{id}", "retrieve_file"),
    ("DELETE", re.compile(r"^/v1/files/(?P<id>[^/]+)$"), "/v1/files/{id}", "delete_file"),
    ("GET", re.compile(r"^/v1/files/(?P<id>[^/]+)/content$"), "/v1/files/{id}/content", "file_content"),
    ("POST", re.compile(r"^/v1/batches$"), "/v1/batches", "create_batch"),
    ("POST", re.compile(r"^/v1/chat/completions$"), "/v1/chat/completions", "chat_completion"),
    (
        "POST",
        re.compile(r"^/v1/deployments/(?P<id>[^/]+)/chat/completions$"),
        "/v1/deployments/{id}/chat/completions",
        "chat_completion",
    ),
    ("GET", re.compile(r"^/v1/batches$"), "/v1/batches", "list_batches"),
    ("GET", re.compile(r"^/v1/batches/(?P<id>[^/]+)$"), "/v1/batches/{id}", "retrieve_batch"),
    ("POST", re.compile(r"^/v1/batches/(?P<id>[^/]+)/cancel$"), "/v1/batches/{id}/cancel", "cancel_batch"),
    # Anthropic Message Batches (see anthropic.py)
    ("POST", re.compile(r"^/v1/messages/batches$"), "/v1/messages/batches", "msg_create_batch"),
    ("POST", re.compile(r"^/v1/messages$"), "/v1/messages", "msg_message"),
    ("GET", re.compile(r"^/v1/messages/batches$"), "/v1/messages/batches", "msg_list"),
    ("GET", re.compile(r"^/v1/messages/batches/(?P<id>[^/]+)$"), "/v1/messages/batches/{id}", "msg_retrieve"),
    ("DELETE", re.compile(r"^/v1/messages/batches/(?P<id>[^/]+)$"), "/v1/messages/batches/{id}", "msg_delete"),
    ("POST", re.compile(r"^/v1/messages/batches/(?P<id>[^/]+)/cancel$"), "/v1/messages/batches/{id}/cancel", "msg_cancel"),
    ("GET", re.compile(r"^/v1/messages/batches/(?P<id>[^/]+)/results$"), "/v1/messages/batches/{id}/results", "msg_results"),
    ("POST", re.compile(r"^/v1/messages/count_tokens$"), "/v1/messages/count_tokens", "msg_count_tokens"),
    # Gemini Batch API and Files API (see gemini.py)
    ("POST", re.compile(r"^/upload/v1beta/files$"), "/upload/v1beta/files", "gem_upload"),
    ("GET", re.compile(r"^/v1beta/files$"), "/v1beta/files", "gem_list_files"),
    ("GET", re.compile(r"^/v1beta/files/(?P<id>[^/:]+)$"), "/v1beta/files/{id}", "gem_get_file"),
    ("DELETE", re.compile(r"^/v1beta/files/(?P<id>[^/:]+)$"), "/v1beta/files/{id}", "gem_delete_file"),
    ("GET", re.compile(r"^/v1beta/files/(?P<id>[^/:]+):download$"), "/v1beta/files/{id}:download", "gem_download"),
    (
        "POST",
        re.compile(r"^/v1beta/models/(?P<id>[^/:]+):batchGenerateContent$"),
        "/v1beta/models/{model}:batchGenerateContent",
        "gem_create_batch",
    ),
    (
        "POST",
        re.compile(r"^/v1beta/models/(?P<id>[^/:]+):generateContent$"),
        "/v1beta/models/{model}:generateContent",
        "gem_generate",
    ),
    (
        "POST",
        re.compile(r"^/v1beta/models/(?P<id>[^/:]+):countTokens$"),
        "/v1beta/models/{model}:countTokens",
        "gem_count_tokens",
    ),
    ("GET", re.compile(r"^/v1beta/batches$"), "/v1beta/batches", "gem_list_batches"),
    ("GET", re.compile(r"^/v1beta/batches/(?P<id>[^/:]+)$"), "/v1beta/batches/{id}", "gem_get_batch"),
    ("DELETE", re.compile(r"^/v1beta/batches/(?P<id>[^/:]+)$"), "/v1beta/batches/{id}", "gem_delete_batch"),
    ("POST", re.compile(r"^/v1beta/batches/(?P<id>[^/:]+):cancel$"), "/v1beta/batches/{id}:cancel", "gem_cancel_batch"),
]


#: Azure OpenAI serves the same Files and Batches routes under ``/openai/`` (``?api-version=``)
AZURE_PREFIX = "/openai/"
#: api-versions the emulator's Azure routes accept (data-plane authoring releases with batch)
AZURE_API_VERSIONS = frozenset(
    {"2024-07-01-preview", "2024-08-01-preview", "2024-10-01-preview", "2024-10-21", "2025-03-01-preview", "2025-04-01-preview"}
)


def _azure_body(status: int, message: str, code: str | None = None, param: str | None = None, type_: str | None = None) -> dict:
    """Azure's error body: ``{"error": {"code", "message"}}`` (``param``/``type`` when Azure passes OpenAI's on)."""
    err: dict[str, Any] = {"code": code or str(status), "message": message}
    if param is not None:
        err["param"] = param
    if type_ is not None:
        err["type"] = type_
    return {"error": err}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "BatchgraderEmulator/1.0"
    timeout = 60
    emulator: Emulator  # set on the subclass made per server
    _azure_route = False  # whether the request being handled came through Azure OpenAI's routes
    _form: dict[str, Part] | None = None  # a multipart body's parts, files on disk (see _receive)
    _form_error: ApiError | None = None
    _spooled: Path | None = None  # a raw body written to disk (see _receive)

    # --- plumbing --------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("emulator: " + format, *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _receive(self, method: str, path: str, query: Mapping[str, str]) -> bytes:
        """The request's body.  An upload is not held in memory: a ``multipart/form-data`` body
        (``POST /v1/files``) is parsed as it arrives, each file part written to a file of its own
        (``self._form``), and a Gemini upload chunk is written to a file (``self._spooled``);
        the body returned is then empty.  The files are removed when the request ends unless
        the store moved them into place."""
        chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
        reader = BodyReader(self.rfile, None if chunked else int(self.headers.get("Content-Length") or 0))
        ctype = self.headers.get("Content-Type", "")
        folder = self.emulator.store._blob_dir("files")
        if method == "POST" and "multipart/form-data" in ctype and "boundary=" in ctype:
            try:
                self._form = receive_multipart(reader, ctype, folder)
            except ApiError as e:
                self._form_error = e
                reader.drain()
            return b""
        if method == "POST" and path.startswith("/upload/") and query.get("upload_id"):
            self._spooled = receive_to_file(reader, folder)
            return b""
        return reader.read_all()

    def _received_files(self) -> list[Path]:
        files = [v for _fn, v in (self._form or {}).values() if isinstance(v, Path)]
        return files + ([self._spooled] if self._spooled is not None else [])

    def _headers_common(self, request_id: str) -> None:
        self.send_header("x-request-id", request_id)
        self.send_header("request-id", request_id)
        self.send_header("openai-organization", self.emulator.config.organization)
        self.send_header("openai-processing-ms", "1")
        self.send_header("x-emulator", "simulated")
        self.send_header("Connection", "close")

    def _send_bytes(
        self, status: int, data: bytes, content_type: str, extra: Mapping[str, str] | None = None, *, truncate: bool = False
    ) -> None:
        try:
            self._send_head(status, len(data), content_type, extra)
            if truncate:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self._drop()
                return
            view = memoryview(data)
            for i in range(0, len(data), 1 << 16):
                self.wfile.write(view[i : i + (1 << 16)])
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def _send_file(self, status: int, body: FileBody) -> None:
        """A file's content sent as it is read, a block at a time."""
        with body.fh:
            self._send_head(status, body.size, "application/octet-stream")
            try:
                while block := body.fh.read(1 << 16):
                    self.wfile.write(block)
            except (BrokenPipeError, ConnectionResetError):
                pass
        self.close_connection = True

    def _send_head(self, status: int, length: int, content_type: str, extra: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self._headers_common("req_" + uuid.uuid4().hex)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def _send_content(self, status: int, data: bytes, *, truncate: bool = False) -> None:
        """A file's content; gzip-compressed (with the compressed Content-Length) under ``gzip_content``."""
        if self.emulator.config.gzip_content and status == 200:
            import gzip

            self._send_bytes(status, gzip.compress(data), "application/octet-stream", {"Content-Encoding": "gzip"})
            return
        self._send_bytes(status, data, "application/octet-stream", truncate=truncate)

    def _send_json(self, status: int, obj: Any, extra: Mapping[str, str] | None = None, *, truncate: bool = False) -> None:
        self._send_bytes(status, json.dumps(obj).encode("utf-8"), "application/json", extra, truncate=truncate)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # --- dispatch --------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._form, self._form_error, self._spooled = None, None, None
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        try:
            body = self._receive(method, path, query)
        except (OSError, ValueError):
            self.close_connection = True
            for f in self._received_files():
                f.unlink(missing_ok=True)
            return
        try:
            self._handle(method, path, query, body)
        finally:
            for f in self._received_files():  # not moved into place by the store
                f.unlink(missing_ok=True)

    def _handle(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        emu = self.emulator
        if path.startswith("/_emulator"):
            self._admin(method, path, query, body)
            return
        # Gemini: the SDK may use API version v1 or v1beta; a Google key marks its /v1 calls
        gemini = path.startswith(("/v1beta/", "/upload/")) or (path.startswith("/v1/") and "x-goog-api-key" in self.headers)
        if gemini:
            path = re.sub(r"^(/upload)?/v1/", r"\1/v1beta/", path)
        route = None
        params: dict[str, str] = {}
        action = None
        azure = path.startswith(AZURE_PREFIX) and not path.startswith("/openai/v1/messages")
        self._azure_route = azure
        match_path = "/v1/" + path[len(AZURE_PREFIX) :] if azure else path
        for m, rx, template, name in _ROUTES:
            mt = rx.match(match_path)
            if mt and m == method and not (azure and name.startswith("msg_")):
                route, params, action = template, mt.groupdict(), name
                if azure:
                    route = AZURE_PREFIX + template[len("/v1/") :]
                break
        anthropic = path.startswith("/v1/messages")
        store = emu.store
        store.count_request(method, route or path)
        self._hook(method, route or path, "received")
        faults = store.choose_faults(method, route or path, path)
        after: Fault | None = None
        for fault in faults:
            if fault.kind == "delay":
                emu._stopping.wait(fault.seconds)
            elif fault.kind == "drop_before":
                self._drop()
                return
            elif fault.kind == "status":
                extra = {}
                if fault.retry_after is not None:
                    extra["retry-after"] = str(max(0, math.ceil(fault.retry_after)))
                    extra["retry-after-ms"] = str(int(fault.retry_after * 1000))
                msg = fault.message or {
                    429: "Rate limit reached for requests (emulated). Please try again later.",
                    503: "The engine is currently overloaded, please try again later.",
                }.get(fault.status, "The server had an error while processing your request. Sorry about that!")
                etype = {429: "requests", 503: "server_error"}.get(
                    fault.status, "server_error" if fault.status >= 500 else "invalid_request_error"
                )
                code = {429: "rate_limit_exceeded"}.get(fault.status)
                if anthropic:
                    self._send_json(fault.status, _anthropic_body(fault.status, msg), extra)
                    return
                if gemini:
                    self._send_json(fault.status, gemini_error_body(fault.status, msg), extra)
                    return
                if azure:
                    self._send_json(fault.status, _azure_body(fault.status, msg, code), extra)
                    return
                self._send_json(fault.status, _error_body(msg, etype, None, code), extra)
                return
            else:
                after = fault
        err_headers: Mapping[str, str] | None = None
        try:
            if anthropic:
                self._check_anthropic_auth()
            elif gemini:
                if not (action == "gem_upload" and query.get("upload_id")):  # the session URL is the credential
                    self._check_gemini_auth()
            elif azure:
                self._check_azure(query)
            else:
                self._check_auth()
            if action is None:
                raise ApiError(404, f"Invalid URL ({method} {path})")
            if action.startswith("msg_"):
                result = self._call_anthropic(action, params, query, body)
            elif action.startswith("gem_"):
                result = self._call_gemini(action, params, query, body)
            else:
                result = self._call(action, params, query, body)
        except (AnthropicApiError, GeminiApiError) as e:
            result = (e.status, e.body())
            err_headers = getattr(e, "headers", None)  # a 429's Retry-After and rate-limit headers (sync.py)
        except ApiError as e:
            err_headers = getattr(e, "headers", None)
            if gemini:
                result = (e.status, gemini_error_body(e.status, e.message))
            elif azure:
                result = (e.status, _azure_body(e.status, e.message, e.code or e.type, e.param, e.type or None))
            else:
                result = (e.status, _anthropic_body(e.status, e.message) if anthropic else e.body())
        except Exception:  # pragma: no cover - a bug in the emulator; still answer like the API
            log.exception("emulator: unhandled error for %s %s", method, path)
            result = (500, _anthropic_body(500, "Internal server error") if anthropic else _server_error_body())
            if gemini:
                result = (500, gemini_error_body(500, "An internal error has occurred."))
        self._hook(method, route or path, "effected")
        if after is not None:
            if after.kind == "drop_after":
                self._drop()
                return
            if after.kind == "hang_after":
                emu._stopping.wait(after.seconds)
            if after.kind == "garbage":
                self._send_bytes(200, b'{"id": "trunc', "application/json")
                return
            if after.kind == "ended_reply" and result[0] == 200 and isinstance(result[1], dict):
                result = (200, _ended_reply(emu, str(result[1].get("id")), after.seconds or 10.0))
        status, payload = result[0], result[1]
        headers: Mapping[str, str] | None = result[2] if len(result) > 2 else err_headers  # type: ignore[misc]
        truncate = after is not None and after.kind == "truncate"
        if isinstance(payload, FileBody):
            if truncate or (after is not None and after.kind == "garble_line") or self.emulator.config.gzip_content:
                payload = payload.read_all()  # a fault or compression works on the bytes (small test files)
            else:
                self._send_file(status, payload)
                return
        if after is not None and after.kind == "garble_line" and isinstance(payload, bytes):
            payload = _garble_first_line(payload)
        if isinstance(payload, bytes):
            self._send_content(status, payload, truncate=truncate)
        else:
            self._send_json(status, payload, headers, truncate=truncate)

    def _hook(self, method: str, route: str, phase: str) -> None:
        hook = self.emulator.config.on_request
        if hook is None:
            return
        try:
            hook(method, route, phase)
        except Exception:  # a test hook must not take the server down
            log.exception("emulator: on_request hook failed")

    def _check_auth(self) -> None:
        auth = self.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not key:
            raise ApiError(
                401,
                "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        expected = self.emulator.config.api_key
        if expected is not None and key != expected:
            shown = key if self.emulator.config.leak_key_in_errors else _mask_presented_key(key)
            raise ApiError(
                401,
                f"Incorrect API key provided: {shown}. You can find your API key at https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            )

    def _check_azure(self, query: Mapping[str, str]) -> None:
        """Azure's checks, in Azure's order and words: the key (``api-key`` header), then the
        ``api-version`` query parameter."""
        key = self.headers.get("api-key", "").strip()
        if not key:
            raise ApiError(
                401,
                "Access denied due to missing subscription key. Make sure to include subscription key when making requests to an API.",
                code="401",
                type="",
            )
        expected = self.emulator.config.api_key
        if expected is not None and key != expected:
            raise ApiError(
                401,
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.",
                code="401",
                type="",
            )
        version = query.get("api-version")
        if not version:
            raise ApiError(404, "Resource not found", code="404", type="")
        if version not in AZURE_API_VERSIONS:
            raise ApiError(400, "API version not supported", code="BadRequest", type="")

    def _check_anthropic_auth(self) -> None:
        # the SDK sends the key as ``Authorization: Bearer`` (anthropic >= 2) or ``x-api-key``
        auth = self.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else self.headers.get("x-api-key", "").strip()
        if not key:
            raise AnthropicApiError(401, "x-api-key header is required", type="authentication_error")
        expected = self.emulator.config.api_key
        if expected is not None and key != expected:
            raise AnthropicApiError(401, "invalid x-api-key", type="authentication_error")

    def _check_gemini_auth(self) -> None:
        key = self.headers.get("x-goog-api-key", "").strip()
        if not key:
            raise GeminiApiError(403, "Method doesn't allow unregistered callers (callers without established identity).")
        expected = self.emulator.config.api_key
        if expected is not None and key != expected:
            raise GeminiApiError(400, "API key not valid. Please pass a valid API key.")

    def _call_gemini(self, action: str, params: dict[str, str], query: dict[str, str], body: bytes) -> tuple[Any, ...]:
        store = self.emulator.store
        if action == "gem_upload":
            if query.get("upload_id"):
                command = self.headers.get("X-Goog-Upload-Command", "")
                offset = int(self.headers.get("X-Goog-Upload-Offset") or 0)
                chunk = self._spooled if self._spooled is not None else body
                return (200, *store.gem_upload_chunk(query["upload_id"], command, offset, chunk))
            parsed = self._gemini_json(body)
            root = f"http://{self.headers.get('Host') or self.emulator.config.host}"
            return (200, *store.gem_upload_start(parsed, self.headers, root))
        if action == "gem_download":
            return 200, store.gem_download(params["id"])
        if action in ("gem_create_batch", "gem_count_tokens", "gem_generate"):
            parsed = self._gemini_json(body)
            if action == "gem_count_tokens":
                return 200, store.gem_count_tokens(parsed)
            if action == "gem_generate":
                return 200, store.generate_content(params["id"], parsed)
            return 200, store.gem_create_batch(params["id"], parsed)
        if action in ("gem_list_files", "gem_list_batches"):
            return 200, getattr(store, action)(query)
        return 200, getattr(store, action)(params["id"])

    @staticmethod
    def _gemini_json(body: bytes) -> Any:
        try:
            return json.loads(body or b"{}")
        except ValueError:
            raise GeminiApiError(400, "Invalid JSON payload received.") from None

    def _call_anthropic(self, action: str, params: dict[str, str], query: dict[str, str], body: bytes) -> tuple[int, Any]:
        store = self.emulator.store
        if action == "msg_results":
            return 200, store.msg_results(params["id"])
        if action in ("msg_create_batch", "msg_count_tokens", "msg_message"):
            try:
                parsed = json.loads(body or b"null")
            except ValueError:
                raise AnthropicApiError(400, "There was an issue with your request body: not valid JSON.") from None
            if action == "msg_count_tokens":
                return 200, store.msg_count_tokens(parsed)
            if action == "msg_message":
                return 200, store.message(parsed)
            out = store.msg_create_batch(parsed, len(body))
        elif action == "msg_list":
            out = store.msg_list(query)
        elif action == "msg_retrieve":
            out = store.msg_retrieve(params["id"])
        elif action == "msg_cancel":
            out = store.msg_cancel(params["id"])
        else:
            out = store.msg_delete(params["id"])
        root = f"http://{self.headers.get('Host') or self.emulator.config.host}"
        for obj in out.get("data", [out]):
            if isinstance(obj.get("results_url"), str) and obj["results_url"].startswith("/"):
                obj["results_url"] = root + obj["results_url"]  # absolute, as the real API gives it
        return 200, out

    def _call(self, action: str, params: dict[str, str], query: dict[str, str], body: bytes) -> tuple[int, Any]:
        store = self.emulator.store
        if action == "create_file":
            if self._form_error is not None:
                raise self._form_error
            if self._form is None:
                ctype = self.headers.get("Content-Type", "")
                if "multipart/form-data" in ctype:
                    raise ApiError(400, "Could not parse multipart form: missing boundary.")
                raise ApiError(400, "Expected a multipart/form-data request body.")
            form = self._form
            if "file" not in form:
                raise ApiError(400, "Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
            filename, data = form["file"]

            def field(name: str) -> str:
                value = form[name][1] if name in form else b""
                return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""

            purpose = field("purpose") or None
            expires_after = {}
            for k in ("anchor", "seconds"):
                if f"expires_after[{k}]" in form:
                    expires_after[k] = field(f"expires_after[{k}]")
            return 200, store.create_file(filename or "upload", data, purpose, expires_after, azure=self._azure_route)
        if action == "list_files":
            return 200, store.list_files(query)
        if action == "retrieve_file":
            return 200, store.retrieve_file(params["id"])
        if action == "delete_file":
            return 200, store.delete_file(params["id"])
        if action == "file_content":
            return 200, store.file_body(params["id"])
        if action in ("create_batch", "chat_completion"):
            try:
                parsed = json.loads(body or b"null")
            except ValueError:
                raise ApiError(
                    400,
                    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
                ) from None
            if action == "chat_completion":
                return 200, store.chat_completion(parsed, params.get("id"))
            return 200, store.create_batch(parsed, azure=self._azure_route)
        if action == "list_batches":
            return 200, store.list_batches(query)
        if action == "retrieve_batch":
            return 200, store.retrieve_batch(params["id"])
        if action == "cancel_batch":
            return 200, store.cancel_batch(params["id"])
        raise ApiError(404, f"Invalid URL ({action})")  # pragma: no cover

    def _admin(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        store = self.emulator.store
        try:
            payload = json.loads(body) if body else {}
            if method == "GET" and path == "/_emulator/stats":
                self._send_json(200, store.stats())
            elif method == "POST" and path == "/_emulator/faults":
                items = payload if isinstance(payload, list) else [payload]
                for item in items:
                    fault = Fault(
                        kind=item["kind"],
                        status=int(item.get("status", 500)),
                        retry_after=item.get("retry_after"),
                        seconds=float(item.get("seconds", 0.0)),
                        message=item.get("message"),
                    )
                    store.script_fault(item.get("method", "*"), item.get("path", "*"), fault, int(item.get("times", 1)))
                self._send_json(200, {"scripted": len(items)})
            elif method == "DELETE" and path == "/_emulator/faults":
                store.clear_faults()
                self._send_json(200, {"cleared": True})
            elif method == "POST" and (mt := re.match(r"^/_emulator/batches/([^/]+)/expire$", path)):
                completed = payload.get("completed") if isinstance(payload, dict) else None
                self._send_json(200, store.expire_batch(mt.group(1), completed))
            else:
                raise ApiError(404, f"Invalid URL ({method} {path})")
        except ApiError as e:
            self._send_json(e.status, e.body())
        except (ValueError, KeyError, TypeError) as e:
            self._send_json(400, _error_body(f"bad admin request: {e}", "invalid_request_error", None, None))


def _ended_reply(emu: Any, batch_id: str, within: float) -> dict[str, Any]:
    """The ``ended_reply`` fault: the batch once it has ended (or after ``within`` seconds), as a
    create reply would show it (without its result files)."""
    deadline = time.monotonic() + within
    view = emu.store.retrieve_batch(batch_id)
    while view["status"] not in TERMINAL_STATUSES and time.monotonic() < deadline:
        if emu._stopping.wait(0.02):
            break
        view = emu.store.retrieve_batch(batch_id)
    return {**view, "output_file_id": None, "error_file_id": None}


def _garble_first_line(data: bytes) -> bytes:
    """The ``garble_line`` fault: the first line of a file's content becomes invalid JSON."""
    first, sep, rest = data.partition(b"\n")
    return b'{"custom_id": "garbled' + sep + rest if first else data


def _anthropic_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}

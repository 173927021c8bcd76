"""HTTP: the request handler: bodies received to disk as they arrive, the route and dialect of
each call (``routes``, ``dialects``), faults applied before and after it, replies sent."""

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

from batchgrader.emulator.anthropic import AnthropicApiError
from batchgrader.emulator.common import ApiError, _error_body
from batchgrader.emulator.config import TERMINAL_STATUSES
from batchgrader.emulator.dialects import AZURE, AZURE_PREFIX, GEMINI, Dialect, dialect_of
from batchgrader.emulator.faults import Fault
from batchgrader.emulator.gemini import GeminiApiError
from batchgrader.emulator.routes import Call, Route, find_route
from batchgrader.emulator.upload import BodyReader, FileBody, Part, receive_multipart, receive_to_file

if TYPE_CHECKING:
    from batchgrader.emulator.server import Emulator

log = logging.getLogger(__name__)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "BatchgraderEmulator/1.0"
    timeout = 60
    emulator: Emulator  # set on the subclass made per server
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
        folder = self.emulator.store.state.blob_dir("files")
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
            if path.startswith("/_emulator"):
                self._admin(method, path, query, body)
            else:
                self._handle(method, path, query, body)
        finally:
            for f in self._received_files():  # not moved into place by the store
                f.unlink(missing_ok=True)

    def _handle(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        """One API call: counted, faulted (before, or after it took effect), answered."""
        dialect, path = dialect_of(path, self.headers)
        azure = dialect is AZURE
        route, params = find_route(method, "/v1/" + path[len(AZURE_PREFIX) :] if azure else path, azure)
        counted = path if route is None else (AZURE_PREFIX + route.template[len("/v1/") :] if azure else route.template)
        store = self.emulator.store
        store.count_request(method, counted)
        self._hook(method, counted, "received")
        faults = store.faults.choose_faults(method, counted, path)
        after: Fault | None = None
        for fault in faults:
            if fault.kind in ("delay", "drop_before", "status"):
                if self._fault_before(fault, dialect):
                    return
            else:
                after = fault
        call = Call(
            store, self.emulator.config, params, query, body, self.headers, azure, self._form, self._form_error, self._spooled
        )
        result = self._answer(method, path, dialect, route, call)
        self._hook(method, counted, "effected")
        reply = result if after is None else self._fault_after(after, result)
        if reply is not None:
            self._reply(reply, after)

    def _fault_before(self, fault: Fault, dialect: Dialect) -> bool:
        """A fault before the call: a delay (False: the call goes on), a dropped connection or
        an error status (True: answered)."""
        if fault.kind == "delay":
            self.emulator._stopping.wait(fault.seconds)
            return False
        if fault.kind == "drop_before":
            self._drop()
            return True
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
        self._send_json(fault.status, dialect.fault_body(fault.status, msg, etype, code), extra)
        return True

    def _answer(self, method: str, path: str, dialect: Dialect, route: Route | None, call: Call) -> tuple[Any, ...]:
        """The call's answer, ``(status, payload[, headers])``: the route's, or an error in the
        dialect's shape (with its headers: a 429's ``retry-after`` and rate-limit headers)."""
        try:
            if not (dialect is GEMINI and route is not None and route.name == "gem_upload" and call.query.get("upload_id")):
                dialect.check_auth(self.headers, call.query, call.config)  # (a Gemini upload's session URL is its credential)
            if route is None:
                raise ApiError(404, f"Invalid URL ({method} {path})")
            return route.answer(call)
        except ApiError as e:
            body = e.body() if isinstance(e, (AnthropicApiError, GeminiApiError)) else dialect.error_body(e)
            headers = getattr(e, "headers", None)
            return (e.status, body) if headers is None else (e.status, body, headers)
        except Exception:  # pragma: no cover - a bug in the emulator; still answer like the API
            log.exception("emulator: unhandled error for %s %s", method, path)
            return 500, dialect.crash_body()

    def _fault_after(self, after: Fault, result: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """A fault after the call took effect: the answer to send, or None when it is not sent."""
        if after.kind == "drop_after":
            self._drop()
            return None
        if after.kind == "hang_after":
            self.emulator._stopping.wait(after.seconds)
        if after.kind == "garbage":
            self._send_bytes(200, b'{"id": "trunc', "application/json")
            return None
        if after.kind == "ended_reply" and result[0] == 200 and isinstance(result[1], dict):
            return (200, _ended_reply(self.emulator, str(result[1].get("id")), after.seconds or 10.0))
        return result

    def _reply(self, result: tuple[Any, ...], after: Fault | None) -> None:
        status, payload = result[0], result[1]
        headers: Mapping[str, str] | None = result[2] if len(result) > 2 else None
        truncate = after is not None and after.kind == "truncate"
        garble = after is not None and after.kind == "garble_line"
        if isinstance(payload, FileBody):
            if truncate or garble or self.emulator.config.gzip_content:
                payload = payload.read_all()  # a fault or compression works on the bytes (small test files)
            else:
                self._send_file(status, payload)
                return
        if garble and isinstance(payload, bytes):
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
                    store.faults.script_fault(item.get("method", "*"), item.get("path", "*"), fault, int(item.get("times", 1)))
                self._send_json(200, {"scripted": len(items)})
            elif method == "DELETE" and path == "/_emulator/faults":
                store.faults.clear_faults()
                self._send_json(200, {"cleared": True})
            elif method == "POST" and (mt := re.match(r"^/_emulator/batches/([^/]+)/expire$", path)):
                completed = payload.get("completed") if isinstance(payload, dict) else None
                self._send_json(200, store.batches.expire_batch(mt.group(1), completed))
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
    view = emu.store.batches.retrieve_batch(batch_id)
    while view["status"] not in TERMINAL_STATUSES and time.monotonic() < deadline:
        if emu._stopping.wait(0.02):
            break
        view = emu.store.batches.retrieve_batch(batch_id)
    return {**view, "output_file_id": None, "error_file_id": None}


def _garble_first_line(data: bytes) -> bytes:
    """The ``garble_line`` fault: the first line of a file's content becomes invalid JSON."""
    first, sep, rest = data.partition(b"\n")
    return b'{"custom_id": "garbled' + sep + rest if first else data

"""The route table: each API route's method, path, template (as counted and faulted) and the
function that answers it from the store, one group per API (OpenAI and Azure, Anthropic, Gemini)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from batchgrader.emulator.anthropic import AnthropicApiError
from batchgrader.emulator.common import ApiError
from batchgrader.emulator.config import EmulatorConfig
from batchgrader.emulator.gemini import GeminiApiError
from batchgrader.emulator.store import Store
from batchgrader.emulator.upload import Part


@dataclass
class Call:
    """One API call as its route's function sees it."""

    store: Store
    config: EmulatorConfig
    params: dict[str, str]  # the path's parameters (``id``)
    query: dict[str, str]
    body: bytes
    headers: Message[str, str]
    azure: bool  # through Azure OpenAI's routes
    form: dict[str, Part] | None = None  # a multipart body's parts, files on disk
    form_error: ApiError | None = None
    spooled: Path | None = None  # a raw body written to disk (a Gemini upload chunk)

    @property
    def id(self) -> str:
        return self.params["id"]

    def root(self) -> str:
        """The server's root URL as the client reached it."""
        return f"http://{self.headers.get('Host') or self.config.host}"


#: A route's answer: (status, payload) or (status, payload, headers)
Answer = tuple[Any, ...]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    template: str  # the route as counted and matched by scripted faults
    api: str  # openai (and Azure), anthropic, gemini
    answer: Callable[[Call], Answer]
    name: str


# --- OpenAI and Azure ----------------------------------------------------------------------------


def _openai_json(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError:
        raise ApiError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
        ) from None


def _create_file(c: Call) -> Answer:
    if c.form_error is not None:
        raise c.form_error
    if c.form is None:
        if "multipart/form-data" in c.headers.get("Content-Type", ""):
            raise ApiError(400, "Could not parse multipart form: missing boundary.")
        raise ApiError(400, "Expected a multipart/form-data request body.")
    form = c.form
    if "file" not in form:
        raise ApiError(400, "Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
    filename, data = form["file"]

    def field(name: str) -> str:
        value = form[name][1] if name in form else b""
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""

    purpose = field("purpose") or None
    expires_after = {k: field(f"expires_after[{k}]") for k in ("anchor", "seconds") if f"expires_after[{k}]" in form}
    return 200, c.store.files.create_file(filename or "upload", data, purpose, expires_after, azure=c.azure)


def _chat_completion(c: Call) -> Answer:
    return 200, c.store.sync.chat_completion(_openai_json(c.body), c.params.get("id"))


def _response(c: Call) -> Answer:
    return 200, c.store.sync.response(_openai_json(c.body))


def _embeddings(c: Call) -> Answer:
    return 200, c.store.sync.embeddings(_openai_json(c.body))


def _create_batch(c: Call) -> Answer:
    return 200, c.store.batches.create_batch(_openai_json(c.body), azure=c.azure)


_OPENAI: list[tuple[str, str, str, Callable[[Call], Answer]]] = [
    ("POST", "/v1/files", "create_file", _create_file),
    ("GET", "/v1/files", "list_files", lambda c: (200, c.store.files.list_files(c.query))),
    ("GET", "/v1/files/{id}", "retrieve_file", lambda c: (200, c.store.files.retrieve_file(c.id))),
    ("DELETE", "/v1/files/{id}", "delete_file", lambda c: (200, c.store.files.delete_file(c.id))),
    ("GET", "/v1/files/{id}/content", "file_content", lambda c: (200, c.store.files.file_body(c.id))),
    ("POST", "/v1/batches", "create_batch", _create_batch),
    ("POST", "/v1/chat/completions", "chat_completion", _chat_completion),
    ("POST", "/v1/responses", "response", _response),
    ("POST", "/v1/embeddings", "embeddings", _embeddings),
    ("POST", "/v1/deployments/{id}/chat/completions", "chat_completion", _chat_completion),
    ("GET", "/v1/batches", "list_batches", lambda c: (200, c.store.batches.list_batches(c.query))),
    ("GET", "/v1/batches/{id}", "retrieve_batch", lambda c: (200, c.store.batches.retrieve_batch(c.id))),
    ("POST", "/v1/batches/{id}/cancel", "cancel_batch", lambda c: (200, c.store.batches.cancel_batch(c.id))),
]


# --- Anthropic (see anthropic.py) ----------------------------------------------------------------


def _anthropic_json(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError:
        raise AnthropicApiError(400, "There was an issue with your request body: not valid JSON.") from None


def _batches_answer(c: Call, out: dict[str, Any]) -> Answer:
    """Message batch objects with their ``results_url`` absolute, as the real API gives it."""
    root = c.root()
    for obj in out.get("data", [out]):
        if isinstance(obj.get("results_url"), str) and obj["results_url"].startswith("/"):
            obj["results_url"] = root + obj["results_url"]
    return 200, out


_ANTHROPIC: list[tuple[str, str, str, Callable[[Call], Answer]]] = [
    (
        "POST",
        "/v1/messages/batches",
        "msg_create_batch",
        lambda c: _batches_answer(
            c, c.store.anthropic.create_batch(_anthropic_json(c.body), len(c.body), c.headers.get("anthropic-version"))
        ),
    ),
    (
        "POST",
        "/v1/messages",
        "msg_message",
        lambda c: (200, c.store.sync.message(_anthropic_json(c.body), c.headers.get("anthropic-version"))),
    ),
    ("GET", "/v1/messages/batches", "msg_list", lambda c: _batches_answer(c, c.store.anthropic.list_batches(c.query))),
    ("GET", "/v1/messages/batches/{id}", "msg_retrieve", lambda c: _batches_answer(c, c.store.anthropic.retrieve_batch(c.id))),
    ("DELETE", "/v1/messages/batches/{id}", "msg_delete", lambda c: _batches_answer(c, c.store.anthropic.delete_batch(c.id))),
    (
        "POST",
        "/v1/messages/batches/{id}/cancel",
        "msg_cancel",
        lambda c: _batches_answer(c, c.store.anthropic.cancel_batch(c.id)),
    ),
    ("GET", "/v1/messages/batches/{id}/results", "msg_results", lambda c: (200, c.store.anthropic.results(c.id))),
    (
        "POST",
        "/v1/messages/count_tokens",
        "msg_count_tokens",
        lambda c: (200, c.store.anthropic.count_tokens(_anthropic_json(c.body))),
    ),
]


# --- Gemini (see gemini.py, gemini_batches.py) ---------------------------------------------------


def _gemini_json(body: bytes) -> Any:
    try:
        return json.loads(body or b"{}")
    except ValueError:
        raise GeminiApiError(400, "Invalid JSON payload received.") from None


def _gem_upload(c: Call) -> Answer:
    """A resumable upload: its start, or a chunk of it (to the session URL, ``upload_id``)."""
    files = c.store.gemini_files
    if c.query.get("upload_id"):
        command = c.headers.get("X-Goog-Upload-Command", "")
        offset = int(c.headers.get("X-Goog-Upload-Offset") or 0)
        chunk = c.spooled if c.spooled is not None else c.body
        return (200, *files.upload_chunk(c.query["upload_id"], command, offset, chunk))
    return (200, *files.upload_start(_gemini_json(c.body), c.headers, c.root()))


_GEMINI: list[tuple[str, str, str, Callable[[Call], Answer]]] = [
    ("POST", "/upload/v1beta/files", "gem_upload", _gem_upload),
    ("GET", "/v1beta/files", "gem_list_files", lambda c: (200, c.store.gemini_files.list_files(c.query))),
    ("GET", "/v1beta/files/{id}", "gem_get_file", lambda c: (200, c.store.gemini_files.get_file(c.id))),
    ("DELETE", "/v1beta/files/{id}", "gem_delete_file", lambda c: (200, c.store.gemini_files.delete_file(c.id))),
    ("GET", "/v1beta/files/{id}:download", "gem_download", lambda c: (200, c.store.gemini_files.download(c.id))),
    (
        "POST",
        "/v1beta/models/{model}:batchGenerateContent",
        "gem_create_batch",
        lambda c: (200, c.store.gemini_batches.create_batch(c.id, _gemini_json(c.body))),
    ),
    (
        "POST",
        "/v1beta/models/{model}:generateContent",
        "gem_generate",
        lambda c: (200, c.store.sync.generate_content(c.id, _gemini_json(c.body))),
    ),
    (
        "POST",
        "/v1beta/models/{model}:countTokens",
        "gem_count_tokens",
        lambda c: (200, c.store.gemini_batches.count_tokens(_gemini_json(c.body))),
    ),
    ("GET", "/v1beta/batches", "gem_list_batches", lambda c: (200, c.store.gemini_batches.list_batches(c.query))),
    ("GET", "/v1beta/batches/{id}", "gem_get_batch", lambda c: (200, c.store.gemini_batches.get_batch(c.id))),
    ("DELETE", "/v1beta/batches/{id}", "gem_delete_batch", lambda c: (200, c.store.gemini_batches.delete_batch(c.id))),
    ("POST", "/v1beta/batches/{id}:cancel", "gem_cancel_batch", lambda c: (200, c.store.gemini_batches.cancel_batch(c.id))),
]


def _pattern(template: str, api: str) -> re.Pattern[str]:
    """A template's regular expression: ``{id}`` and ``{model}`` match one path segment (on
    Gemini's routes, not a ``:method`` suffix either)."""
    segment = "[^/:]+" if api == "gemini" else "[^/]+"
    return re.compile("^" + re.sub(r"\\\{(id|model)\\\}", f"(?P<id>{segment})", re.escape(template)) + "$")


def _table() -> list[Route]:
    routes = []
    for api, rows in (("openai", _OPENAI), ("anthropic", _ANTHROPIC), ("gemini", _GEMINI)):
        for method, template, name, answer in rows:
            routes.append(Route(method, _pattern(template, api), template, api, answer, name))
    return routes


#: Every route, matched in order: OpenAI's, Anthropic's, Gemini's
ROUTES: list[Route] = _table()


def find_route(method: str, path: str, azure: bool) -> tuple[Route | None, dict[str, str]]:
    """The route of ``method`` and ``path`` (Azure's: ``/v1/...`` below its prefix, OpenAI's
    routes only) and its path parameters; None when there is none."""
    for r in ROUTES:
        mt = r.pattern.match(path)
        if mt and r.method == method and not (azure and r.api == "anthropic"):
            return r, mt.groupdict()
    return None, {}

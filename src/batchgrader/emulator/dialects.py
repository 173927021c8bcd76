"""Each API's way of speaking on the wire: its authentication check and its error bodies
(OpenAI, Azure OpenAI, Anthropic, Gemini).  A request is spoken in exactly one of them, told by
its path (see ``routing._Handler``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from email.message import Message
from typing import Any

from batchgrader.core.configuration.providers import ANTHROPIC_API_VERSIONS
from batchgrader.emulator.anthropic import AnthropicApiError, anthropic_error_type
from batchgrader.emulator.common import ApiError, _error_body, _mask_presented_key, _server_error_body
from batchgrader.emulator.config import EmulatorConfig
from batchgrader.emulator.gemini import GeminiApiError, gemini_error_body

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


def _anthropic_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}


class Dialect:
    """OpenAI's: ``Authorization: Bearer`` and ``{"error": {message, type, param, code}}``."""

    name = "openai"

    def check_auth(self, headers: Message[str, str], query: Mapping[str, str], cfg: EmulatorConfig) -> None:
        auth = headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not key:
            raise ApiError(
                401,
                "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        if cfg.api_key is not None and key != cfg.api_key:
            shown = key if cfg.leak_key_in_errors else _mask_presented_key(key)
            raise ApiError(
                401,
                f"Incorrect API key provided: {shown}. You can find your API key at https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            )

    def fault_body(self, status: int, message: str, etype: str, code: str | None) -> dict[str, Any]:
        """The body of a scripted or seeded ``status`` fault."""
        return _error_body(message, etype, None, code)

    def error_body(self, e: ApiError) -> dict[str, Any]:
        """The body of an error the store raised."""
        return e.body()

    def crash_body(self) -> dict[str, Any]:
        """The body of a 500 from a bug in the emulator."""
        return _server_error_body()


class AzureDialect(Dialect):
    """Azure OpenAI's: the ``api-key`` header, then ``api-version``; ``{"error": {code, message}}``."""

    name = "azure"

    def check_auth(self, headers: Message[str, str], query: Mapping[str, str], cfg: EmulatorConfig) -> None:
        """Azure's checks, in Azure's order and words: the key (``api-key`` header), then the
        ``api-version`` query parameter."""
        key = headers.get("api-key", "").strip()
        if not key:
            raise ApiError(
                401,
                "Access denied due to missing subscription key. Make sure to include subscription key when making requests to an API.",
                code="401",
                type="",
            )
        if cfg.api_key is not None and key != cfg.api_key:
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

    def fault_body(self, status: int, message: str, etype: str, code: str | None) -> dict[str, Any]:
        return _azure_body(status, message, code)

    def error_body(self, e: ApiError) -> dict[str, Any]:
        return _azure_body(e.status, e.message, e.code or e.type, e.param, e.type or None)


class AnthropicDialect(Dialect):
    """Anthropic's: ``x-api-key`` (or ``Authorization: Bearer``); ``{"type": "error", "error": {type, message}}``."""

    name = "anthropic"

    def check_auth(self, headers: Message[str, str], query: Mapping[str, str], cfg: EmulatorConfig) -> None:
        # the SDK sends the key as ``Authorization: Bearer`` (anthropic >= 2) or ``x-api-key``
        auth = headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key", "").strip()
        if not key:
            raise AnthropicApiError(401, "x-api-key header is required", type="authentication_error")
        if cfg.api_key is not None and key != cfg.api_key:
            raise AnthropicApiError(401, "invalid x-api-key", type="authentication_error")
        # every call names its API version; one the API does not know is refused (directus-labs/extensions#285)
        version = headers.get("anthropic-version")
        if not version:
            raise AnthropicApiError(400, "anthropic-version: header is required", type="invalid_request_error")
        if version not in ANTHROPIC_API_VERSIONS:
            raise AnthropicApiError(400, f'anthropic-version: "{version}" is not a valid version', type="invalid_request_error")

    def fault_body(self, status: int, message: str, etype: str, code: str | None) -> dict[str, Any]:
        return _anthropic_body(status, message)

    def error_body(self, e: ApiError) -> dict[str, Any]:
        return _anthropic_body(e.status, e.message)

    def crash_body(self) -> dict[str, Any]:
        return _anthropic_body(500, "Internal server error")


class GeminiDialect(Dialect):
    """Gemini's: ``x-goog-api-key`` (a resumable upload's session URL is its own credential);
    ``{"error": {code, message, status}}``."""

    name = "gemini"

    def check_auth(self, headers: Message[str, str], query: Mapping[str, str], cfg: EmulatorConfig) -> None:
        key = headers.get("x-goog-api-key", "").strip()
        if not key:
            raise GeminiApiError(403, "Method doesn't allow unregistered callers (callers without established identity).")
        if cfg.api_key is not None and key != cfg.api_key:
            raise GeminiApiError(400, "API key not valid. Please pass a valid API key.")

    def fault_body(self, status: int, message: str, etype: str, code: str | None) -> dict[str, Any]:
        return gemini_error_body(status, message)

    def error_body(self, e: ApiError) -> dict[str, Any]:
        return gemini_error_body(e.status, e.message)

    def crash_body(self) -> dict[str, Any]:
        return gemini_error_body(500, "An internal error has occurred.")


OPENAI, AZURE, ANTHROPIC, GEMINI = Dialect(), AzureDialect(), AnthropicDialect(), GeminiDialect()


def dialect_of(path: str, headers: Message[str, str]) -> tuple[Dialect, str]:
    """The dialect of a request and its path as routed: Gemini's SDK may use API version v1 or
    v1beta (a Google key marks its /v1 calls, routed as /v1beta); Azure's routes are under
    ``/openai/`` (``/openai/v1/messages`` is not one: it is answered as OpenAI's, a 404)."""
    if path.startswith(("/v1beta/", "/upload/")) or (path.startswith("/v1/") and "x-goog-api-key" in headers):
        return GEMINI, re.sub(r"^(/upload)?/v1/", r"\1/v1beta/", path)
    if path.startswith(AZURE_PREFIX) and not path.startswith("/openai/v1/messages"):
        return AZURE, path
    if path.startswith("/v1/messages"):
        return ANTHROPIC, path
    return OPENAI, path

"""The TLS contexts of the SDK clients in ``provider/``, each built once per process.

Every SDK client builds its own context and loads the CA store into it (about 30 ms each; a
google-genai client builds two).  These functions build the very context each SDK would build
for itself, with the SDK's own function, once per process and value of ``SSL_CERT_FILE`` /
``SSL_CERT_DIR`` (the variables those functions read); the adapters hand it to their client:

* :func:`httpx_context`: ``httpx2.create_ssl_context()``, what an ``httpx2.Client`` with its
  defaults (``verify=True``, ``trust_env=True``) builds: the openai and anthropic SDKs' clients.
* :func:`genai_client_args`: what google-genai builds for a Gemini Developer API client (its
  ``BaseApiClient._ensure_httpx_ssl_ctx`` and ``_ensure_websocket_ssl_ctx``), as the
  ``client_args`` / ``async_client_args`` of its ``HttpOptions``; none (each client builds its
  own) if that SDK has no such builders.

A context is shared only between HTTP/1.1 clients (httpcore sets the context's ALPN protocols at
each connection, the same value for all of them) and is never changed after it is built.
tests/test_provider_tls.py checks each against the one its SDK builds by default.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_built: dict[tuple[str, str | None, str | None], Any] = {}


def _once(kind: str, build: Callable[[], Any]) -> Any:
    key = (kind, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _lock:
        if key not in _built:
            _built[key] = build()
        return _built[key]


def httpx_context() -> ssl.SSLContext:
    """The context ``httpx2.Client()`` builds for itself, built once (see the module docstring)."""

    def build() -> ssl.SSLContext:
        import httpx2

        return httpx2.create_ssl_context()

    ctx: ssl.SSLContext = _once("httpx2", build)
    return ctx


def genai_client_args() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The ``client_args`` and ``async_client_args`` of ``HttpOptions`` carrying the contexts
    google-genai builds for a Gemini Developer API client, built once: ``({"verify": ctx},
    {"verify": ctx, "ssl": websocket_ctx})``; ``(None, None)`` (each client builds its own) when
    the SDK has no such builders."""

    def build() -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
        from google.genai import _api_client, types

        base = _api_client.BaseApiClient
        httpx_ctx = getattr(base, "_ensure_httpx_ssl_ctx", None)
        ws_ctx = getattr(base, "_ensure_websocket_ssl_ctx", None)
        if httpx_ctx is None or ws_ctx is None:
            return None
        verify = httpx_ctx(types.HttpOptions(), vertexai=False)[0].get("verify")
        ws = ws_ctx(types.HttpOptions(), vertexai=False).get("ssl")
        if not isinstance(verify, ssl.SSLContext) or not isinstance(ws, ssl.SSLContext):
            return None
        return verify, ws

    built = _once("genai", build)
    if built is None:
        return None, None
    verify, ws = built
    return {"verify": verify}, {"verify": verify, "ssl": ws}


__all__ = ["genai_client_args", "httpx_context"]

"""The TLS contexts the provider adapters hand their SDK clients (provider/tls.py): built once per
process, and each trusting exactly what the SDK's own default client trusts (same CA store,
verify mode, host name check, protocol and options), with and without ``SSL_CERT_FILE``."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from google import genai

from batchgrader.provider import tls
from batchgrader.provider.anthropic_api import AnthropicProvider
from batchgrader.provider.azure_api import AzureOpenAIProvider
from batchgrader.provider.gemini_batches import GeminiBatchProvider
from batchgrader.provider.openai_api import OpenAIProvider

KEY = "sk-tls-test-0123456789"


def _ctx(http_client: Any) -> ssl.SSLContext:
    ctx = http_client._transport._pool._ssl_context
    assert isinstance(ctx, ssl.SSLContext)
    return ctx


def _trust(ctx: ssl.SSLContext) -> dict[str, Any]:
    cas = sorted(json.dumps(c, sort_keys=True, default=str) for c in ctx.get_ca_certs())
    return {
        "type": type(ctx),
        "protocol": ctx.protocol,
        "verify_mode": ctx.verify_mode,
        "check_hostname": ctx.check_hostname,
        "verify_flags": ctx.verify_flags,
        "options": ctx.options,
        "versions": (ctx.minimum_version, ctx.maximum_version),
        "cas": cas,
    }


def _assert_trusts_as(ours: ssl.SSLContext, sdk_default: ssl.SSLContext) -> None:
    assert ours is not sdk_default
    assert _trust(ours) == _trust(sdk_default)
    assert ours.verify_mode == ssl.CERT_REQUIRED and ours.check_hostname
    assert _trust(ours)["cas"], "the CA store is loaded"


def _one_ca_file(tmp_path: Path) -> str:
    """A CA file holding the system store's first certificate alone."""
    text = Path(ssl.get_default_verify_paths().openssl_cafile).read_text()
    end = "-----END CERTIFICATE-----"
    path = tmp_path / "one-ca.pem"
    path.write_text(text[text.index("-----BEGIN CERTIFICATE-----") : text.index(end) + len(end)] + "\n")
    return str(path)


@pytest.fixture(params=["system", "SSL_CERT_FILE"])
def cert_env(request, monkeypatch, tmp_path):
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    if request.param == "system":
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    else:
        monkeypatch.setenv("SSL_CERT_FILE", _one_ca_file(tmp_path))
    return request.param


def test_the_openai_and_azure_adapters_trust_what_the_sdks_default_client_trusts(cert_env):
    one, two = OpenAIProvider(api_key=KEY), OpenAIProvider(api_key=KEY)
    azure = AzureOpenAIProvider(KEY, "https://example-resource.openai.azure.com", None)
    ctx = _ctx(one._client._client)
    assert _ctx(two._client._client) is ctx and _ctx(azure._client._client) is ctx  # built once
    assert _ctx(one._reads._client) is ctx  # the reads' copy shares the HTTP client
    _assert_trusts_as(ctx, _ctx(openai.OpenAI(api_key=KEY)._client))
    _assert_trusts_as(
        ctx, _ctx(openai.AzureOpenAI(api_key=KEY, azure_endpoint="https://x.openai.azure.com", api_version="2024-10-21")._client)
    )


def test_the_anthropic_adapter_trusts_what_the_sdks_default_client_trusts(cert_env):
    one, two = AnthropicProvider(KEY), AnthropicProvider(KEY)
    ctx = _ctx(one._client._client)
    assert _ctx(two._client._client) is ctx
    _assert_trusts_as(ctx, _ctx(anthropic.Anthropic(api_key=KEY)._client))


def test_the_gemini_adapter_trusts_what_the_sdks_default_client_trusts(cert_env):
    one, two = GeminiBatchProvider(KEY), GeminiBatchProvider(KEY)
    ours, theirs = one._client._api_client, genai.Client(api_key=KEY)._api_client
    ctx, ws = _ctx(ours._httpx_client), ours._websocket_ssl_ctx["ssl"]
    assert _ctx(two._client._api_client._httpx_client) is ctx and two._client._api_client._websocket_ssl_ctx["ssl"] is ws
    assert _ctx(ours._async_httpx_client) is ctx
    _assert_trusts_as(ctx, _ctx(theirs._httpx_client))
    _assert_trusts_as(ctx, _ctx(theirs._async_httpx_client))
    _assert_trusts_as(ws, theirs._websocket_ssl_ctx["ssl"])
    assert set(ours._websocket_ssl_ctx) == set(theirs._websocket_ssl_ctx)  # nothing else reaches the websocket
    assert not ours._httpx_use_mtls_endpoint and not theirs._httpx_use_mtls_endpoint


def test_a_context_is_built_again_when_the_ca_variables_change(monkeypatch, tmp_path):
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    system = tls.httpx_context()
    assert tls.httpx_context() is system
    monkeypatch.setenv("SSL_CERT_FILE", _one_ca_file(tmp_path))
    assert len(tls.httpx_context().get_ca_certs()) == 1 < len(system.get_ca_certs())

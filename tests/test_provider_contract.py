"""The provider contract (tests/provider_contract.py) run against each provider's emulator, through
its official SDK: OpenAI, Azure OpenAI, Anthropic Message Batches and the Gemini Batch API.  What
is particular to one provider (its id shapes, its request mapping, its own error bodies) stays in
that provider's test file."""

from __future__ import annotations

from typing import Any

from batchgrader.emulator import Emulator
from batchgrader.provider.anthropic_batches import AnthropicBatchProvider
from batchgrader.provider.azure_api import AzureOpenAIProvider
from batchgrader.provider.gemini_batches import GeminiBatchProvider
from batchgrader.provider.openai_api import OpenAIProvider
from provider_contract import KEY, ProviderContract


class TestOpenAI(ProviderContract):
    model = "gpt-5.4-mini"
    create_route = ("POST", "/v1/batches")
    retrieve_route = ("GET", "/v1/batches/{id}")
    sync_route = ("POST", "/v1/chat/completions")
    key_variable = "OPENAI_API_KEY"

    def make(self, emu: Emulator, key: str | None = KEY) -> Any:
        return OpenAIProvider(api_key=key, base_url=emu.base_url, timeout=10)


class TestAzureOpenAI(ProviderContract):
    model = "grader-4o-mini"  # a deployment name
    line_fields = {"url": "/chat/completions"}  # the api-version surface's line url
    create_route = ("POST", "/openai/batches")
    retrieve_route = ("GET", "/openai/batches/{id}")
    sync_route = ("POST", "/openai/deployments/{id}/chat/completions")
    key_variable = "AZURE_OPENAI_API_KEY"

    def make(self, emu: Emulator, key: str | None = KEY) -> Any:
        return AzureOpenAIProvider(key, emu.root_url, "2025-04-01-preview", timeout=10)

    def unknown_batch_id(self) -> str:
        return "azure:batch_x"


class TestAnthropic(ProviderContract):
    model = "claude-haiku-4-5"
    create_route = ("POST", "/v1/messages/batches")
    retrieve_route = ("GET", "/v1/messages/batches/{id}")
    sync_route = ("POST", "/v1/messages")
    key_variable = "ANTHROPIC_API_KEY"
    keeps_files = False
    keeps_metadata = False

    def make(self, emu: Emulator, key: str | None = KEY) -> Any:
        return AnthropicBatchProvider(key, emu.root_url, timeout=10)

    def unknown_batch_id(self) -> str:
        return "msgbatch_x"


class TestGemini(ProviderContract):
    model = "gemini-2.5-flash-lite"
    body_fields = {"max_completion_tokens": 2000}  # room for a model that may think
    create_route = ("POST", "/v1beta/models/{model}:batchGenerateContent")
    retrieve_route = ("GET", "/v1beta/batches/{id}")
    sync_route = ("POST", "/v1beta/models/{model}:generateContent")
    key_variable = "GEMINI_API_KEY"

    def make(self, emu: Emulator, key: str | None = KEY) -> Any:
        return GeminiBatchProvider(key, emu.root_url, timeout=10)

    def unknown_batch_id(self) -> str:
        return "batches/x"

"""Every provider the daemon can send to, registered by name: one :class:`ProviderSpec` each in
:data:`PROVIDERS`.

A spec is the runtime half of a provider: how its batch adapter is built (from a key, an API base
and a timeout, or the sandbox emulator's), whether it is built at start-up, and its counting
hook.  The pure facts the lower layers need (settings, environment variables, default endpoint,
answer-key identity, counting, caching) are its :class:`~batchgrader.core.configuration.providers.ProviderFacts`
of the same name.  The daemon (:mod:`batchgrader.daemon.process`) and counting
(:func:`batchgrader.provider.counting.counter_for`) read this table; every SDK is imported only
when its provider is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from batchgrader.core.configuration.providers import PROVIDER_FACTS, ProviderFacts

if TYPE_CHECKING:
    from batchgrader.provider.counting import TokenCounter
    from batchgrader.provider.protocol import Provider

#: (API key, API base, request timeout, the daemon's Config) -> the provider's batch adapter
BatchFactory = Callable[[Any, Any, float, Any], "Provider"]


@dataclass(frozen=True)
class ProviderSpec:
    facts: ProviderFacts
    adapter_module: str  # imported when the adapter is built (the daemon prefetches it)
    batch: BatchFactory
    sandbox_base: Literal["root", "v1"]  # which URL of the sandbox emulator it talks to: its root, or OpenAI's /v1 base
    built_at_start: bool  # outside the sandbox: built when the daemon starts (its constructor refuses a missing key)
    #: a profile's settings -> its counting hook (None: no key); None: its local counts are exact
    counter: Callable[[Any], TokenCounter | None] | None = None
    #: (key, emulator root URL, timeout) -> its counting hook against the sandbox emulator
    sandbox_counter: Callable[[str, str, float], TokenCounter] | None = None

    @property
    def name(self) -> str:
        return self.facts.name


# --- the adapters (each SDK imported only here, when its provider is built) --------------------------


def _openai(key: Any, base: Any, timeout: float, config: Any) -> Provider:
    from batchgrader.provider.openai_api import OpenAIProvider

    return OpenAIProvider(api_key=key, base_url=base, timeout=timeout)


def _azure(key: Any, base: Any, timeout: float, config: Any) -> Provider:
    from batchgrader.provider.azure_api import AzureOpenAIProvider

    return AzureOpenAIProvider(key, base, config.azure_api_version, timeout=timeout)


def _anthropic(key: Any, base: Any, timeout: float, config: Any) -> Provider:
    from batchgrader.provider.anthropic_batches import AnthropicBatchProvider

    return AnthropicBatchProvider(key, base, timeout=timeout, api_version=config.anthropic_api_version)


def _gemini(key: Any, base: Any, timeout: float, config: Any) -> Provider:
    from batchgrader.provider.gemini_batches import GeminiBatchProvider

    return GeminiBatchProvider(key, base, timeout=timeout)


# --- counting hooks -----------------------------------------------------------------------------------


def _anthropic_counter(settings: Any) -> TokenCounter | None:
    key = settings.get("anthropic_api_key")
    if not key:
        return None
    from batchgrader.provider.anthropic_api import AnthropicProvider, AnthropicTokenCounter

    timeout = float(settings.get("request_timeout_seconds") or 120.0)
    version = settings.get("anthropic_api_version")
    return AnthropicTokenCounter(AnthropicProvider(key, settings.get("anthropic_base_url"), timeout=timeout, api_version=version))


def _anthropic_sandbox_counter(key: str, url: str, timeout: float) -> TokenCounter:
    from batchgrader.provider.anthropic_api import AnthropicProvider, AnthropicTokenCounter

    return AnthropicTokenCounter(AnthropicProvider(key, url, timeout=timeout), name="anthropic-sandbox")


def _gemini_counter(settings: Any) -> TokenCounter | None:
    if not settings.get("gemini_api_key"):
        return None
    from batchgrader.provider.gemini_batches import gemini_counter

    return gemini_counter(settings)


#: provider name -> its spec; the names are those of core/providers.PROVIDER_FACTS, in that order
PROVIDERS: dict[str, ProviderSpec] = {
    s.name: s
    for s in (
        ProviderSpec(PROVIDER_FACTS["openai"], "batchgrader.provider.openai_api", _openai, "v1", built_at_start=False),
        ProviderSpec(
            PROVIDER_FACTS["anthropic"],
            "batchgrader.provider.anthropic_batches",
            _anthropic,
            "root",
            built_at_start=False,
            counter=_anthropic_counter,
            sandbox_counter=_anthropic_sandbox_counter,
        ),
        ProviderSpec(
            PROVIDER_FACTS["gemini"],
            "batchgrader.provider.gemini_batches",
            _gemini,
            "root",
            built_at_start=True,
            counter=_gemini_counter,
        ),
        ProviderSpec(PROVIDER_FACTS["azure"], "batchgrader.provider.azure_api", _azure, "root", built_at_start=True),
    )
}


def spec_of(provider: str) -> ProviderSpec:
    """The spec registered as ``provider``; a name no entry has is refused with the known ones."""
    try:
        return PROVIDERS[provider]
    except KeyError:
        raise KeyError(f"unknown provider {provider!r}; known: {', '.join(PROVIDERS)}") from None

"""What the lower layers know of each provider, by name: one :class:`ProviderFacts` per provider
in :data:`PROVIDER_FACTS`.

These are pure facts (setting names, environment variables, default endpoints, how answers are
keyed, how tokens are counted) that the configuration (:mod:`batchgrader.core.configuration.config`), the
answer keys (:mod:`batchgrader.pipeline.answerkey`), prompt caching, counting and ``doctor`` read
instead of keeping their own tables keyed by provider name.  The runtime half of each provider
(its adapter, synchronous client and counting hook) is its entry in
:mod:`batchgrader.provider.registry`, registered under the same name; ``tests/test_providers.py``
keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

#: how a provider's answers are keyed for reuse (pipeline/answerkey.provider_id_of):
#: ``base``: the normalised API base (OpenAI's historical ids); ``endpoint``: the normalised
#: resource endpoint, which must be set (Azure); ``prefixed``: ``<name>:`` and the normalised API base
Identity = Literal["base", "endpoint", "prefixed"]
#: how a provider's requests carry the job's prompt-cache key (pipeline/caching): ``always`` (the key
#: only routes), ``shared_prefix`` (when the shared part reaches the model's minimum), or None (never)
CacheKeyRule = Literal["always", "shared_prefix"] | None


@dataclass(frozen=True)
class ProviderFacts:
    name: str
    key_setting: str  # the config key holding its API key
    key_vars: tuple[str, ...]  # the SDK's environment variables for the key, in the order read (the last set wins)
    base_setting: str  # the config key holding its API base (Azure: the resource endpoint)
    base_vars: tuple[str, ...]  # the SDK's environment variables for the API base
    default_base: str | None  # the API base its official SDK uses when unset; None: none (must be set)
    identity: Identity  # how its answers are keyed for reuse
    offline_exact: bool  # the local (tiktoken) count is its exact count: no counting endpoint needed
    counting_endpoint: str | None = None  # what counts its tokens exactly, when the local count is not exact
    model_prefix: str | None = None  # every model it offers starts with this (others are refused at load)
    in_catalogue: bool = True  # its models are rows of the model catalogue (`bgctl models --provider`)
    cache_key: CacheKeyRule = None
    key_checked_by_profile: bool = True  # False: the daemon's own start-up check names the key
    deployment_model_setting: str | None = None  # the config key naming the model a deployment runs
    request_url: str = "/v1/chat/completions"  # the ``url`` of each request line it is sent
    #: its requests are OpenAI's own, so ``openai_endpoint`` applies (False: its adapter translates a chat request)
    openai_shaped: bool = False
    #: why its jobs are never sent through the Responses API, though OpenAI-shaped (None: they may be)
    responses_refused: str | None = None
    other_env: Mapping[str, str] = field(default_factory=dict)  # other SDK environment variables -> config key
    required_settings: Mapping[str, str] = field(default_factory=dict)  # config key -> what to set when it is missing
    api_version_setting: str | None = None  # the config key naming the API version its requests carry (a header)
    #: API version -> the sampling parameters it refuses on every model (a version not listed: the default's rules)
    api_versions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default_api_version: str | None = None
    #: its provider id in genai-prices (pipeline/maintained.py); None: its rows keep the shipped prices
    genai_prices_id: str | None = None
    #: a Batch cache hit pays the *standard* cache-read rate (Gemini's Batch guide: "the standard
    #: context-caching rate"), used where genai-prices has no Batch price for a model
    batch_cache_hit_at_standard: bool = False

    def refused_sampling(self, version: str | None) -> tuple[str, ...]:
        """The sampling parameters refused on every model under ``version`` (none when the provider
        has no versions); a version not known here gets the default version's rules (fail safe)."""
        if version is not None and version in self.api_versions:
            return self.api_versions[version]
        return self.api_versions.get(self.default_api_version or "", ())

    @property
    def key_var_text(self) -> str:
        """The key's variable as messages name it: ``GEMINI_API_KEY (or GOOGLE_API_KEY)``."""
        first, *others = self.key_vars
        return first + (f" (or {', '.join(others)})" if others else "")

    @property
    def sdk_env(self) -> dict[str, str]:
        """Every SDK environment variable it reads -> the config key it sets, in the order read."""
        return {
            **{v: self.key_setting for v in self.key_vars},
            **{v: self.base_setting for v in self.base_vars},
            **self.other_env,
        }


OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"

#: Anthropic API versions (the ``anthropic-version`` header every request carries) this program
#: knows -> the sampling parameters the API refuses under it on every model, in a Message Batch's
#: requests as well (400 ``invalid_request_error``).  2026-10-21 refuses ``temperature``, ``top_p``
#: and ``top_k`` at any value (platform.claude.com/docs/en/api/migration-2026-10-21, 2026-10-21);
#: under 2023-06-01 each model's catalogue row says what it takes (``temperature`` column).
ANTHROPIC_API_VERSIONS: dict[str, tuple[str, ...]] = {
    "2023-06-01": (),
    "2026-10-21": ("temperature", "top_p", "top_k"),
}
#: the version sent unless ``anthropic_api_version`` pins another: the one the ``anthropic`` SDK
#: sends by default since 2.0.0 (``anthropic/_constants.py`` ``ANTHROPIC_API_VERSION`` in 2.14.0;
#: tests/test_anthropic_version.py keeps the two in step).  Our client sends it explicitly.
ANTHROPIC_DEFAULT_API_VERSION = "2026-10-21"


#: provider name -> its facts, in the order ``provider`` lists its choices
PROVIDER_FACTS: dict[str, ProviderFacts] = {
    f.name: f
    for f in (
        ProviderFacts(
            name="openai",
            key_setting="api_key",
            key_vars=("OPENAI_API_KEY",),
            base_setting="base_url",
            base_vars=("OPENAI_BASE_URL",),
            default_base=OPENAI_DEFAULT_BASE,
            identity="base",
            offline_exact=True,
            cache_key="always",
            key_checked_by_profile=False,
            genai_prices_id="openai",
            openai_shaped=True,
        ),
        ProviderFacts(
            name="anthropic",
            key_setting="anthropic_api_key",
            key_vars=("ANTHROPIC_API_KEY",),
            base_setting="anthropic_base_url",
            base_vars=("ANTHROPIC_BASE_URL",),
            default_base="https://api.anthropic.com",
            identity="prefixed",
            offline_exact=False,
            counting_endpoint="Anthropic's messages.count_tokens",
            model_prefix="claude-",
            cache_key="shared_prefix",
            api_version_setting="anthropic_api_version",
            api_versions=ANTHROPIC_API_VERSIONS,
            default_api_version=ANTHROPIC_DEFAULT_API_VERSION,
            genai_prices_id="anthropic",
        ),
        ProviderFacts(
            name="gemini",
            key_setting="gemini_api_key",
            # GOOGLE_API_KEY after GEMINI_API_KEY: it wins when both are set, as in google-genai
            key_vars=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
            base_setting="gemini_base_url",
            base_vars=("GOOGLE_GEMINI_BASE_URL",),
            default_base="https://generativelanguage.googleapis.com",
            identity="prefixed",
            offline_exact=False,
            counting_endpoint="Gemini's models.count_tokens",
            model_prefix="gemini-",
            genai_prices_id="google",
            batch_cache_hit_at_standard=True,
        ),
        ProviderFacts(
            name="azure",
            key_setting="azure_api_key",
            key_vars=("AZURE_OPENAI_API_KEY",),
            base_setting="azure_endpoint",
            base_vars=("AZURE_OPENAI_ENDPOINT",),
            default_base=None,
            identity="endpoint",
            offline_exact=True,
            in_catalogue=False,
            deployment_model_setting="azure_model",
            genai_prices_id="openai",  # a deployment runs an OpenAI model at OpenAI's prices
            # its api-version surface (learn.microsoft.com batch how-to; provider/azure_api.py AZURE_ENDPOINT)
            request_url="/chat/completions",
            openai_shaped=True,
            # docs/providers.md, "The Responses API in BatchGrader's requests"
            responses_refused=(
                "Azure documents Responses lines in a Global Batch only on its v1 surface (`/openai/v1/`), and this "
                "program talks to its api-version surface, whose batch lines Azure documents as `/chat/completions` only"
            ),
            other_env={"OPENAI_API_VERSION": "azure_api_version"},
            required_settings={
                "azure_endpoint": "set AZURE_OPENAI_ENDPOINT (or azure_endpoint in config.yaml) "
                "to the resource endpoint, e.g. https://NAME.openai.azure.com"
            },
        ),
    )
}


def anthropic_refused_sampling(version: str | None) -> tuple[str, ...]:
    """The sampling parameters Anthropic refuses on every model under ``version`` (a version not
    known here: the default version's rules)."""
    return PROVIDER_FACTS["anthropic"].refused_sampling(version)


def facts_of(provider: str) -> ProviderFacts:
    """The facts of ``provider``; a name no entry has is refused with the known ones."""
    try:
        return PROVIDER_FACTS[provider]
    except KeyError:
        raise KeyError(f"unknown provider {provider!r}; known: {', '.join(PROVIDER_FACTS)}") from None

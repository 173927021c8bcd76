"""Profiles checked against the model catalogue before anything is sent.

The catalogue is the shipped ``data/pricing.csv`` (prices plus what each model accepts, see
:mod:`batchgrader.pipeline.modelspec`) with the user's rows merged over it
(:func:`batchgrader.pipeline.pricing.load_pricing`).  :func:`load_checked` is what the daemon,
``bgctl count`` and ``doctor`` call once the configuration has loaded: every setting a model
refuses (a temperature it does not take, a reasoning effort it lacks, an output bound above its
maximum, a JSON schema it cannot follow) and every model missing from the catalogue is one
:class:`~batchgrader.core.configuration.config.ConfigError` naming the profile, the key, the model and the fix.
A profile that leaves ``max_completion_tokens`` unset gets the model's reasoning bound when the
model reasons (:func:`output_bound`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

from batchgrader.core.configuration.config import Config, ConfigError, Profile
from batchgrader.core.configuration.providers import PROVIDER_FACTS
from batchgrader.pipeline.modelspec import ModelSpec
from batchgrader.pipeline.pricing import Price, PriceTable, PricingError, load_pricing, shipped_prices, with_deployments

__all__ = [
    "ANTHROPIC_THINKING_BUDGET",
    "GEMINI_THINKING_BUDGET",
    "ANSWER_ROOM",
    "load_checked",
    "profile_problems",
    "SHUTDOWN_WARN_DAYS",
    "shutdown_warnings",
    "today_of",
    "output_bound",
    "with_output_bounds",
]

#: Anthropic extended thinking: ``budget_tokens`` per effort (the API's minimum is 1,024 and the
#: budget must stay below ``max_tokens``: platform.claude.com/docs/en/build-with-claude/extended-thinking)
ANTHROPIC_THINKING_BUDGET = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384, "xhigh": 16384, "max": 16384}
#: Gemini 2.5 ``thinkingConfig.thinkingBudget`` per effort (0 turns thinking off where the model allows it;
#: ai.google.dev/gemini-api/docs/thinking)
GEMINI_THINKING_BUDGET = {"none": 0, "minimal": 512, "low": 1024, "medium": 8192, "high": 24576, "xhigh": 24576, "max": 24576}
#: output tokens kept for the visible answer above a thinking budget
ANSWER_ROOM = 1024
#: the request-line ``url`` (and the batch ``endpoint``) of OpenAI's Responses API
RESPONSES_URL = "/v1/responses"
#: OpenAI's embeddings endpoint: the ``url`` of the lines of a job on an embedding model (its
#: catalogue row's endpoint ``embeddings``); the Batch API serves it at the batch price
#: (``/v1/embeddings`` is among openai-python's ``batch_create_params.endpoint`` literals)
EMBEDDINGS_URL = "/v1/embeddings"
#: the providers whose requests the ``openai_endpoint`` setting routes (the others translate a chat request)
OPENAI_SHAPED = tuple(name for name, f in PROVIDER_FACTS.items() if f.openai_shaped)
#: the Responses API's lowest ``max_output_tokens`` (``minimum: 16`` on ``CreateResponse`` in the
#: OpenAI OpenAPI spec; the emulator refuses less with the API's 400)
RESPONSES_MIN_OUTPUT = 16
#: days before a model's shutdown date (its catalogue row's ``shutdown``) from which doctor,
#: count and status warn about a profile on it; from that date on the profile is refused
SHUTDOWN_WARN_DAYS = 30


def _utc_today() -> datetime.date:
    return datetime.datetime.now(datetime.UTC).date()


def today_of(now: float | None) -> datetime.date:
    """The UTC date of the epoch time ``now`` (None: today): what shutdown dates are compared with."""
    return _utc_today() if now is None else datetime.datetime.fromtimestamp(now, datetime.UTC).date()


def _shutdown_of(profile: Profile, price: Price) -> datetime.date | None:
    """The shutdown date of the profile's model, when the profile sends to the provider that
    announced it (an Azure deployment retires on Azure's own schedule, which the row does not hold)."""
    spec = price.spec
    if spec.shutdown is None or profile.values["provider"] != spec.provider:
        return None
    return datetime.date.fromisoformat(spec.shutdown)


def _replacement(spec: ModelSpec) -> str:
    if spec.successor:
        return f"set 'model' to {spec.successor!r}, the replacement the provider names"
    return "set 'model' to a current model (`bgctl models`; the provider names no replacement in the catalogue)"


def shutdown_warnings(config: Config, table: PriceTable, today: datetime.date | None = None) -> list[str]:
    """A message for each profile whose model shuts down within :data:`SHUTDOWN_WARN_DAYS` days
    of ``today`` (UTC today by default), naming the date and the replacement."""
    today = today or _utc_today()
    out = []
    for profile in _all_profiles(config):
        model = profile.values["model"]
        price = table.find(model)
        end = _shutdown_of(profile, price) if price is not None else None
        if end is None or not 0 < (end - today).days <= SHUTDOWN_WARN_DAYS:
            continue
        assert price is not None
        out.append(
            f"{_where(profile)}: model {model!r} shuts down on {end.isoformat()} ({(end - today).days} days); "
            f"jobs not finished by then fail and nothing is sent to it from that day; {_replacement(price.spec)}"
        )
    return out


def _where(profile: Profile) -> str:
    return "the default profile" if profile.name == "default" else f"profile {profile.name!r}"


def thinking_budget(spec: ModelSpec, effort: str | None) -> int | None:
    """The thinking budget a request carries under ``effort`` (None: the model has no budget control
    or the request does not think)."""
    if spec.reasoning != "budget" or effort is None or effort == "auto":
        return None
    table = ANTHROPIC_THINKING_BUDGET if spec.provider == "anthropic" else GEMINI_THINKING_BUDGET
    if spec.provider == "anthropic" and effort == "none":
        return None
    return table.get(effort)


def output_bound(profile: Profile, spec: ModelSpec) -> int:
    """The output bound a request carries: the profile's ``max_completion_tokens`` when it is set
    anywhere, else the model's ``reasoning_bound`` when the model reasons, else the key's default."""
    value = int(profile.values["max_completion_tokens"])
    if profile.sources.get("max_completion_tokens") != "default":
        return value
    if spec.reasons(profile.values.get("reasoning_effort")) and spec.reasoning_bound:
        return spec.reasoning_bound
    return value


def uses_responses(provider: str, setting: str | None, spec: ModelSpec) -> bool:
    """Whether a profile's requests go through OpenAI's Responses API: ``openai_endpoint:
    responses``, or ``auto`` (the default) on a model whose catalogue row serves it there only.
    Only the OpenAI-shaped providers' requests do; Anthropic's and Gemini's adapters translate a
    chat request."""
    if provider not in OPENAI_SHAPED:
        return False
    if setting in (None, "auto"):
        return spec.endpoint == "responses"
    return setting == "responses"


def _endpoint_problems(profile: Profile, spec: ModelSpec, bound: int, where: str, model: str) -> list[str]:
    """``openai_endpoint`` against the model's row: chat completions for a Responses-only model,
    the Responses API for a model not known to be served there, on Azure, or on a provider that
    has neither; an output bound below the Responses API's minimum."""
    provider = profile.values["provider"]
    setting = profile.values.get("openai_endpoint") or "auto"
    if spec.embeddings:
        return _embedding_problems(profile, setting, where, model)
    if provider not in OPENAI_SHAPED:
        if setting == "auto":
            return []
        return [
            f"{where}: key 'openai_endpoint' is {setting!r}, but provider {provider!r} has no OpenAI endpoints (its "
            "adapter translates each request); remove 'openai_endpoint' or set it to 'auto'"
        ]
    if setting == "chat_completions" and spec.endpoint == "responses":
        return [
            f"{where}: key 'openai_endpoint' is 'chat_completions', but model {model!r} is served only by the Responses "
            "API (OpenAI answers 404 'This model is only supported in v1/responses and not in v1/chat/completions.'); "
            "set 'openai_endpoint' to 'auto' or 'responses'"
        ]
    if not uses_responses(provider, setting, spec):
        return []
    refused = PROVIDER_FACTS[provider].responses_refused
    if refused:
        return [
            f"{where}: model {model!r} would go through the Responses API (key 'openai_endpoint' is {setting!r}), "
            f"which this program does not send to provider {provider!r}: {refused}; use a model served on chat "
            "completions with 'openai_endpoint: auto', or 'provider: openai' for this model"
        ]
    out = []
    if not spec.serves_responses:
        out.append(
            f"{where}: key 'openai_endpoint' is 'responses', but the catalogue does not say that model {model!r} is "
            "served by the Responses API (its row's endpoint column is empty); set 'openai_endpoint' to 'auto', or give "
            "the model's row in your pricing.csv the endpoint 'both' if OpenAI serves it there"
        )
    if bound < RESPONSES_MIN_OUTPUT:
        out.append(
            f"{where}: key 'max_completion_tokens' is {bound}, below {RESPONSES_MIN_OUTPUT}, the least "
            f"'max_output_tokens' the Responses API takes (model {model!r} goes through it); set "
            f"'max_completion_tokens' to at least {RESPONSES_MIN_OUTPUT}"
        )
    return out


def _embedding_problems(profile: Profile, setting: str, where: str, model: str) -> list[str]:
    """What a job on an embedding model cannot carry: each row's text becomes one ``/v1/embeddings``
    request (its answer a vector), sent to OpenAI only (Azure's Batch does not serve embeddings)."""
    provider = profile.values["provider"]
    if provider != "openai":
        return [
            f"{where}: model {model!r} is an embedding model, which this program sends only to OpenAI's Batch API "
            f"(provider {provider!r} has no batch embeddings here); set 'provider: openai' for this profile"
        ]
    out = []
    if setting not in ("auto", "chat_completions"):
        out.append(
            f"{where}: key 'openai_endpoint' is {setting!r}, but model {model!r} is served on /v1/embeddings only; remove it"
        )
    given = {
        "response_format": "an embedding is a vector, not a structured answer",
        "reasoning_effort": "an embedding model does not reason",
        "temperature": "an embedding has no sampling",
        "system_prompt": "only the row's text is embedded",
    }
    for key, why in given.items():
        if profile.values.get(key) is not None and profile.sources.get(key) != "default":
            out.append(f"{where}: key {key!r} is set, but model {model!r} is an embedding model ({why}); remove {key!r}")
    if int(profile.values.get("samples") or 1) > 1:
        out.append(f"{where}: key 'samples' is above 1, but an embedding is the same every time; set 'samples: 1'")
    return out


def profile_problems(profile: Profile, price: Price, today: datetime.date | None = None) -> list[str]:
    """Each setting of ``profile`` that ``price``'s model refuses, as a message naming the fix; a
    model past its shutdown date (on ``today``, UTC today by default) is refused too."""
    spec, model, where = price.spec, profile.values["model"], _where(profile)
    end = _shutdown_of(profile, price)
    if end is not None and (today or _utc_today()) >= end:
        return [
            f"{where}: key 'model' is {model!r}, which {spec.provider} shut down on {end.isoformat()}: nothing is sent "
            f"to it; {_replacement(spec)}"
        ]
    effort_setting = profile.values.get("reasoning_effort")
    effort = spec.effective_effort(effort_setting)
    out: list[str] = []
    out += _temperature_problems(profile, spec, effort, where, model)
    out += _effort_problems(spec, effort_setting, where, model)
    bound = output_bound(profile, spec)
    if spec.max_output is not None and bound > spec.max_output:
        out.append(
            f"{where}: key 'max_completion_tokens' is {bound}, above the {spec.max_output}-token output maximum of "
            f"model {model!r}; set 'max_completion_tokens' to at most {spec.max_output}"
        )
    budget = thinking_budget(spec, effort)
    if budget and bound < budget + ANSWER_ROOM:
        out.append(
            f"{where}: key 'max_completion_tokens' is {bound}, but model {model!r} thinks with a budget of {budget} tokens "
            f"at reasoning_effort {effort!r} and the bound includes them; set 'max_completion_tokens' to at least "
            f"{budget + ANSWER_ROOM} or choose a lower 'reasoning_effort'"
        )
    rf = profile.values.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema" and spec.structured_output is False:
        out.append(
            f"{where}: key 'response_format' asks for a JSON schema, which model {model!r} does not support "
            "(no structured outputs); remove 'response_format' or choose a model that has them (`bgctl models`)"
        )
    out += _route_problems(profile, spec, where, model)
    out += _endpoint_problems(profile, spec, bound, where, model)
    if profile.values.get("token_param") == "max_tokens" and spec.reasoning is not None and spec.provider == "openai":
        out.append(
            f"{where}: key 'token_param' is 'max_tokens', which reasoning model {model!r} refuses "
            "(400 unsupported_parameter); set 'token_param' to 'auto'"
        )
    return out


def _route_problems(profile: Profile, spec: ModelSpec, where: str, model: str) -> list[str]:
    """``route: flex`` on a provider or model without a flex tier (unknown counts as without)."""
    if profile.values.get("route") != "flex":
        return []
    provider = profile.values["provider"]
    if provider != "openai":
        return [
            f"{where}: key 'route' is 'flex', but provider {provider!r} offers no flex tier this program can use "
            "(see docs/providers.md); set 'route' to 'online', 'batch' or 'auto'"
        ]
    if spec.flex is not True:
        return [
            f"{where}: key 'route' is 'flex', but model {model!r} has no flex tier (its catalogue row's flex column is "
            f"{'no' if spec.flex is False else 'empty'}; `bgctl models` lists them); set 'route' to 'online', 'batch' or "
            "'auto', or choose a model with flex"
        ]
    return []


def _temperature_problems(profile: Profile, spec: ModelSpec, effort: str | None, where: str, model: str) -> list[str]:
    t = profile.values.get("temperature")
    if t is None:
        return []
    fix = f"remove 'temperature' from {where} (graders get repeatable answers from stored-answer reuse, not from temperature 0)"
    if spec.temperature == "deprecated":
        return [
            f"{where}: key 'temperature' is {t:g}, but model {model!r} refuses any temperature "
            f"(Anthropic answers 400 '`temperature` is deprecated for this model.'); {fix}"
        ]
    if spec.temperature == "default" and t != 1:
        return [
            f"{where}: key 'temperature' is {t:g}, but model {model!r} accepts only its default temperature 1 "
            f"(OpenAI answers 400 unsupported_value); {fix}"
        ]
    if spec.temperature == "effort-none" and effort != "none" and t != 1:
        return [
            f"{where}: key 'temperature' is {t:g}, but model {model!r} accepts a temperature only at reasoning_effort "
            f"'none' (this profile runs at {effort!r}); {fix}, or set 'reasoning_effort: none'"
        ]
    if spec.provider == "anthropic" and profile.values.get("reasoning_effort") not in (None, "none") and t != 1:
        return [
            f"{where}: key 'temperature' is {t:g}, but model {model!r} thinks at reasoning_effort {effort!r} and "
            f"Anthropic accepts no other temperature than 1 with thinking; {fix}, or set 'reasoning_effort: none'"
        ]
    return []


def _effort_problems(spec: ModelSpec, setting: str | None, where: str, model: str) -> list[str]:
    if setting is None:
        return []
    if spec.reasoning is None:
        return [
            f"{where}: key 'reasoning_effort' is {setting!r}, but model {model!r} does not reason; "
            "remove 'reasoning_effort' or choose a reasoning model (`bgctl models`)"
        ]
    if setting not in spec.reasoning_efforts:
        return [
            f"{where}: key 'reasoning_effort' is {setting!r}, which model {model!r} does not take; "
            f"set it to one of {', '.join(spec.reasoning_efforts)} (or remove it for the model's default)"
        ]
    return []


def with_output_bounds(config: Config, table: PriceTable) -> Config:
    """``config`` with every profile's unset ``max_completion_tokens`` replaced by its model's bound
    (:func:`output_bound`) and its ``openai_endpoint: auto`` by the API its model's row chooses
    (:func:`uses_responses`; ``chat_completions`` or ``responses``, on the OpenAI-shaped
    providers); their sources then say so."""

    def resolved(profile: Profile) -> Profile:
        price = table.find(profile.values["model"])
        if price is None:
            return profile
        values: dict[str, Any] = dict(profile.values)
        sources = dict(profile.sources)
        if profile.sources.get("max_completion_tokens") == "default":
            bound = output_bound(profile, price.spec)
            if bound != profile.values["max_completion_tokens"]:
                values["max_completion_tokens"] = bound
                sources["max_completion_tokens"] = f"catalogue: reasoning_bound of {price.model}"
        if values.get("openai_endpoint", "auto") == "auto" and values["provider"] in OPENAI_SHAPED:
            responses = uses_responses(values["provider"], "auto", price.spec)
            values["openai_endpoint"] = "responses" if responses else "chat_completions"
            sources["openai_endpoint"] = f"catalogue: endpoint of {price.model}"
        if values == profile.values:
            return profile
        return Profile(profile.name, MappingProxyType(values), MappingProxyType(sources))

    profiles = {name: resolved(p) for name, p in config.profiles.items()}
    return dataclasses.replace(config, default=resolved(config.default), profiles=MappingProxyType(profiles))


def with_catalogue_bounds(config: Config) -> Config:
    """``config`` with the output bounds the daemon would use (:func:`with_output_bounds`), for
    display; unchanged when the user's catalogue file does not load (doctor names its problem)."""
    try:
        table = load_pricing(config.pricing_path())
    except PricingError:
        return config
    return with_output_bounds(config, table)


def _all_profiles(config: Config) -> Iterable[Profile]:
    return (config.default, *config.profiles.values())


def catalogue_problems(config: Config, table: PriceTable, missing: bool = True, today: datetime.date | None = None) -> list[str]:
    """Every problem of every profile against ``table``; with ``missing``, a model the catalogue
    lacks is one too (its message names the closest known ids and how to add a row)."""
    out: list[str] = []
    for profile in _all_profiles(config):
        model = profile.values["model"]
        try:
            price = table.get(model)
        except PricingError as exc:
            if missing:
                out.append(f"{_where(profile)}: key 'model': {exc}")
            continue
        out += profile_problems(profile, price, today)
    return out


def load_checked(config: Config, missing: bool = True, today: datetime.date | None = None) -> tuple[Config, PriceTable]:
    """The catalogue (shipped rows, the user's rows, Azure deployments) and ``config`` with its
    output bounds resolved.  Raises :class:`PricingError` for a malformed user file (naming its
    file, line and column) and :class:`ConfigError` listing every setting a model refuses (and,
    with ``missing``, every model the catalogue lacks)."""
    table = with_deployments(load_pricing(config.pricing_path()), _all_profiles(config))
    problems = catalogue_problems(config, table, missing, today)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(
            f"{len(problems)} settings the models refuse (nothing was sent):\n"
            + "\n".join(f"  {i}. {p}" for i, p in enumerate(problems, 1))
        )
    return with_output_bounds(config, table), table


@functools.lru_cache(maxsize=256)
def shipped_spec(model: str) -> ModelSpec:
    """The shipped catalogue's rules for ``model`` (an empty :class:`ModelSpec` when it has no row):
    what the request translators and the emulators go by."""
    price = PriceTable(shipped_prices()).find(model)
    return price.spec if price is not None else ModelSpec()


def anthropic_thinking(model: str, effort: str | None) -> dict[str, Any]:
    """The Messages API parameters that carry ``reasoning_effort`` for ``model``: extended thinking
    with a ``budget_tokens`` (models whose control is a budget, and models the catalogue lacks), or
    adaptive thinking with ``output_config.effort``.  Empty when no effort is set."""
    if effort is None:
        return {}
    spec = shipped_spec(model)
    if spec.reasoning == "effort":
        if effort == "none":
            return {"thinking": {"type": "disabled"}}
        return {"thinking": {"type": "adaptive"}, "output_config": {"effort": effort}}
    if effort == "none":
        return {}
    return {"thinking": {"type": "enabled", "budget_tokens": ANTHROPIC_THINKING_BUDGET.get(effort, 1024)}}


def gemini_thinking(model: str, effort: str | None) -> dict[str, Any] | None:
    """The ``generationConfig.thinkingConfig`` that carries ``reasoning_effort`` for ``model``:
    ``thinkingLevel`` for Gemini 3 models, else ``thinkingBudget``.  None when no effort is set."""
    if effort is None:
        return None
    if shipped_spec(model).reasoning == "level":
        return {"thinkingLevel": effort.upper()}
    return {"thinkingBudget": GEMINI_THINKING_BUDGET.get(effort, 1024)}


def catalogue_rows(table: PriceTable, anthropic_api_version: str | None = None) -> list[dict[str, Any]]:
    """One dict per catalogue row (``bgctl models``): its prices in force on the table's day (UTC
    today unless pinned), the day they took effect (``price_from``) and the later days they change
    (``price_changes``, from the catalogue's dated rows), limits, rules, source and origin.
    ``temperature`` is what the model takes as requests are sent: under an Anthropic API version
    that refuses sampling parameters (core/providers.ANTHROPIC_API_VERSIONS), a Claude row's own
    rule does not apply and the row says ``none (API)`` (``temperature_api_version`` names the version)."""
    from batchgrader.core.configuration.providers import ANTHROPIC_API_VERSIONS, ANTHROPIC_DEFAULT_API_VERSION

    version = anthropic_api_version or ANTHROPIC_DEFAULT_API_VERSION
    refused = "temperature" in ANTHROPIC_API_VERSIONS.get(version, ())
    day = table.day or _utc_today()  # the prices shown are those in force on this day
    out = []
    for key in sorted(table, key=lambda k: (table[k].spec.provider or "~", k)):
        p = table[key]
        spec = p.spec
        out.append(
            {
                "model": p.model,
                "provider": spec.provider,
                "aliases": list(spec.aliases),
                "batch": {
                    "input_per_1m": p.input_per_1m,
                    "cached_input_per_1m": p.cached_input_per_1m,
                    "output_per_1m": p.output_per_1m,
                    "cache_write_per_1m": spec.cache_write_per_1m,
                },
                "standard": {
                    "input_per_1m": spec.standard_input_per_1m,
                    "cached_input_per_1m": spec.standard_cached_input_per_1m,
                    "output_per_1m": spec.standard_output_per_1m,
                },
                "context_window": p.context_window,
                "max_output": spec.max_output,
                "reasoning": spec.reasoning,
                "reasoning_efforts": list(spec.reasoning_efforts),
                "reasoning_default": spec.reasoning_default,
                "reasoning_bound": spec.reasoning_bound,
                "temperature": "none (API)" if refused and spec.provider == "anthropic" else spec.temperature,
                "temperature_api_version": version if spec.provider == "anthropic" else None,
                "shutdown": spec.shutdown,
                "successor": spec.successor,
                "output_param": spec.output_param,
                "structured_output": spec.structured_output,
                "min_cache_prefix": spec.min_cache_prefix,
                "endpoint": spec.endpoint,
                "taken_on": p.taken_on,
                "source": p.source,
                "notes": spec.notes,
                "origin": p.origin,
                "price_source": p.price_source,
                "price_sources": dict(p.sources),
                "price_from": p.price_from,
                "price_changes": [d.isoformat() for d in p.changes_after(day)],
            }
        )
    return out

"""Per-request rules of the real APIs, from the model catalogue, for every emulated endpoint.

The batch paths (OpenAI/Azure input lines, Anthropic batch requests, Gemini JSONL lines) and the
synchronous endpoints call the same functions, so a request the sandbox refuses on one path it
refuses on the other, with the provider's own error shape:

* :func:`openai_request_error` -> ``(status, error_body)`` of an OpenAI chat-completions request:
  first what OpenAI's OpenAPI spec forbids (:func:`~batchgrader.emulator.openapi.chat_request_error`:
  ``temperature: 3``, ``n: 0``, a message ``role: robot``), then ``max_tokens`` on a reasoning model (400 ``unsupported_parameter``), a ``temperature`` other than 1 on a model that takes only its default (400 ``unsupported_value``,
  the message OpenAI gives), a ``reasoning_effort`` the model lacks or does not take, an output
  bound above the model's maximum; ``service_tier: "flex"`` on a model whose catalogue row has no
  flex tier (400 ``invalid_value``: the request is refused, not served at the standard tier);
* :func:`anthropic_request_error` -> the message of a 400 ``invalid_request_error`` for Messages
  params under an API version: ``temperature``, ``top_p`` or ``top_k`` on any model under
  2026-10-21; under 2023-06-01 ``temperature`` on a model that deprecated it, ``max_tokens`` above the maximum, a
  thinking budget not below ``max_tokens``;
* :func:`gemini_request_error` -> ``(code, status, message)`` for a ``GenerateContentRequest``;
* :func:`reasoning_tokens` -> how many reasoning tokens one answer spends: hundreds to thousands
  by effort (as reasoning models spend them), so a small output bound truncates in the sandbox
  as it does live.

* :func:`shut_down` -> OpenAI's 404 message for a model past its catalogue ``shutdown`` date on
  the emulator's clock (sync: a 404 ``model_not_found``; a batch: fails validation with it);
* :func:`known_model` -> whether the emulator serves a model id (the shipped catalogue, and the
  ids and catalogue file the emulator's configuration adds); each API answers any other id 404
  with its own error shape, as the real APIs answer a model they do not know.

A served model the catalogue lacks (an id the configuration adds) is accepted with no per-model rule.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from batchgrader.core.configuration.providers import anthropic_refused_sampling
from batchgrader.emulator.config import EmulatorConfig
from batchgrader.emulator.openapi import chat_request_error, responses_request_error
from batchgrader.pipeline.catalogue import shipped_spec
from batchgrader.pipeline.modelspec import ModelSpec

__all__ = [
    "REASONING_DRAW",
    "SHUTDOWN_MESSAGE",
    "shut_down",
    "openai_request_error",
    "responses_request_error_of",
    "RESPONSES_ONLY_MESSAGE",
    "anthropic_request_error",
    "gemini_request_error",
    "reasoning_tokens",
]

#: reasoning tokens one answer spends, by effort (low, high): hundreds to thousands
REASONING_DRAW = {
    "none": (0, 0),
    "minimal": (16, 200),
    "low": (200, 1_000),
    "medium": (600, 3_000),
    "auto": (600, 3_000),
    "high": (1_500, 8_000),
    "xhigh": (3_000, 12_000),
    "max": (3_000, 16_000),
}


_MODELS_FILE: dict[str, tuple[float, frozenset[str]]] = {}  # path -> (mtime, its model ids)


def _file_models(path: str) -> frozenset[str]:
    """The ``model`` (and ``aliases``) cells of a catalogue CSV, read again when it changes."""
    import csv
    import os

    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return frozenset()
    cached = _MODELS_FILE.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    ids: set[str] = set()
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            for row in csv.DictReader(fh):
                ids.add((row.get("model") or "").strip().lower())
                ids.update(a.strip().lower() for a in (row.get("aliases") or "").split("|"))
    except (OSError, UnicodeDecodeError, csv.Error):
        return frozenset()
    out = frozenset(ids - {""})
    _MODELS_FILE[path] = (mtime, out)
    return out


def known_model(model: str, cfg: EmulatorConfig) -> bool:
    """Whether the emulator serves ``model``: a shipped catalogue row (an alias or a dated snapshot
    of one included), one of ``cfg.extra_models``, or a row of ``cfg.models_file``."""
    key = model.strip().lower()
    if shipped_spec(key).provider is not None:  # every shipped row names its provider (cached lookup)
        return True
    if key in {m.strip().lower() for m in cfg.extra_models}:
        return True
    return cfg.models_file is not None and key in _file_models(str(cfg.models_file))


#: OpenAI's answer for a model past its shutdown date, as recorded live: 404 ``model_not_found``,
#: ``invalid_request_error``, param null (third-party transcripts of gpt-3.5-turbo-1106, gpt-5-codex,
#: gpt-4-0314 and text-davinci-003 after their shutdowns; not re-checked live)
SHUTDOWN_MESSAGE = "The model `{model}` has been deprecated, learn more here: https://platform.openai.com/docs/deprecations"


def shut_down(model: str, cfg: EmulatorConfig) -> str | None:
    """OpenAI's message for ``model`` when its shipped catalogue row's ``shutdown`` date has come
    on the emulator's clock (UTC), else None.  Only OpenAI rows carry a date (an Azure deployment
    retires on Azure's own schedule)."""
    import datetime

    spec = shipped_spec(model)
    if spec.shutdown is None or spec.provider != "openai":
        return None
    today = datetime.datetime.fromtimestamp(cfg.clock(), datetime.UTC).date()
    return SHUTDOWN_MESSAGE.format(model=model) if today >= datetime.date.fromisoformat(spec.shutdown) else None


def reasoning_tokens(spec: ModelSpec, effort: str | None, rng: random.Random, budget: int | None = None) -> int:
    """Reasoning tokens of one answer of a model with ``spec`` at ``effort`` (None: the model's
    default); at most ``budget`` when a thinking budget is set."""
    eff = spec.effective_effort(effort)
    if eff is None:
        return 0
    low, high = REASONING_DRAW.get(eff, REASONING_DRAW["medium"])
    n = rng.randint(low, high) if high else 0
    return min(n, budget) if budget is not None else n


def _openai_error(message: str, param: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


#: OpenAI's 404 for a Responses-only model (o1-pro, o3-pro, gpt-5-pro, ...) on chat completions, as
#: recorded live: n8n-io/n8n#18352 (2025-08-14: 404, type invalid_request_error, param model, code
#: null) and HeyPuter/puter#1303 (o3-pro, 2025-06-12); not re-checked live since
RESPONSES_ONLY_MESSAGE = "This model is only supported in v1/responses and not in v1/chat/completions."


#: OpenAI's 404 for a model that is not a chat model (an embedding model) on chat completions, as
#: widely quoted (openai-python and LangChain issues, 2023-2025); not re-checked live since
NOT_CHAT_MESSAGE = (
    "This is not a chat model and thus not supported in the v1/chat/completions endpoint. Did you mean to use v1/completions?"
)


def openai_request_error(body: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The HTTP status and error body OpenAI answers for this chat-completions body, or None."""
    spec = shipped_spec(str(body.get("model") or ""))
    if spec.provider == "openai" and spec.embeddings:
        return 404, {"error": {"message": NOT_CHAT_MESSAGE, "type": "invalid_request_error", "param": "model", "code": None}}
    if spec.provider == "openai" and not spec.serves_chat:
        return 404, {
            "error": {"message": RESPONSES_ONLY_MESSAGE, "type": "invalid_request_error", "param": "model", "code": None}
        }
    if (invalid := chat_request_error(body)) is not None:
        return 400, {"error": invalid}
    for check in (_tier_error, _effort_error, _bounds_error):
        refused = check(body, spec)
        if refused is not None:
            return 400, refused
    return None


#: a Responses body's fields as the chat rules name them, and back (for the error's param and wording)
_RESPONSES_NAMES = {
    "reasoning_effort": "reasoning.effort",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
}


def responses_request_error_of(body: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The HTTP status and error body OpenAI answers for this ``POST /v1/responses`` body, or
    None: what the spec refuses (:func:`~batchgrader.emulator.openapi.responses_request_error`),
    then the model's rules of :func:`openai_request_error` (flex tier, reasoning effort,
    temperature, output bound) on the Responses fields (``reasoning.effort``, ``max_output_tokens``)."""
    if (invalid := responses_request_error(body)) is not None:
        return 400, {"error": invalid}
    spec = shipped_spec(str(body.get("model") or ""))
    reasoning = body.get("reasoning")
    chat_like: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "service_tier") if k in body}
    if isinstance(reasoning, Mapping) and reasoning.get("effort") is not None:
        chat_like["reasoning_effort"] = reasoning["effort"]
    if isinstance(body.get("max_output_tokens"), int):
        chat_like["max_completion_tokens"] = body["max_output_tokens"]
    for check in (_tier_error, _effort_error, _bounds_error):
        refused = check(chat_like, spec)
        if refused is not None:
            err = refused["error"]
            param = _RESPONSES_NAMES.get(err["param"], err["param"])
            message = str(err["message"])
            for chat_name, name in _RESPONSES_NAMES.items():
                message = message.replace(f"'{chat_name}'", f"'{name}'").replace(
                    f"{chat_name} is too large", f"{name} is too large"
                )
            return 400, _openai_error(message, param, err["code"])
    return None


def _tier_error(body: Mapping[str, Any], spec: ModelSpec) -> dict[str, Any] | None:
    tier = body.get("service_tier")
    if tier == "flex" and not (spec.provider == "openai" and spec.flex is True):
        return _openai_error(
            f"Flex processing is not available for model '{body.get('model')}'. "
            "See the pricing page for the models that support service_tier 'flex'.",
            "service_tier",
            "invalid_value",
        )
    if tier is not None and tier not in ("auto", "default", "flex", "priority"):
        return _openai_error(
            f"Invalid value: '{tier}'. Supported values are: 'auto', 'default', 'flex' and 'priority'.",
            "service_tier",
            "invalid_value",
        )
    return None


def _effort_error(body: Mapping[str, Any], spec: ModelSpec) -> dict[str, Any] | None:
    effort = body.get("reasoning_effort")
    if effort is None or spec.provider != "openai":
        return None
    if spec.reasoning is None:
        return _openai_error(
            "Unsupported parameter: 'reasoning_effort' is not supported with this model.",
            "reasoning_effort",
            "unsupported_parameter",
        )
    if effort not in spec.reasoning_efforts:
        supported = ", ".join(f"'{e}'" for e in spec.reasoning_efforts)
        return _openai_error(
            f"Unsupported value: 'reasoning_effort' does not support '{effort}' with this model. "
            f"Supported values are: {supported}.",
            "reasoning_effort",
            "unsupported_value",
        )
    return None


def _bounds_error(body: Mapping[str, Any], spec: ModelSpec) -> dict[str, Any] | None:
    """``max_tokens`` on a reasoning model, a temperature it refuses, a cap above its output."""
    if "max_tokens" in body and spec.provider == "openai" and spec.reasoning is not None:
        return _openai_error(
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
            "max_tokens",
            "unsupported_parameter",
        )
    t = body.get("temperature")
    if isinstance(t, (int, float)) and t != 1 and _temperature_refused(spec, spec.effective_effort(body.get("reasoning_effort"))):
        return _openai_error(
            f"Unsupported value: 'temperature' does not support {t:g} with this model. Only the default (1) value is supported.",
            "temperature",
            "unsupported_value",
        )
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(cap, int) and spec.max_output is not None and cap > spec.max_output:
        return _openai_error(
            f"max_tokens is too large: {cap}. This model supports at most {spec.max_output} completion tokens, "
            f"whereas you provided {cap}.",
            "max_tokens",
            "invalid_value",
        )
    return None


def _temperature_refused(spec: ModelSpec, effort: str | None) -> bool:
    if spec.temperature in ("default", "deprecated"):
        return True
    return spec.temperature == "effort-none" and effort != "none"


def anthropic_request_error(params: Mapping[str, Any], version: str | None) -> str | None:
    """The message of the 400 ``invalid_request_error`` Anthropic answers for these Messages params
    under API ``version`` (the request's ``anthropic-version``), or None."""
    for name in anthropic_refused_sampling(version):
        if params.get(name) is not None:
            # the migration guide names the refusal; its exact wording was not found offline
            return f"`{name}` is not supported on API version {version}; remove it from the request."
    spec = shipped_spec(str(params.get("model") or ""))
    if params.get("temperature") is not None and spec.temperature == "deprecated":
        return "`temperature` is deprecated for this model."
    max_tokens = params.get("max_tokens")
    if isinstance(max_tokens, int) and spec.max_output is not None and max_tokens > spec.max_output:
        return (
            f"max_tokens: {max_tokens} > {spec.max_output}, which is the maximum allowed number of output tokens "
            f"for {params.get('model')}"
        )
    thinking = params.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if isinstance(max_tokens, int) and max_tokens <= budget:
            return "`max_tokens` must be greater than `thinking.budget_tokens`."
        t = params.get("temperature")
        if t is not None and t != 1:
            return "`temperature` may only be set to 1 when thinking is enabled."
    return None


def anthropic_thinking_effort(params: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The effort and the budget (if any) a Messages request thinks at, from its params."""
    thinking = params.get("thinking")
    if isinstance(thinking, Mapping):
        if thinking.get("type") == "disabled":
            return "none", None
        if thinking.get("type") == "enabled":
            budget = thinking.get("budget_tokens")
            return "high", budget if isinstance(budget, int) else None
        if thinking.get("type") == "adaptive":
            oc = params.get("output_config")
            effort = oc.get("effort") if isinstance(oc, Mapping) else None
            return effort or "auto", None
    return None, None


def gemini_request_error(model: str, request: Mapping[str, Any]) -> tuple[int, str, str] | None:
    """The (gRPC code, status, message) Gemini answers for this ``GenerateContentRequest``, or None."""
    spec = shipped_spec(model)
    gen = request.get("generationConfig") or {}
    cap = gen.get("maxOutputTokens")
    if isinstance(cap, int) and spec.max_output is not None and cap > spec.max_output:
        return (
            3,
            "INVALID_ARGUMENT",
            f"The specified maxOutputTokens value {cap} is out of range: the supported range is from 1 (inclusive) "
            f"to {spec.max_output + 1} (exclusive).",
        )
    thinking = gen.get("thinkingConfig") or {}
    if thinking.get("thinkingBudget") == 0 and spec.reasoning is not None and "none" not in spec.reasoning_efforts:
        return 3, "INVALID_ARGUMENT", "Budget 0 is invalid. This model only works in thinking mode."
    return None


def gemini_thinking_effort(model: str, request: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The effort and the budget (if any) a Gemini request thinks at."""
    spec = shipped_spec(model)
    gen = request.get("generationConfig") or {}
    thinking = gen.get("thinkingConfig") or {}
    if "thinkingBudget" in thinking:
        budget = int(thinking["thinkingBudget"])
        if budget < 0:
            return "auto", None  # -1: dynamic thinking
        return ("none" if budget == 0 else "high"), (budget if budget > 0 else None)
    if thinking.get("thinkingLevel"):
        return str(thinking["thinkingLevel"]).lower(), None
    return spec.reasoning_default if spec.reasoning is not None else None, None

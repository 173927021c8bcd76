"""What a model accepts: the catalogue columns beside its Batch prices in ``data/pricing.csv``.

Each catalogue row carries, after the price columns (see :mod:`batchgrader.pipeline.pricing`):

``provider``
    ``openai`` (also served by Azure OpenAI deployments), ``anthropic`` or ``gemini``.
``aliases``
    other ids of the same model, separated by ``|`` (e.g. ``claude-haiku-4-5-20251001``).
``cache_write_per_1m``, ``standard_input_per_1m``, ``standard_cached_input_per_1m``, ``standard_output_per_1m``
    the Batch price of a prompt-cache write, and the standard (non-batch) prices, USD per 1M tokens.
``max_output``
    the most output tokens one request may ask for (empty: unknown, not checked).
``reasoning``
    the model's reasoning control: empty or ``none`` (not a reasoning model), ``effort`` (OpenAI
    ``reasoning_effort``; Anthropic adaptive thinking with ``output_config.effort``), ``budget``
    (Anthropic extended-thinking ``budget_tokens``; Gemini 2.5 ``thinkingBudget``) or ``level``
    (Gemini 3 ``thinkingLevel``).
``reasoning_efforts``
    the ``reasoning_effort`` values it takes, ``|``-separated, from :data:`EFFORTS`.
``reasoning_default``
    what it does when no effort is sent: one of :data:`EFFORTS`, or ``auto`` (the model decides).
``reasoning_bound``
    the output bound used when the profile leaves ``max_completion_tokens`` unset and the model
    reasons (reasoning tokens count against the bound).
``temperature``
    ``any``; ``default`` (only the default 1 is accepted); ``effort-none`` (accepted only at
    reasoning effort ``none``); ``deprecated`` (refused at any value).
``output_param``
    the request field that bounds the output: ``max_completion_tokens`` or ``max_tokens``
    (OpenAI), ``max_tokens`` (Anthropic), ``max_output_tokens`` (Gemini ``maxOutputTokens``).
``structured_output``
    ``yes`` or ``no``: whether a JSON-schema ``response_format`` is accepted (empty: unknown).
``min_cache_prefix``
    the shortest prompt prefix, in tokens, the provider caches (empty: unknown or none).
``flex``
    ``yes`` or ``no``: whether the synchronous API serves the model at the flex tier (OpenAI
    ``service_tier: "flex"``, billed at the Batch prices of the row); empty: unknown, which
    ``route: flex`` refuses (see docs/providers.md for the sources).
``shutdown``
    the date (``YYYY-MM-DD``) the provider stops serving the model (empty: none announced): a
    profile on it is refused from that day, and warned about in the 30 days before.
``successor``
    the model the provider names as its replacement (empty: none named).
``notes``
    where each figure came from and what could not be verified.

A user's catalogue file is validated with the same rules; a column the user's header leaves out
is taken from the shipped row of the same model (so a price-only override keeps the model's rules).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from batchgrader.core.configuration.config import REASONING_EFFORTS
from batchgrader.core.configuration.providers import PROVIDER_FACTS

__all__ = [
    "EFFORTS",
    "SPEC_COLUMNS",
    "CatalogueFormatError",
    "ModelSpec",
    "parse_spec",
]

SPEC_COLUMNS = (
    "provider",
    "aliases",
    "cache_write_per_1m",
    "standard_input_per_1m",
    "standard_cached_input_per_1m",
    "standard_output_per_1m",
    "max_output",
    "reasoning",
    "reasoning_efforts",
    "reasoning_default",
    "reasoning_bound",
    "temperature",
    "output_param",
    "structured_output",
    "min_cache_prefix",
    "flex",
    "endpoint",
    "shutdown",
    "successor",
    "notes",
)

#: every reasoning effort a profile may name, least to most
EFFORTS = REASONING_EFFORTS
PROVIDERS = tuple(name for name, f in PROVIDER_FACTS.items() if f.in_catalogue)  # core/configuration/providers.py
CONTROLS = ("effort", "budget", "level")
TEMPERATURE_RULES = ("any", "default", "effort-none", "deprecated")
ENDPOINTS = ("responses", "both", "embeddings")
OUTPUT_PARAMS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


class CatalogueFormatError(ValueError):
    """A catalogue cell is malformed (the message names the column; the caller adds file and line)."""


@dataclass(frozen=True)
class ModelSpec:
    """A model's rules; every field ``None`` (or empty) means unknown, which nothing checks."""

    provider: str | None = None
    aliases: tuple[str, ...] = ()
    cache_write_per_1m: float | None = None
    standard_input_per_1m: float | None = None
    standard_cached_input_per_1m: float | None = None
    standard_output_per_1m: float | None = None
    max_output: int | None = None
    reasoning: str | None = None
    reasoning_efforts: tuple[str, ...] = ()
    reasoning_default: str | None = None
    reasoning_bound: int | None = None
    temperature: str = "any"
    output_param: str | None = None
    structured_output: bool | None = None
    min_cache_prefix: int | None = None
    flex: bool | None = None
    #: OpenAI's endpoints serving the model: "responses" (the Responses API only), "both" (chat
    #: completions and Responses), "embeddings" (an embedding model: ``/v1/embeddings`` only),
    #: None (chat completions; Responses not known)
    endpoint: str | None = None
    shutdown: str | None = None  # YYYY-MM-DD
    successor: str | None = None
    notes: str | None = None

    @property
    def serves_chat(self) -> bool:
        """Whether OpenAI serves the model on ``/v1/chat/completions`` (not a Responses-only model)."""
        return self.endpoint not in ("responses", "embeddings")

    @property
    def embeddings(self) -> bool:
        """Whether the model is an embedding model (served on ``/v1/embeddings`` only)."""
        return self.endpoint == "embeddings"

    @property
    def serves_responses(self) -> bool:
        """Whether the catalogue says OpenAI serves the model on ``/v1/responses``."""
        return self.endpoint in ("responses", "both")

    def effective_effort(self, setting: str | None) -> str | None:
        """The effort a request runs at: the setting, else the model's default (None: no reasoning)."""
        if self.reasoning is None:
            return None
        return setting or self.reasoning_default

    def reasons(self, setting: str | None) -> bool:
        """Whether a request may spend reasoning tokens under ``setting``."""
        effort = self.effective_effort(setting)
        return effort is not None and effort != "none"


def _choice(text: str, column: str, allowed: tuple[str, ...]) -> str | None:
    if not text:
        return None
    if text not in allowed:
        raise CatalogueFormatError(f"column {column!r}: {text!r} must be one of {', '.join(allowed)}, or empty")
    return text


def _whole(text: str, column: str) -> int | None:
    text = text.replace(",", "").replace("_", "")
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise CatalogueFormatError(f"column {column!r}: {text!r} must be a whole number of tokens >= 1, or empty")
    return int(text)


def _price(text: str, column: str) -> float | None:
    import math

    text = text.lstrip("$").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise CatalogueFormatError(f"column {column!r}: {text!r} is not a number (USD per 1M tokens, e.g. 0.075)") from None
    if not math.isfinite(value) or value < 0:
        raise CatalogueFormatError(f"column {column!r}: {text!r} must be a finite price >= 0")
    return value


def _efforts(text: str, column: str) -> tuple[str, ...]:
    out = tuple(e.strip() for e in text.split("|") if e.strip())
    bad = [e for e in out if e not in EFFORTS]
    if bad:
        raise CatalogueFormatError(f"column {column!r}: {', '.join(map(repr, bad))} not among {', '.join(EFFORTS)}")
    return out


def _yes_no(text: str, column: str) -> bool | None:
    if not text:
        return None
    if text.lower() not in ("yes", "no"):
        raise CatalogueFormatError(f"column {column!r}: {text!r} must be yes or no, or empty")
    return text.lower() == "yes"


def _parse_cell(column: str, text: str) -> Any:
    text = text.strip()
    if column == "provider":
        return _choice(text, column, PROVIDERS)
    if column == "aliases":
        return tuple(a.strip().lower() for a in text.split("|") if a.strip())
    if column.endswith("_per_1m"):
        return _price(text, column)
    if column in ("max_output", "reasoning_bound", "min_cache_prefix"):
        return _whole(text, column)
    if column == "reasoning":
        return None if text in ("", "none") else _choice(text, column, CONTROLS)
    if column == "reasoning_efforts":
        return _efforts(text, column)
    if column == "reasoning_default":
        return _choice(text, column, (*EFFORTS, "auto"))
    if column == "temperature":
        return _choice(text, column, TEMPERATURE_RULES) or "any"
    if column == "output_param":
        return _choice(text, column, OUTPUT_PARAMS)
    if column in ("structured_output", "flex"):
        return _yes_no(text, column)
    if column == "endpoint":
        return _choice(text, column, ENDPOINTS)
    if column == "shutdown":
        return _date(text, column)
    if column == "successor":
        return text.lower() or None
    return text or None  # notes


def _date(text: str, column: str) -> str | None:
    if not text:
        return None
    import datetime

    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise CatalogueFormatError(f"column {column!r}: {text!r} must be a date YYYY-MM-DD, or empty") from None


def _coherent(spec: ModelSpec) -> None:
    if spec.reasoning is None and (spec.reasoning_efforts or spec.reasoning_default not in (None, "none")):
        raise CatalogueFormatError("column 'reasoning': empty, yet the row names reasoning efforts or a default")
    if spec.reasoning is not None and not spec.reasoning_efforts:
        raise CatalogueFormatError(f"column 'reasoning_efforts': a model with reasoning {spec.reasoning!r} needs its efforts")
    if spec.temperature == "effort-none" and "none" not in spec.reasoning_efforts:
        raise CatalogueFormatError("column 'temperature': 'effort-none' needs 'none' among the reasoning_efforts")
    if spec.max_output and spec.reasoning_bound and spec.reasoning_bound > spec.max_output:
        raise CatalogueFormatError(f"column 'reasoning_bound': {spec.reasoning_bound} is above the max_output {spec.max_output}")


def parse_spec(cells: Mapping[str, str], base: ModelSpec | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of one CSV row; a column absent from ``cells`` keeps ``base``'s value.
    Raises :class:`CatalogueFormatError` naming the column."""
    values = {f.name: getattr(base or ModelSpec(), f.name) for f in fields(ModelSpec)}
    for column in SPEC_COLUMNS:
        if column in cells:
            values[column] = _parse_cell(column, cells[column] or "")
    spec = ModelSpec(**values)
    _coherent(spec)
    return spec

"""Requests laid out for the providers' prompt caches.

Every request of a job is the same object but for its ``custom_id`` and the row's user message
(see ``prepare.LineTemplate``): the shared part (system prompt with the examples, then the
response schema and the other per-job parameters) comes first and is byte-identical across rows,
the row's text last.  On that layout each provider caches the shared part:

* **OpenAI** caches prompts of 1,024 tokens or more automatically; each request carries a
  ``prompt_cache_key`` per job and profile (:func:`cache_key`) so that the job's requests are
  routed to the same cache.  Azure OpenAI gets no key (it documents the parameter only for its
  newest model families; its caching is automatic).
* **Anthropic** caches only what a request marks: the adapter
  (``provider/anthropic_api.to_anthropic_request``) puts ``cache_control: {"type": "ephemeral"}``
  on the system prompt of a request that carries a ``prompt_cache_key``, which the pipeline sets
  only when the shared part is at least the model's minimum cacheable prefix (the catalogue's
  ``min_cache_prefix``; a model without one is marked, since a too-short mark costs nothing).
* **Gemini** caches implicitly (2.5 and later models); its adapter drops the key.

With ``schema_column`` (``pipeline/rowschema.py``) the rows' requests carry their own schemas:
OpenAI puts "the output schema [as] a prefix to the system message", so only requests with the
same schema share a cached prefix (the key stays one per job: the provider routes by the key and
the prefix together).  With ``prompt_caching: false`` no request carries a key, so nothing is marked.  The key is left
out of the request key (``answerkey``): it routes the request, it does not shape the answer.
"""

from __future__ import annotations

import hashlib
from typing import Any

from batchgrader.core.configuration.providers import PROVIDER_FACTS
from batchgrader.pipeline.tokens import REPLY_PRIMING_TOKENS, ChatTokenCounter

#: the body field that carries the job's cache key (OpenAI's own parameter name)
CACHE_KEY_FIELD = "prompt_cache_key"
#: providers whose requests may be sent with the key (core/configuration/providers.py ``cache_key``; the others' never are)
KEYED_PROVIDERS = frozenset(name for name, f in PROVIDER_FACTS.items() if f.cache_key)


def cache_key(profile_name: str, file_hash: str) -> str:
    """The job's prompt-cache key: the same for every request of one file under one profile."""
    digest = hashlib.sha256(f"{profile_name}\0{file_hash}".encode()).hexdigest()
    return f"bg-{digest[:32]}"


def shared_prefix_tokens(system: str | None, model: str, default_encoding: str) -> int:
    """Tokens of the shared part a provider can cache (the system message with the examples),
    counted as the pipeline counts prompts; 0 without a system prompt."""
    if not system:
        return 0
    counter = ChatTokenCounter(model, default_encoding, num_threads=1)
    return counter.count([{"role": "system", "content": system}]) - REPLY_PRIMING_TOKENS


def marks_prefix(provider: str, prefix_tokens: int, min_cache_prefix: int | None) -> bool:
    """Whether a request is sent with the cache key: always for OpenAI (its cache is automatic;
    the key only routes), and for Anthropic when the shared part reaches the model's minimum
    (unknown minimum: marked).  Gemini's key is dropped by its adapter, so it is not set."""
    facts = PROVIDER_FACTS.get(provider)
    rule = facts.cache_key if facts is not None else None
    if rule == "always":
        return True
    if rule == "shared_prefix":
        return prefix_tokens > 0 and (min_cache_prefix is None or prefix_tokens >= min_cache_prefix)
    return False


def caching_fields(profile: Any, system: str | None, file_hash: str, min_cache_prefix: int | None) -> dict[str, str]:
    """The body fields that lay one job's requests out for caching (empty when caching is off,
    or does not apply)."""
    if not profile.get("prompt_caching", True):
        return {}
    provider = str(profile.get("provider") or "openai")
    if provider not in KEYED_PROVIDERS:
        return {}
    prefix = 0
    if PROVIDER_FACTS[provider].cache_key == "shared_prefix":
        prefix = shared_prefix_tokens(system, profile.model, profile.default_encoding)
    if not marks_prefix(provider, prefix, min_cache_prefix):
        return {}
    return {CACHE_KEY_FIELD: cache_key(profile.name, file_hash)}

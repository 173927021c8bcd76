"""The emulators' prompt caches (SIMULATED): which part of a request's prompt is read from the
provider's cache, or written to it, under each provider's rules.

Each batch has its own cache, filled in request order (the first request with a prefix misses or
writes it, later ones read it), so a batch's results are the same after an emulator restart.
Real caches also serve later batches for a few minutes; the emulator does not model that.

* OpenAI (``validation._Planner``): automatic for prompts of 1,024 tokens or more; the
  shared prefix (the first message) is cached in 128-token increments, keyed by the model, the
  prefix and the ``prompt_cache_key`` when one is sent.
* Anthropic (:func:`anthropic_cache_split`): only a ``cache_control`` breakpoint caches, and only
  a prefix of at least the model's minimum (the catalogue's ``min_cache_prefix``; 1,024 for a
  model without one); the first request writes it (``cache_creation_input_tokens``), later ones
  read it (``cache_read_input_tokens``); keyed by the model and the exact prefix text.
* Gemini (:func:`gemini_cached_tokens`): implicit caching of the system instruction on models of
  the catalogue (2.5 and later) with at least the model's minimum (``min_cache_prefix``; 4,096
  for one without it), reported as ``cachedContentTokenCount``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from batchgrader.pipeline.catalogue import shipped_spec

OPENAI_MIN_PREFIX = 1024
OPENAI_INCREMENT = 128
ANTHROPIC_DEFAULT_MIN = 1024
GEMINI_DEFAULT_MIN = 4096
#: the tokenizer the Anthropic and Gemini emulators count with (theirs are not public)
STAND_IN = "gpt-4o"

#: one batch's cache: the keys of the prefixes written so far
BatchCache = set[tuple[str, ...]]
#: tokens of a system text, counted as the emulator counts a system message
SystemTokens = Callable[[str], int]


def system_tokens(text: str) -> int:
    """Tokens of a system text as the Anthropic and Gemini emulators count a system message (with
    the ``gpt-4o`` tokenizer standing in for theirs), without the reply priming."""
    from batchgrader.emulator.answers import _counter_for
    from batchgrader.pipeline.tokens import REPLY_PRIMING_TOKENS

    return int(_counter_for(STAND_IN).count([{"role": "system", "content": text}])) - REPLY_PRIMING_TOKENS


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def openai_cached_tokens(
    seen: BatchCache, model: str, prompt_tokens: int, prefix: str, prefix_tokens: Callable[[], int], cache_key: Any
) -> int:
    """Cached tokens of an OpenAI request whose shared prefix (first message, as JSON) is ``prefix``."""
    if prompt_tokens < OPENAI_MIN_PREFIX:
        return 0
    key = ("openai", model, str(cache_key or ""), _digest(prefix))
    if key not in seen:
        seen.add(key)
        return 0
    cached = min(prompt_tokens, prefix_tokens()) // OPENAI_INCREMENT * OPENAI_INCREMENT
    return cached if cached >= OPENAI_MIN_PREFIX else 0


def anthropic_prefix(system: Any) -> str | None:
    """The text up to and including the last system block with a ``cache_control`` breakpoint."""
    if not isinstance(system, list):
        return None
    texts: list[str] = []
    marked: str | None = None
    for block in system:
        if not isinstance(block, dict):
            continue
        texts.append(str(block.get("text") or ""))
        if isinstance(block.get("cache_control"), dict):
            marked = "".join(texts)
    return marked


def anthropic_cache_split(seen: BatchCache, model: str, system: Any, tokens_of: SystemTokens) -> tuple[int, int]:
    """``(cache_write_tokens, cache_read_tokens)`` of one Message Batches request."""
    prefix = anthropic_prefix(system)
    if prefix is None:
        return 0, 0
    n = tokens_of(prefix)
    if n < (shipped_spec(model).min_cache_prefix or ANTHROPIC_DEFAULT_MIN):
        return 0, 0
    key = ("anthropic", model, _digest(prefix))
    if key in seen:
        return 0, n
    seen.add(key)
    return n, 0


def gemini_min_prefix(model: str) -> int | None:
    """The implicit-cache minimum of a Gemini model (None: the model is not known to cache)."""
    spec = shipped_spec(model)
    if spec.provider != "gemini":
        return None
    return spec.min_cache_prefix or GEMINI_DEFAULT_MIN


def gemini_cached_tokens(seen: BatchCache, model: str, system_text: str, tokens_of: SystemTokens) -> int:
    """``cachedContentTokenCount`` of one Gemini request whose system instruction is ``system_text``."""
    least = gemini_min_prefix(model)
    if least is None or not system_text:
        return 0
    n = tokens_of(system_text)
    if n < least:
        return 0
    key = ("gemini", model, _digest(system_text))
    if key in seen:
        return n
    seen.add(key)
    return 0

"""Anthropic Message Batches through the official ``anthropic`` SDK, in the project's terms.

The pipeline writes OpenAI-shaped batch lines (``{"custom_id", "method", "url", "body"}``) and
parses OpenAI-shaped result lines (:mod:`batchgrader.pipeline.results`).  This adapter maps
both ways, so nothing upstream or downstream knows which provider ran the batch:

* :func:`to_anthropic_request`: a chat-completions line -> ``{"custom_id", "params"}``
  (system messages -> ``system``; ``max_completion_tokens``/``max_tokens`` -> ``max_tokens``;
  a ``json_schema`` ``response_format`` -> ``output_config.format``; a ``prompt_cache_key`` ->
  ``cache_control: {"type": "ephemeral"}`` on the system prompt, which the pipeline sets only when
  the shared part is at least the model's minimum cacheable prefix).
* :func:`to_openai_result_line`: one Anthropic result -> one OpenAI output/error line.
  ``succeeded`` -> status 200 with a ``chat.completion`` body whose usage counts every input
  token (``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``), cached
  tokens (cache reads) and thinking tokens (as reasoning tokens); the provider's own usage is
  kept verbatim under ``anthropic_usage``.  ``errored`` -> the error's HTTP status and message;
  ``canceled`` / ``expired`` -> ``batch_cancelled`` / ``batch_expired`` (not run, resubmittable).
* :class:`AnthropicProvider`: create (requests inline, no file upload), retrieve, list, cancel,
  results and count_tokens.  Reconciling a create whose outcome is unknown (Anthropic batches
  carry no metadata) is :meth:`AnthropicBatchProvider.find_batches` in ``anthropic_batches``
  (the matching rule in docs/providers.md).

Limits (Anthropic docs, checked 2026-11-23): at most 100,000 requests or 256 MB per batch;
``custom_id`` 1-64 characters of ``[a-zA-Z0-9_-]``; results downloadable for 29 days.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anthropic

from batchgrader.core.configuration.providers import ANTHROPIC_DEFAULT_API_VERSION
from batchgrader.core.host.secrets import mask_secret
from batchgrader.pipeline.caching import CACHE_KEY_FIELD
from batchgrader.pipeline.catalogue import anthropic_thinking
from batchgrader.provider.openai_api import (
    OutcomeUnknown,
    ProviderConfigError,
    ProviderRejected,
    ProviderUnavailable,
)
from batchgrader.provider.protocol import MAX_SDK_WAIT_S, READ_RETRIES, content_text, parse_retry_after
from batchgrader.provider.tls import httpx_context

CUSTOM_ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_REQUESTS = 100_000
MAX_BATCH_BYTES = 256 * 1024 * 1024
RESULTS_KEPT_DAYS = 29
DEFAULT_MAX_TOKENS = 1024
#: the breakpoint that caches everything up to and including the block it is on (5-minute cache)
CACHE_MARK = {"cache_control": {"type": "ephemeral"}}

#: Anthropic error type -> the HTTP status the Messages API answers it with
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
STOP_TO_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def finish_reason(stop_reason: Any) -> str | None:
    """An Anthropic ``stop_reason`` in OpenAI's terms; one not known here is kept as it is
    (``pause_turn``, ...), so the row fails as ``unexpected_finish`` rather than pass as an answer."""
    if stop_reason is None:
        return None
    return STOP_TO_FINISH.get(str(stop_reason), str(stop_reason))


def custom_id_problem(custom_id: str) -> str | None:
    """Why Anthropic would refuse this custom_id, or None."""
    if not CUSTOM_ID_RE.match(custom_id):
        return f"custom_id {custom_id!r} must be 1-64 characters of letters, digits, '-' or '_' (Anthropic's rule)"
    return None


def to_anthropic_request(line: Mapping[str, Any]) -> dict[str, Any]:
    """One OpenAI chat-completions batch line -> one Message Batches request."""
    body = line["body"]
    system = [content_text(m.get("content")) for m in body.get("messages", []) if m.get("role") in ("system", "developer")]
    messages = [
        {"role": m["role"], "content": m["content"]} for m in body.get("messages", []) if m.get("role") in ("user", "assistant")
    ]
    params: dict[str, Any] = {
        "model": body["model"],
        "max_tokens": int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS),
        "messages": messages,
    }
    if system:
        text = "\n\n".join(system)
        # the pipeline sets a cache key only on a shared part long enough to cache (pipeline/caching.py)
        params["system"] = [{"type": "text", "text": text, **CACHE_MARK}] if body.get(CACHE_KEY_FIELD) else text
    if body.get("temperature") is not None:
        params["temperature"] = min(float(body["temperature"]), 1.0)  # Anthropic's range is 0..1
    params.update(anthropic_thinking(body["model"], body.get("reasoning_effort")))
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema") or {"type": "object"}
        params["output_config"] = {**params.get("output_config", {}), "format": {"type": "json_schema", "schema": schema}}
    return {"custom_id": line["custom_id"], "params": params}


def to_openai_result_line(item: Mapping[str, Any]) -> dict[str, Any]:
    """One Anthropic batch result (as JSON) -> one OpenAI batch output/error line."""
    cid = item["custom_id"]
    result = item["result"]
    kind = result["type"]
    if kind == "succeeded":
        msg = result["message"]
        u = msg.get("usage") or {}
        cache_read = int(u.get("cache_read_input_tokens") or 0)
        cache_write = int(u.get("cache_creation_input_tokens") or 0)
        prompt = int(u.get("input_tokens") or 0) + cache_read + cache_write
        completion = int(u.get("output_tokens") or 0)
        thinking = int((u.get("output_tokens_details") or {}).get("thinking_tokens") or 0)
        text = "".join(b.get("text", "") for b in msg.get("content", []) if b.get("type") == "text")
        body = {
            "id": msg.get("id"),
            "object": "chat.completion",
            "model": msg.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "finish_reason": finish_reason(msg.get("stop_reason")),
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cache_read, "cache_write_tokens": cache_write},
                "completion_tokens_details": {"reasoning_tokens": thinking},
            },
            "anthropic_usage": u,
        }
        return {"custom_id": cid, "response": {"status_code": 200, "body": body}, "error": None}
    if kind == "errored":
        err = (result.get("error") or {}).get("error") or {}
        etype = err.get("type") or "api_error"
        status = ERROR_STATUS.get(etype, 500)
        body = {"error": {"message": err.get("message") or etype, "type": etype, "param": None, "code": etype}}
        return {"custom_id": cid, "response": {"status_code": status, "body": body}, "error": None}
    code = {"canceled": "batch_cancelled", "expired": "batch_expired"}.get(kind)
    if code is None:
        raise ValueError(f"unknown Anthropic result type {kind!r} for custom_id {cid!r}")
    return {"custom_id": cid, "response": None, "error": {"code": code, "message": f"request {kind} by Anthropic"}}


# ----------------------------------------------------------------------------------------------
# the batch in the project's terms
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnthropicBatch:
    """A Message Batch: ``status`` is Anthropic's ``processing_status``
    (``in_progress`` / ``canceling`` / ``ended``)."""

    id: str
    status: str
    created_at: int
    total: int
    succeeded: int
    errored: int
    canceled: int
    expired: int
    processing: int
    ended_at: int | None
    results_url: str | None

    @property
    def is_terminal(self) -> bool:
        return self.status == "ended"

    @property
    def job_status(self) -> str:
        """The job model's name for this state: in_progress, cancelling, completed,
        cancelled (a cancel ended it) or expired (requests ran out of time)."""
        if self.status == "in_progress":
            return "in_progress"
        if self.status == "canceling":
            return "cancelling"
        if self.canceled:
            return "cancelled"
        if self.expired:
            return "expired"
        return "completed"


def _ts(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, datetime):
        return int(v.timestamp())
    return int(datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp())


def _batch(obj: Any) -> AnthropicBatch:
    c = obj.request_counts
    total = c.processing + c.succeeded + c.errored + c.canceled + c.expired
    return AnthropicBatch(
        id=obj.id,
        status=obj.processing_status,
        created_at=_ts(obj.created_at) or 0,
        total=total,
        succeeded=c.succeeded,
        errored=c.errored,
        canceled=c.canceled,
        expired=c.expired,
        processing=c.processing,
        ended_at=_ts(obj.ended_at),
        results_url=obj.results_url,
    )


def _no_long_waits(response: Any) -> None:
    """The anthropic SDK (2.14, ``_base_client._calculate_retry_timeout``) waits whatever
    Retry-After an answer asks, where the openai SDK retries only within 120 s: an answer asking
    for longer is marked ``x-should-retry: false`` (a header the SDK obeys), so the call ends and
    the wait reaches the engine (``retry_after``) instead of holding the daemon's tick."""
    wait = parse_retry_after(response.headers)
    if wait is not None and wait > MAX_SDK_WAIT_S:
        response.headers["x-should-retry"] = "false"


class AnthropicProvider:
    """Calls the Message Batches API. Reads are retried by the SDK (``max_retries``,
    :data:`~batchgrader.provider.protocol.READ_RETRIES` by default); ``create`` and ``cancel`` are
    sent once (``max_retries=0``): a connection error or a 5xx answer to ``create`` raises
    :class:`OutcomeUnknown`, and the caller reconciles (``AnthropicBatchProvider.find_batches``)
    before sending again; to ``cancel``, :class:`ProviderUnavailable` (the engine asks again)."""

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None = None,
        *,
        timeout: float = 120.0,
        max_retries: int = READ_RETRIES,
        api_version: str | None = None,
    ):
        if not api_key:
            raise ProviderConfigError("no Anthropic API key: set ANTHROPIC_API_KEY in the environment or secrets.env")
        self._key = api_key
        #: the ``anthropic-version`` every call carries: the configured one, sent explicitly (the
        #: SDK's own default moves with its releases; the rules checked at load are this version's)
        self.api_version = api_version or ANTHROPIC_DEFAULT_API_VERSION
        # the SDK's HTTP client on the process's one TLS context of the SDK's own making (provider/tls.py)
        http = anthropic.DefaultHttpxClient(event_hooks={"response": [_no_long_waits]}, verify=httpx_context())
        self._client = anthropic.Anthropic(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            http_client=http,
            default_headers={"anthropic-version": self.api_version},
        )
        self._once = self._client.with_options(max_retries=0)

    def __repr__(self) -> str:
        return f"AnthropicProvider(api_key={mask_secret(self._key)!r})"

    def __reduce__(self) -> Any:  # never pickle a live client with its key
        raise TypeError("AnthropicProvider holds an API key and cannot be pickled")

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, mask_secret(self._key) or "***") if self._key else text

    def _call(self, op: str, fn: Any, *, idempotent: bool = True) -> Any:
        try:
            return fn()
        except anthropic.APIStatusError as e:
            err = (e.body or {}).get("error", {}) if isinstance(e.body, dict) else {}
            message = self._scrub(str(err.get("message") or e.message))
            if e.status_code >= 500 and not idempotent:
                raise OutcomeUnknown(op, f"HTTP {e.status_code}: {message}", status_code=e.status_code) from None
            if e.status_code >= 500:
                raise ProviderUnavailable(op, 1, f"HTTP {e.status_code}: {message}", status_code=e.status_code) from None
            raise ProviderRejected(
                op,
                e.status_code,
                message,
                type=err.get("type"),
                code=err.get("type"),
                retry_after=parse_retry_after(e.response.headers),  # a 429's wait (retry-after)
            ) from None
        except (anthropic.APIConnectionError, anthropic.APITimeoutError) as e:
            if not idempotent:
                raise OutcomeUnknown(op, self._scrub(f"{type(e).__name__}: {e}")) from None
            raise ProviderUnavailable(op, 1, self._scrub(f"{type(e).__name__}: {e}")) from None

    # --- calls -------------------------------------------------------------------------------

    def create(self, requests: list[dict[str, Any]]) -> AnthropicBatch:
        """Create a batch from Message Batches requests (see :func:`to_anthropic_request`)."""
        if not 1 <= len(requests) <= MAX_REQUESTS:
            raise ValueError(f"a Message Batch holds 1 to {MAX_REQUESTS:,} requests, not {len(requests):,}")
        for r in requests:
            problem = custom_id_problem(r["custom_id"])
            if problem:
                raise ValueError(problem)
        size = len(json.dumps({"requests": requests}).encode("utf-8"))
        if size > MAX_BATCH_BYTES:
            raise ValueError(f"a Message Batch holds at most 256 MB; these requests are {size:,} bytes")
        return _batch(
            self._call("create batch", lambda: self._once.messages.batches.create(requests=requests), idempotent=False)  # type: ignore[arg-type]
        )

    def retrieve(self, batch_id: str) -> AnthropicBatch:
        return _batch(self._call("retrieve batch", lambda: self._client.messages.batches.retrieve(batch_id)))

    def cancel(self, batch_id: str) -> AnthropicBatch:
        return _batch(self._call("cancel batch", lambda: self._once.messages.batches.cancel(batch_id)))

    def list_batches(self, limit: int = 100) -> Iterator[AnthropicBatch]:
        """Every batch, newest first (the SDK pages through ``after_id``)."""
        page = self._call("list batches", lambda: self._client.messages.batches.list(limit=limit))
        for obj in page:
            yield _batch(obj)

    def results(self, batch_id: str) -> Iterator[dict[str, Any]]:
        """The ended batch's results as OpenAI-shaped lines (:func:`to_openai_result_line`)."""
        decoder = self._call("batch results", lambda: self._client.messages.batches.results(batch_id))
        for item in decoder:
            yield to_openai_result_line(item.model_dump(mode="json"))

    def create_message(self, params: Mapping[str, Any]) -> Any:
        """``messages.create`` sent once with these Messages params.  Params the SDK's signature
        lacks (``temperature``, which anthropic >= 1.0 dropped; taken by API version 2023-06-01
        on the models whose catalogue row allows it) go in the body as they are."""
        import inspect

        known = set(inspect.signature(self._once.messages.create).parameters)
        kwargs = {k: v for k, v in params.items() if k in known}
        extra = {k: v for k, v in params.items() if k not in known}
        return self._once.messages.create(**kwargs, extra_body=extra or None)

    def count_tokens(self, model: str, line: Mapping[str, Any]) -> int:
        """Exact input tokens of one request, from the free ``messages.count_tokens`` endpoint."""
        p = to_anthropic_request(line)["params"]
        kwargs: dict[str, Any] = {"model": model, "messages": p["messages"]}
        if "system" in p:
            kwargs["system"] = p["system"]
        res = self._call("count tokens", lambda: self._client.messages.count_tokens(**kwargs))
        return int(res.input_tokens)


class AnthropicTokenCounter:
    """The counting hook (:class:`batchgrader.provider.counting.TokenCounter`) on Anthropic's
    free ``messages.count_tokens``: one call per request (the endpoint counts one message list),
    ``workers`` at a time."""

    def __init__(self, provider: AnthropicProvider, name: str = "anthropic", workers: int = 8):
        self.provider = provider
        self.name = name
        self.workers = max(1, workers)

    def __repr__(self) -> str:
        return f"AnthropicTokenCounter({self.name!r}, {self.provider!r})"

    def count_tokens(self, lines: Sequence[Mapping[str, Any]]) -> list[int]:
        from concurrent.futures import ThreadPoolExecutor

        def one(line: Mapping[str, Any]) -> int:
            return self.provider.count_tokens(str(line["body"]["model"]), line)

        if len(lines) <= 1 or self.workers == 1:
            return [one(line) for line in lines]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(lines))) as pool:
            return list(pool.map(one, lines))

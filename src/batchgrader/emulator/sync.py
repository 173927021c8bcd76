"""The providers' synchronous endpoints: one request, answered at once.

* OpenAI and Azure ``POST /v1/chat/completions`` (Azure:
  ``/openai/deployments/{deployment}/chat/completions?api-version=...``, the deployment's name as
  the model) -> a ``chat.completion``;
* OpenAI ``POST /v1/responses`` (the Responses API) -> a ``response``;
* OpenAI ``POST /v1/embeddings`` -> a ``CreateEmbeddingResponse`` (:mod:`batchgrader.emulator.embeddings`);
* Anthropic ``POST /v1/messages`` -> a ``Message``;
* Gemini ``POST /v1beta/models/{model}:generateContent`` -> a ``GenerateContentResponse``.

Each shares the batch path's per-request checks and answers: the request is checked as one line
of a batch input file (:func:`~batchgrader.emulator.validation.check_input`) and
answered by the same code as a batch's request (``answers.chat_answer``, ``anthropic.anthropic_result``, ``gemini.gemini_result``),
so a setting the batch path refuses or truncates is refused or truncated here the same way.  A
request that fails is an HTTP error with the provider's own error shape.

Per-minute limits (``EmulatorConfig.sync_requests_per_minute`` / ``sync_tokens_per_minute``, None:
none): the requests and tokens (an estimate: the body's characters / 4, plus its output bound) of
the last minute (``sync_limit_window_s``, 60 s unless a test shortens it) are counted per model; a request over either limit is refused with HTTP 429, a
``retry-after`` (whole seconds) and ``retry-after-ms`` giving when it would fit, and the provider's
rate-limit headers (OpenAI and Azure ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``;
Anthropic ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``).  Every synchronous
request is logged in :attr:`SyncLimits.log` (time, model, status, retry-after) for tests.

OpenAI ``service_tier``: ``"flex"`` is refused (400) for a model whose catalogue row has no flex
tier (:func:`~batchgrader.emulator.rules.openai_request_error`); the answer reports the
tier it was served at (``"flex"``, else ``"default"``).  Each synchronous request
is answered with a prompt cache of its own (the emulator caches prefixes within a batch only), so
no cache read is reported on this path.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from batchgrader.emulator import embeddings
from batchgrader.emulator.answers import chat_answer, responses_answer
from batchgrader.emulator.anthropic import AnthropicApiError, anthropic_error_type, anthropic_result
from batchgrader.emulator.common import ApiError
from batchgrader.emulator.config import CHAT_ENDPOINT, EMBEDDINGS_ENDPOINT, RESPONSES_ENDPOINT
from batchgrader.emulator.gemini import GeminiApiError, gemini_result
from batchgrader.emulator.rules import known_model, shut_down
from batchgrader.emulator.state import State
from batchgrader.emulator.validation import check_input, request_of


def _request_id(kind: str, body: Any) -> str:
    return hashlib.sha256(f"{kind}:{json.dumps(body, sort_keys=True, default=str)}".encode()).hexdigest()[:24]


class RateLimited(ApiError):
    """OpenAI's 429 for a per-minute limit, with its headers."""

    def __init__(self, message: str, headers: dict[str, str]):
        super().__init__(429, message, type="requests", code="rate_limit_exceeded")
        self.headers = headers


class AnthropicRateLimited(AnthropicApiError):
    """Anthropic's 429 ``rate_limit_error``, with its headers."""

    def __init__(self, message: str, headers: dict[str, str]):
        super().__init__(429, message, type="rate_limit_error")
        self.headers = headers


class GeminiRateLimited(GeminiApiError):
    """Gemini's 429 ``RESOURCE_EXHAUSTED``, with its Retry-After."""

    def __init__(self, message: str, headers: dict[str, str]):
        super().__init__(429, message)
        self.headers = headers


@dataclass(frozen=True)
class Refusal:
    """A request over a per-minute limit: which one, and when it would fit."""

    what: str  # requests | tokens
    limit: int
    used: int
    wait: float  # seconds
    requests: tuple[int | None, int, float]  # limit, remaining, reset (s)
    tokens: tuple[int | None, int, float]


@dataclass
class SyncLimits:
    """The last 60 s of synchronous requests per model, against the per-minute limits."""

    rpm: int | None
    tpm: int | None
    minute: float = 60.0  # the window's length (EmulatorConfig.sync_limit_window_s)
    window: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    log: list[tuple[float, str, int, float | None]] = field(default_factory=list)  # (time, model, status, retry-after)

    def admit(self, model: str, tokens: int, now: float) -> Refusal | None:
        """Count the request in (None), or the :class:`Refusal` when it is over a limit."""
        sent = self.window.setdefault(model, deque())
        while sent and sent[0][0] <= now - self.minute:
            sent.popleft()
        if self.tpm is not None:
            tokens = min(tokens, self.tpm)  # a request larger than the limit waits for an empty minute
        req_wait = self._request_wait(sent, now)
        used = sum(t for _, t in sent)
        tok_wait = self._token_wait(sent, used, tokens, now)
        reset_req = (sent[0][0] + self.minute - now) if sent else 0.0
        requests = (self.rpm, max(0, (self.rpm or 0) - len(sent)), max(req_wait, reset_req))
        tok = (self.tpm, max(0, (self.tpm or 0) - used), max(tok_wait, reset_req))
        if req_wait > 0 or tok_wait > 0:
            what = "requests" if req_wait >= tok_wait else "tokens"
            limit, in_use = (self.rpm or 0, len(sent)) if what == "requests" else (self.tpm or 0, used)
            refusal = Refusal(what, limit, in_use, max(req_wait, tok_wait), requests, tok)
            self.log.append((now, model, 429, refusal.wait))
            return refusal
        sent.append((now, tokens))
        self.log.append((now, model, 200, None))
        return None

    def _request_wait(self, sent: deque[tuple[float, int]], now: float) -> float:
        """How long until one more request fits the requests-per-minute limit (0: it does)."""
        if self.rpm is not None and len(sent) >= self.rpm:
            return sent[len(sent) - self.rpm][0] + self.minute - now
        return 0.0

    def _token_wait(self, sent: deque[tuple[float, int]], used: int, tokens: int, now: float) -> float:
        """How long until ``tokens`` more fit the tokens-per-minute limit (0: they do)."""
        if self.tpm is None or used + tokens <= self.tpm:
            return 0.0
        freed = 0
        for ts, t in sent:
            freed += t
            if used - freed + tokens <= self.tpm:
                return ts + self.minute - now
        return 0.0


def _reset(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``20ms``."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    m, sec = divmod(seconds, 60.0)
    return f"{int(m)}m{sec:.3g}s" if m else f"{sec:.3g}s"


def _retry_headers(r: Refusal) -> dict[str, str]:
    return {"retry-after": str(max(1, math.ceil(r.wait))), "retry-after-ms": str(max(1, math.ceil(r.wait * 1000)))}


def openai_limit_headers(r: Refusal) -> dict[str, str]:
    """The ``x-ratelimit-*`` headers (only the limits in force) and ``retry-after(-ms)``."""
    out = _retry_headers(r)
    for name, (limit, remaining, reset) in (("requests", r.requests), ("tokens", r.tokens)):
        if limit is not None:
            out[f"x-ratelimit-limit-{name}"] = str(limit)
            out[f"x-ratelimit-remaining-{name}"] = str(remaining)
            out[f"x-ratelimit-reset-{name}"] = _reset(reset)
    return out


def anthropic_limit_headers(r: Refusal, now: float) -> dict[str, str]:
    """The ``anthropic-ratelimit-*`` headers (reset as RFC 3339) and ``retry-after``."""
    out = {"retry-after": str(max(1, math.ceil(r.wait)))}
    for name, (limit, remaining, reset) in (("requests", r.requests), ("tokens", r.tokens)):
        if limit is not None:
            out[f"anthropic-ratelimit-{name}-limit"] = str(limit)
            out[f"anthropic-ratelimit-{name}-remaining"] = str(remaining)
            out[f"anthropic-ratelimit-{name}-reset"] = datetime.fromtimestamp(now + reset, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def _estimate_tokens(body: dict[str, Any]) -> int:
    """The tokens a request counts against a per-minute limit: its characters / 4 plus its output bound."""
    bound = (
        body.get("max_completion_tokens") or body.get("max_tokens") or (body.get("generationConfig") or {}).get("maxOutputTokens")
    )
    return len(json.dumps(body, default=str)) // 4 + int(bound or 0)


class Sync:
    """One request through each provider's synchronous API, with the batch path's checks and
    answers, under per-minute limits."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._limits: SyncLimits | None = None

    def chat_completion(self, body: Any, deployment: str | None = None) -> dict[str, Any]:
        """``POST /v1/chat/completions`` (with ``deployment``: Azure's, whose name is the model)."""
        return self._openai(body, CHAT_ENDPOINT, deployment)

    def response(self, body: Any) -> dict[str, Any]:
        """``POST /v1/responses``: the Responses API, with the checks and answers of a batch line
        targeting ``/v1/responses``."""
        if isinstance(body, dict) and body.get("background") is True:
            raise ApiError(
                400, "The emulator does not run responses in the background; send background=false.", param="background"
            )
        return self._openai(body, RESPONSES_ENDPOINT, None)

    def embeddings(self, body: Any) -> dict[str, Any]:
        """``POST /v1/embeddings``, with the checks and answers of a batch line targeting it."""
        return self._openai(body, EMBEDDINGS_ENDPOINT, None)

    def _openai(self, body: Any, endpoint: str, deployment: str | None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "We could not parse the JSON body of your request.")
        if deployment is not None and not body.get("model"):
            body = {**body, "model": deployment}
        model = str(body.get("model") or "")
        if model and not known_model(model, self.state.cfg):
            if deployment is not None:  # Azure: the deployment named in the path
                raise ApiError(
                    404,
                    "The API deployment for this resource does not exist. If you created the deployment within the last "
                    "5 minutes, please wait a moment and try again.",
                    code="DeploymentNotFound",
                )
            raise ApiError(404, f"The model `{model}` does not exist or you do not have access to it.", code="model_not_found")
        if deployment is None and (gone := shut_down(model, self.state.cfg)) is not None:
            raise ApiError(404, gone, code="model_not_found")
        if body.get("stream") is True:
            raise ApiError(400, "The emulator does not stream; send stream=false.", param="stream", code="unsupported_value")
        cid = "sync-" + _request_id("chat" if endpoint == CHAT_ENDPOINT else "responses", body)
        sent = body if endpoint == EMBEDDINGS_ENDPOINT else {**body, "stream": False}
        line = json.dumps({"custom_id": cid, "method": "POST", "url": endpoint, "body": sent})
        raw = line.encode("utf-8")
        checked = check_input(io.BytesIO(raw), endpoint, self.state.cfg, self.state.token_cache)
        if checked.errors:
            e = checked.errors[0]
            param = (e.get("param") or "").removeprefix("body.") or None
            raise ApiError(400, str(e["message"]), code=e.get("code"), param=param)
        assert checked.plan is not None and checked.model is not None
        req = request_of(checked.plan, 0, raw)
        if req.fail_status is not None:
            err = (req.fail_body or {}).get("error") or {}
            raise ApiError(
                req.fail_status,
                str(err.get("message") or "error"),
                code=err.get("code"),
                param=err.get("param"),
                type=err.get("type") or "invalid_request_error",
            )
        refusal = self._admit(checked.model, body)
        if refusal is not None:
            raise RateLimited(
                f"Rate limit reached for {checked.model} in organization {self.state.cfg.organization} on {refusal.what} per min "
                f"(RPM/TPM): Limit {refusal.limit}, Used {refusal.used}. Please try again in {refusal.wait:.3f}s.",
                openai_limit_headers(refusal),
            )
        if endpoint == EMBEDDINGS_ENDPOINT:
            return embeddings.answer(req, checked.model)
        answer = chat_answer if endpoint == CHAT_ENDPOINT else responses_answer
        with self.state.lock:
            out = answer(self.state.cfg, req, checked.model, int(self.state.clock()))
        if body.get("service_tier") == "flex":
            out = {**out, "service_tier": "flex"}
        return out

    def sync_limits(self) -> SyncLimits:
        """The per-minute limits' state (made at the first synchronous request)."""
        cfg = self.state.cfg
        with self.state.lock:
            if self._limits is None:
                self._limits = SyncLimits(cfg.sync_requests_per_minute, cfg.sync_tokens_per_minute, cfg.sync_limit_window_s)
            return self._limits

    def _admit(self, model: str, body: dict[str, Any]) -> Refusal | None:
        lim = self.sync_limits()
        with self.state.lock:
            return lim.admit(model, _estimate_tokens(body), self.state.clock())

    def message(self, body: Any, version: str | None = None) -> dict[str, Any]:
        """``POST /v1/messages``: the ``Message``, or the error its batch result would carry under
        API ``version`` (the request's ``anthropic-version``)."""
        if not isinstance(body, dict):
            raise AnthropicApiError(400, "There was an issue with your request body: not valid JSON.")
        model = str(body.get("model") or "")
        if model and not known_model(model, self.state.cfg):
            raise AnthropicApiError(404, f"model: {model}", type="not_found_error")
        refusal = self._admit(model, body)
        if refusal is not None:
            raise AnthropicRateLimited(
                f"This request would exceed the rate limit for your organization of {refusal.limit} {refusal.what} per minute. "
                "Please try again later.",
                anthropic_limit_headers(refusal, self.state.clock()),
            )
        cid = "sync_" + _request_id("msg", body)
        req = {"custom_id": cid, "params": body}
        result = anthropic_result(self.state.cfg, "msgsync_" + cid, req, set(), version)["result"]
        if result["type"] == "succeeded":
            msg = dict(result["message"])
            msg["usage"] = {**msg["usage"], "service_tier": "standard"}
            return msg
        err = result["error"]["error"]
        status = next((s for s in (400, 401, 403, 404, 413, 429, 500, 529) if anthropic_error_type(s) == err["type"]), 500)
        raise AnthropicApiError(status, str(err["message"]), type=err["type"])

    def generate_content(self, model: str, body: Any) -> dict[str, Any]:
        """``POST /v1beta/models/{model}:generateContent``."""
        model = model.removeprefix("models/")
        if not model.startswith("gemini-") or not known_model(model, self.state.cfg):
            raise GeminiApiError(
                404, f"models/{model} is not found for API version v1beta, or is not supported for generateContent."
            )
        if not isinstance(body, dict):
            raise GeminiApiError(400, "Invalid JSON payload received.")
        refusal = self._admit(model, body)
        if refusal is not None:
            raise GeminiRateLimited(
                f"Resource has been exhausted (e.g. check quota): {refusal.limit} {refusal.what} per minute.",
                _retry_headers(refusal),
            )
        key = _request_id("gen", body)
        out = gemini_result(self.state.cfg, model, "sync/" + key, {"key": key, "request": body}, set())
        if "error" in out:
            err = out["error"]
            status = {3: 400, 7: 403, 5: 404, 8: 429, 13: 500, 14: 503}.get(int(err["code"]), 500)
            raise GeminiApiError(status, str(err["message"]))
        return dict(out["response"])

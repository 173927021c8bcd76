"""The providers' synchronous endpoints: one request, answered at once.

* OpenAI and Azure ``POST /v1/chat/completions`` (Azure:
  ``/openai/deployments/{deployment}/chat/completions?api-version=...``, the deployment's name as
  the model) -> a ``chat.completion``;
* Anthropic ``POST /v1/messages`` -> a ``Message``;
* Gemini ``POST /v1beta/models/{model}:generateContent`` -> a ``GenerateContentResponse``.

Each shares the batch path's per-request checks and answers: the request is checked as one line
of a batch input file (:func:`~batchgrader.provider.emulator.validation.check_input`) and
answered by the same code as a batch's request (``_answer``, ``_msg_result``, ``_gem_result``),
so a setting the batch path refuses or truncates is refused or truncated here the same way.  A
request that fails is an HTTP error with the provider's own error shape.  Each synchronous request
is answered with a prompt cache of its own (the emulator caches prefixes within a batch only), so
no cache read is reported on this path.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from typing import Any

from batchgrader.provider.emulator.answers import AnswersMixin
from batchgrader.provider.emulator.anthropic import AnthropicApiError, AnthropicMixin, anthropic_error_type
from batchgrader.provider.emulator.common import ApiError
from batchgrader.provider.emulator.config import CHAT_ENDPOINT
from batchgrader.provider.emulator.gemini import GeminiApiError, GeminiMixin
from batchgrader.provider.emulator.validation import check_input, request_of


@dataclass(frozen=True)
class _One:
    """What the batch path's answer code reads of its batch, for one synchronous request."""

    id: str
    name: str
    model: str


def _request_id(kind: str, body: Any) -> str:
    return hashlib.sha256(f"{kind}:{json.dumps(body, sort_keys=True, default=str)}".encode()).hexdigest()[:24]


class SyncMixin(AnswersMixin, AnthropicMixin, GeminiMixin):
    """One request through the synchronous API, with the batch path's checks and answers."""

    def chat_completion(self, body: Any, deployment: str | None = None) -> dict[str, Any]:
        """``POST /v1/chat/completions`` (with ``deployment``: Azure's, whose name is the model)."""
        if not isinstance(body, dict):
            raise ApiError(400, "We could not parse the JSON body of your request.")
        if deployment is not None and not body.get("model"):
            body = {**body, "model": deployment}
        if body.get("stream") is True:
            raise ApiError(400, "The emulator does not stream; send stream=false.", param="stream", code="unsupported_value")
        cid = "sync-" + _request_id("chat", body)
        line = json.dumps({"custom_id": cid, "method": "POST", "url": CHAT_ENDPOINT, "body": {**body, "stream": False}})
        raw = line.encode("utf-8")
        checked = check_input(io.BytesIO(raw), CHAT_ENDPOINT, self.cfg, self.token_cache)
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
        with self.lock:
            return self._answer(req, checked.model, int(self.clock()))

    def message(self, body: Any) -> dict[str, Any]:
        """``POST /v1/messages``: the ``Message``, or the error its batch result would carry."""
        if not isinstance(body, dict):
            raise AnthropicApiError(400, "There was an issue with your request body: not valid JSON.")
        cid = "sync_" + _request_id("msg", body)
        one = _One("msgsync_" + cid, cid, str(body.get("model") or ""))
        result = self._msg_result(one, {"custom_id": cid, "params": body}, set())["result"]  # type: ignore[arg-type]
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
        if not model.startswith("gemini-"):
            raise GeminiApiError(
                404, f"models/{model} is not found for API version v1beta, or is not supported for generateContent."
            )
        if not isinstance(body, dict):
            raise GeminiApiError(400, "Invalid JSON payload received.")
        key = _request_id("gen", body)
        out = self._gem_result(_One(key, "sync/" + key, model), {"key": key, "request": body}, set())  # type: ignore[arg-type]
        if "error" in out:
            err = out["error"]
            status = {3: 400, 7: 403, 5: 404, 8: 429, 13: 500, 14: 503}.get(int(err["code"]), 500)
            raise GeminiApiError(status, str(err["message"]))
        return dict(out["response"])

"""The Gemini Batch API through the official ``google-genai`` SDK, in the project's terms.

The pipeline writes OpenAI-shaped batch lines (``{"custom_id", "method", "url", "body"}``) and
parses OpenAI-shaped result lines (:mod:`batchgrader.pipeline.results`).  This adapter maps
both ways, so nothing upstream or downstream knows which provider ran the batch:

* :func:`to_gemini_line`: a chat-completions line -> ``{"key": custom_id, "request": {...}}``, a
  line of the JSONL input file.  The request is a ``GenerateContentRequest``: system messages ->
  ``systemInstruction``; user/assistant -> ``contents`` with roles ``user``/``model``;
  ``max_completion_tokens``/``max_tokens`` -> ``generationConfig.maxOutputTokens``;
  ``temperature``; a ``json_schema`` ``response_format`` -> ``responseMimeType:
  application/json`` plus ``responseJsonSchema`` (the JSON Schema field, which takes the
  project's strict schemas as they are; ``responseSchema`` takes only an OpenAPI subset).
* :func:`to_openai_result_line`: one output-file line -> one OpenAI output/error line.  A
  ``response`` -> status 200 with a ``chat.completion`` body whose usage is the provider's
  ``usageMetadata``: ``prompt_tokens`` = ``promptTokenCount`` (it includes the cached tokens),
  ``cached_tokens`` = ``cachedContentTokenCount``, ``completion_tokens`` =
  ``candidatesTokenCount + thoughtsTokenCount`` (thinking is billed as output) and
  ``reasoning_tokens`` = ``thoughtsTokenCount``; the provider's own usage is kept verbatim
  under ``gemini_usage``.  An ``error`` (a ``google.rpc.Status``) -> its HTTP status and message.
  A prompt blocked by the safety filters (no candidate) -> a 400 ``refused`` error.
* :class:`GeminiBatch`: a batch job in the project's terms (``JOB_STATE_*`` -> the job model).

Limits (Gemini API docs, https://ai.google.dev/gemini-api/docs/batch-api, checked 2026-11-23):
inline requests up to 20 MB in total, larger jobs as an uploaded JSONL file; the Files API
(https://ai.google.dev/gemini-api/docs/files, checked 2026-11-23) keeps uploaded files 48 hours,
at most 2 GB each.  Not confirmed from a stored page: batches still pending or running after
48 hours expire (:data:`JOB_EXPIRY_S`; docs/providers.md says what was searched).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from batchgrader.pipeline.catalogue import gemini_thinking
from batchgrader.provider.protocol import content_text

DEFAULT_MAX_TOKENS = 1024
MAX_INLINE_BYTES = 20 * 1024 * 1024
MAX_FILE_BYTES = 2 * 1024 * 1024 * 1024
JOB_EXPIRY_S = 48 * 3600
FILE_KEPT_S = 48 * 3600
MAX_KEY_CHARS = 512  # our own bound: the API documents none for ``key``

#: google.rpc.Code (gRPC) -> the HTTP status the REST API answers it with
GRPC_TO_HTTP = {
    1: 499,  # CANCELLED
    2: 500,  # UNKNOWN
    3: 400,  # INVALID_ARGUMENT
    4: 504,  # DEADLINE_EXCEEDED
    5: 404,  # NOT_FOUND
    6: 409,  # ALREADY_EXISTS
    7: 403,  # PERMISSION_DENIED
    8: 429,  # RESOURCE_EXHAUSTED
    9: 400,  # FAILED_PRECONDITION
    10: 409,  # ABORTED
    11: 400,  # OUT_OF_RANGE
    12: 501,  # UNIMPLEMENTED
    13: 500,  # INTERNAL
    14: 503,  # UNAVAILABLE
    15: 500,  # DATA_LOSS
    16: 401,  # UNAUTHENTICATED
}
FINISH_TO_OPENAI = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
#: JOB_STATE_* (the SDK's names for the API's BATCH_STATE_*) -> the job model's batch status
STATE_TO_STATUS = {
    "JOB_STATE_UNSPECIFIED": "validating",
    "JOB_STATE_QUEUED": "validating",
    "JOB_STATE_PENDING": "validating",
    "JOB_STATE_RUNNING": "in_progress",
    "JOB_STATE_UPDATING": "in_progress",
    "JOB_STATE_PAUSED": "in_progress",
    "JOB_STATE_CANCELLING": "cancelling",
    "JOB_STATE_SUCCEEDED": "completed",
    "JOB_STATE_PARTIALLY_SUCCEEDED": "completed",
    "JOB_STATE_FAILED": "failed",
    "JOB_STATE_CANCELLED": "cancelled",
    "JOB_STATE_EXPIRED": "expired",
}


def key_problem(custom_id: str) -> str | None:
    """Why a ``custom_id`` cannot be a Gemini batch line's ``key``, or None."""
    if not custom_id or len(custom_id) > MAX_KEY_CHARS:
        return f"custom_id {custom_id!r} must be 1-{MAX_KEY_CHARS} characters to be a Gemini batch key"
    return None


def to_gemini_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat-completions body -> a Gemini ``GenerateContentRequest`` (REST JSON)."""
    messages = body.get("messages") or []
    system = [content_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")]
    contents = [
        {"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": content_text(m.get("content"))}]}
        for m in messages
        if m.get("role") in ("user", "assistant")
    ]
    request: dict[str, Any] = {"contents": contents}
    if system:
        request["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    gen: dict[str, Any] = {
        "maxOutputTokens": int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS)
    }
    if body.get("temperature") is not None:
        gen["temperature"] = float(body["temperature"])
    thinking = gemini_thinking(str(body.get("model") or ""), body.get("reasoning_effort"))
    if thinking is not None:
        gen["thinkingConfig"] = thinking
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        gen["responseMimeType"] = "application/json"
        gen["responseJsonSchema"] = (rf.get("json_schema") or {}).get("schema") or {"type": "object"}
    elif isinstance(rf, dict) and rf.get("type") == "json_object":
        gen["responseMimeType"] = "application/json"
    request["generationConfig"] = gen
    return request


def to_gemini_line(line: Mapping[str, Any]) -> dict[str, Any]:
    """One pipeline batch line -> one line of the Gemini JSONL input file."""
    return {"key": line["custom_id"], "request": to_gemini_request(line["body"])}


def model_of(line: Mapping[str, Any]) -> str:
    return str(line["body"]["model"])


def http_status(code: Any) -> int:
    """An error's HTTP status from a ``google.rpc.Status`` code (gRPC) or an HTTP code."""
    try:
        n = int(code)
    except (TypeError, ValueError):
        return 500
    return n if n >= 100 else GRPC_TO_HTTP.get(n, 500)


def _error_line(cid: str, status: int, message: str, etype: str) -> dict[str, Any]:
    body = {"error": {"message": message, "type": etype, "param": None, "code": etype}}
    return {"custom_id": cid, "response": {"status_code": status, "body": body}, "error": None}


def finish_reason(reason: Any) -> str:
    """A Gemini ``finishReason`` in OpenAI's terms; one not known here (``OTHER``, ``LANGUAGE``,
    ``MALFORMED_FUNCTION_CALL``, ...) is kept as it is, so the row fails as ``unexpected_finish``
    rather than pass as an answer.  A candidate without one is complete (``STOP``)."""
    r = str(reason or "STOP")
    return FINISH_TO_OPENAI.get(r, r)


def response_to_chat_completion(resp: Mapping[str, Any], model: str | None = None) -> dict[str, Any] | None:
    """A ``GenerateContentResponse`` -> a ``chat.completion`` body, or None when the prompt
    was blocked (no candidate)."""
    candidates = resp.get("candidates") or []
    if not candidates:
        return None
    cand = candidates[0]
    parts = ((cand.get("content") or {}).get("parts")) or []
    text = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and not p.get("thought"))
    u = resp.get("usageMetadata") or {}
    prompt = int(u.get("promptTokenCount") or 0)
    cached = int(u.get("cachedContentTokenCount") or 0)
    thoughts = int(u.get("thoughtsTokenCount") or 0)
    completion = int(u.get("candidatesTokenCount") or 0) + thoughts
    return {
        "id": resp.get("responseId"),
        "object": "chat.completion",
        "model": resp.get("modelVersion") or model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": finish_reason(cand.get("finishReason")),
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": thoughts},
        },
        "gemini_usage": dict(u),
    }


def to_openai_result_line(item: Mapping[str, Any]) -> dict[str, Any]:
    """One Gemini output-file line (``{"key", "response"}`` or ``{"key", "error"}``) -> one
    OpenAI batch output/error line."""
    cid = str(item.get("key") or (item.get("metadata") or {}).get("key") or "")
    if not cid:
        raise ValueError(f"a Gemini result line without a key: {json.dumps(item)[:200]}")
    err = item.get("error") or item.get("status")
    if isinstance(err, dict) and err.get("code") not in (None, 0):
        status = http_status(err.get("code"))
        etype = str(err.get("status") or "INTERNAL").lower()
        return _error_line(cid, status, str(err.get("message") or etype), etype)
    resp = item.get("response")
    if not isinstance(resp, dict):
        raise ValueError(f"Gemini result line for key {cid!r} has neither a response nor an error")
    body = response_to_chat_completion(resp)
    if body is None:
        reason = (resp.get("promptFeedback") or {}).get("blockReason") or "no candidate"
        return _error_line(cid, 400, f"the prompt was blocked by Gemini ({reason})", "refused")
    return {"custom_id": cid, "response": {"status_code": 200, "body": body}, "error": None}


# ----------------------------------------------------------------------------------------------
# the batch in the project's terms
# ----------------------------------------------------------------------------------------------


def _ts(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, datetime):
        return int(v.timestamp())
    return int(datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp())


def parse_display_name(name: str | None) -> dict[str, str]:
    """The engine's metadata from a batch's ``display_name``, our ``bg_key``
    (``<job>:<chunk>:<attempt>``); {} for a batch that is not ours."""
    if not name:
        return {}
    parts = name.rsplit(":", 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
        return {}
    return {"bg_job": parts[0], "bg_chunk": parts[1], "bg_attempt": parts[2], "bg_key": name}


@dataclass(frozen=True)
class GeminiBatch:
    """A Gemini batch job: ``state`` is the SDK's ``JOB_STATE_*``."""

    name: str
    state: str
    display_name: str
    model: str | None
    created_at: int
    ended_at: int | None
    output_file: str | None
    inlined: bool

    @property
    def status(self) -> str:
        return STATE_TO_STATUS.get(self.state, "in_progress")

    @property
    def is_terminal(self) -> bool:
        return self.status in ("completed", "failed", "cancelled", "expired")


def batch_of(obj: Any) -> GeminiBatch:
    """An SDK ``BatchJob`` -> :class:`GeminiBatch`."""
    state = obj.state.value if hasattr(obj.state, "value") else str(obj.state or "JOB_STATE_UNSPECIFIED")
    dest = obj.dest
    terminal = STATE_TO_STATUS.get(state) in ("completed", "failed", "cancelled", "expired")
    return GeminiBatch(
        name=str(obj.name),
        state=state,
        display_name=obj.display_name or "",
        model=obj.model,
        created_at=_ts(obj.create_time) or 0,
        ended_at=(_ts(obj.end_time) or _ts(obj.update_time)) if terminal else None,
        output_file=dest.file_name if dest is not None and dest.file_name else None,
        inlined=bool(dest is not None and dest.inlined_responses),
    )

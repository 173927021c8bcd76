"""Validation of a batch's input file and the plan of its requests (outcomes decided up front).

The parse-and-count of an input file (:func:`check_input`) is a pure function of the file's
bytes, the batch's endpoint and the configuration: it runs in the store's background worker
from ``create_batch`` on, outside the lock, and ``_validate`` (due ``validating_s`` after the
create) only applies its result, and decides the enqueued-token limit, under the lock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchgrader.provider.emulator.answers import _countable_messages, _counter_for, _is_reasoning_model
from batchgrader.provider.emulator.common import _error_body, _server_error_body, _unit
from batchgrader.provider.emulator.config import (
    AZURE_CHAT_ENDPOINT,
    CHAT_ENDPOINT,
    ENQUEUED_STATUSES,
    FAIL_400_TRIGGER,
    FAIL_500_TRIGGER,
    token_limit_message,
)
from batchgrader.provider.emulator.prompt_cache import BatchCache, openai_cached_tokens
from batchgrader.provider.emulator.rules import openai_request_error
from batchgrader.provider.emulator.state import _Batch, _Req, _StoreBase

if TYPE_CHECKING:
    from batchgrader.provider.emulator.background import TokenCache
    from batchgrader.provider.emulator.config import EmulatorConfig

#: How long a validation that is due waits for its background parse-and-count (on a manual
#: clock, or when forced) before doing the work itself.
VALIDATION_WAIT_S = 120.0


@dataclass
class _Checked:
    """The pure part of a batch's validation: the input errors (the first 1,000, in line order)
    or, if none, the plan of its requests (without the seeded failures, which depend on how often
    a custom_id was seen) and their prompt tokens."""

    errors: list[dict[str, Any]]
    model: str | None
    plan: list[_Req] | None
    tokens: int


def check_input(data: bytes, endpoint: str, cfg: EmulatorConfig, cache: TokenCache, azure: bool = False) -> _Checked:
    """Parse and check every line of an input file like the Batch API does, then plan it.

    ``azure``: as Azure OpenAI does, a line whose ``url`` is not the batch's endpoint is refused
    with ``url_mismatch``, and its api-version chat endpoint ``/chat/completions`` is chat."""
    errors: list[dict[str, Any]] = []
    chat = endpoint == CHAT_ENDPOINT or (azure and endpoint == AZURE_CHAT_ENDPOINT)

    def err(code: str, message: str, param: str | None, line: int | None) -> None:
        if len(errors) < 1000:
            errors.append({"code": code, "message": message, "param": param, "line": line})

    raw_lines = data.split(b"\n")
    while raw_lines and not raw_lines[-1].strip():
        raw_lines.pop()
    if not raw_lines:
        err("empty_file", "The batch input file is empty.", None, None)
        return _Checked(errors, None, None, 0)
    if len(raw_lines) > cfg.max_requests_per_batch:
        err(
            "too_many_tasks",
            f"The batch input file has {len(raw_lines):,} requests, but a batch can hold at most {cfg.max_requests_per_batch:,}.",
            None,
            None,
        )
        return _Checked(errors, None, None, 0)
    model: str | None = None
    seen: set[str] = set()
    parsed: list[tuple[str, dict[str, Any]]] = []
    for lineno, raw in enumerate(raw_lines, start=1):
        try:
            item = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            err("invalid_json_line", "This line is not parseable as valid JSON.", None, lineno)
            continue
        if not isinstance(item, dict):
            err("invalid_json_line", "This line is not parseable as valid JSON.", None, lineno)
            continue
        missing = [k for k in ("custom_id", "method", "url", "body") if item.get(k) is None]
        if missing:
            err("missing_required_parameter", f"Missing required parameter: '{missing[0]}'.", missing[0], lineno)
            continue
        cid = item["custom_id"]
        if not isinstance(cid, str) or not cid:
            err("invalid_request", "Invalid type for 'custom_id': expected a non-empty string.", "custom_id", lineno)
            continue
        if cid in seen:
            err(
                "duplicate_custom_id",
                f"The custom_id '{cid}' for this request is a duplicate of another request. The custom_id parameter must be unique for each request in a batch.",
                "custom_id",
                lineno,
            )
            continue
        seen.add(cid)
        if not isinstance(item["method"], str) or item["method"].upper() != "POST":
            err("invalid_request", "Invalid value for 'method': only 'POST' is supported.", "method", lineno)
            continue
        if item["url"] != endpoint:
            if azure:
                err(
                    "url_mismatch",
                    f"The provided url '{item['url']}' does not match the endpoint '{endpoint}' of the batch.",
                    "url",
                    lineno,
                )
            else:
                err("invalid_url", "The URL provided for this request does not match the batch endpoint.", "url", lineno)
            continue
        body = item["body"]
        if not isinstance(body, dict):
            err("invalid_request", "Invalid type for 'body': expected an object.", "body", lineno)
            continue
        if body.get("stream") is True:
            name = "Chat Completions" if chat else endpoint
            err("streaming_unsupported", f"{name}: Streaming is not supported in the Batch API.", "body.stream", lineno)
            continue
        m = body.get("model")
        if not isinstance(m, str) or not m:
            err("invalid_request", "Model parameter is required.", "body.model", lineno)
            continue
        if model is None:
            model = m
        elif m != model:
            err(
                "mismatched_model",
                f"The model '{m}' for this request does not match the rest of the batch. Each batch must contain requests for a single model.",
                "body.model",
                lineno,
            )
            continue
        if chat and not isinstance(body.get("messages"), list):
            err("invalid_request", "Messages parameter is required.", "body.messages", lineno)
            continue
        parsed.append((cid, body))
    if errors:
        return _Checked(errors, model, None, 0)
    assert model is not None
    plan = plan_requests(endpoint, parsed, model, cfg, cache)
    return _Checked([], model, plan, sum(r.prompt_tokens for r in plan))


def schema_tokens(model: str, response_format: Any, cfg: EmulatorConfig, cache: dict[str, int]) -> int:
    """Prompt tokens billed for a request's ``json_schema`` ``response_format``, as the real API
    bills the schema on top of the messages: ``cfg.schema_overhead_tokens`` when set, else the
    tokens of the ``json_schema`` object as compact JSON in the model's encoding (the allowance
    ``bgctl count`` states, ``pipeline/prepare.schema_allowance``).  0 without a schema."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return 0
    if cfg.schema_overhead_tokens is not None:
        return cfg.schema_overhead_tokens
    text = json.dumps(response_format.get("json_schema") or {}, separators=(",", ":"), ensure_ascii=False)
    found = cache.get(text)
    if found is None:
        found = cache[text] = _counter_for(model).text_tokens([text])[0]
    return found


def plan_requests(
    endpoint: str, parsed: list[tuple[str, dict[str, Any]]], model: str, cfg: EmulatorConfig, cache: TokenCache
) -> list[_Req]:
    """Each request's prompt and cached tokens, and the failures decided by its content alone."""
    chat = endpoint in (CHAT_ENDPOINT, AZURE_CHAT_ENDPOINT)  # the Azure one only exists on Azure batches
    messages = [_countable_messages(body.get("messages")) for _, body in parsed]
    if chat:
        prompt = cache.count_many(model, messages)
    else:
        prompt = [0] * len(parsed)
    seen: BatchCache = set()
    prefix_tokens: dict[str, int] = {}
    schema_cache: dict[str, int] = {}
    plan: list[_Req] = []
    for i, ((cid, body), msgs, pt) in enumerate(zip(parsed, messages, prompt)):
        cached = 0
        if msgs:
            first = json.dumps(msgs[0], sort_keys=True)

            def count_first(first: str = first, msg: dict[str, str] = msgs[0]) -> int:
                if first not in prefix_tokens:
                    prefix_tokens[first] = cache.count_many(model, [[msg]])[0] - 3
                return prefix_tokens[first]

            cached = openai_cached_tokens(seen, model, pt, first, count_first, body.get("prompt_cache_key"))
        pt += schema_tokens(model, body.get("response_format"), cfg, schema_cache)
        req = _Req(i, cid, body, pt, cached)
        user_text = " ".join(m.get("content", "") for m in msgs)
        if FAIL_400_TRIGGER in user_text:
            req.fail_status, req.fail_body = (
                400,
                _error_body(
                    "Invalid request (emulated failure triggered by __FAIL_400__).",
                    "invalid_request_error",
                    None,
                    "invalid_value",
                ),
            )
        elif FAIL_500_TRIGGER in user_text:
            req.fail_status, req.fail_body = 500, _server_error_body()
        elif not chat:
            req.fail_status, req.fail_body = (
                400,
                _error_body(
                    f"The emulator does not implement {endpoint}; only {CHAT_ENDPOINT} requests are answered.",
                    "invalid_request_error",
                    "url",
                    "unsupported_endpoint",
                ),
            )
        elif (refused := openai_request_error(body)) is not None:
            req.fail_status, req.fail_body = refused
        elif _is_reasoning_model(model) and "max_tokens" in body:
            req.fail_status, req.fail_body = (
                400,
                _error_body(
                    "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                    "invalid_request_error",
                    "max_tokens",
                    "unsupported_parameter",
                ),
            )
        plan.append(req)
    return plan


class ValidationMixin(_StoreBase):
    """Checks an input file like the Batch API does, then plans each request."""

    def _start_validation(self, b: _Batch) -> None:
        """Start the parse-and-count of ``b``'s input file in the background (if it has one)."""
        f = self.files.get(b.obj["input_file_id"])
        if f is None or f.deleted or f.obj["purpose"] != "batch":
            return  # _validate reports it; nothing to compute
        data, endpoint, cfg, cache, azure = f.data, b.obj["endpoint"], self.cfg, self.token_cache, b.azure
        b.checking = self.worker.submit(lambda: check_input(data, endpoint, cfg, cache, azure))

    def _validation_ready(self, b: _Batch) -> tuple[bool, float]:
        """Whether ``b``'s validation may be applied, and from when (``validating_s`` after its
        create, or later if its background parse-and-count finished later).  On any clock but the real one (a test's manual clock)
        the validation is always ready on time (``_validate`` then waits for the work)."""
        due = b.t_created + self.cfg.validating_s
        p = b.checking
        if p is None or not self.real_clock:
            return True, due
        if not p.done() or p.t_done is None:
            return False, due
        return True, max(due, p.t_done)

    def _checked(self, b: _Batch, data: bytes) -> _Checked:
        p = b.checking
        b.checking = None
        if p is not None and p.wait(VALIDATION_WAIT_S) and p.error is None:
            return p.result  # type: ignore[no-any-return]
        return check_input(data, b.obj["endpoint"], self.cfg, self.token_cache, b.azure)

    def _validate(self, b: _Batch) -> list[dict[str, Any]]:
        obj = b.obj
        fid = obj["input_file_id"]
        f = self.files.get(fid)
        if f is None or f.deleted:
            b.checking = None
            return [
                {
                    "code": "invalid_request",
                    "message": f"Cannot find file {fid}, or organization {self.cfg.organization} does not have access to it.",
                    "param": "file_id",
                    "line": None,
                }
            ]
        if f.obj["purpose"] != "batch":
            b.checking = None
            return [
                {
                    "code": "invalid_request",
                    "message": f"File {fid} has purpose '{f.obj['purpose']}', but the Batch API requires purpose 'batch'.",
                    "param": "file_id",
                    "line": None,
                }
            ]
        data = f.data
        checked = self._checked(b, data)
        model = checked.model
        if model is not None:
            obj["model"] = model
        if checked.errors:
            return checked.errors
        assert model is not None and checked.plan is not None
        plan = self._fail_seeded(checked.plan, self.custom_id_seen)
        tokens = checked.tokens
        limit = self.cfg.token_limits.get(model)
        if limit is not None:
            enqueued = sum(
                o.enqueued_tokens
                for o in self.batches.values()
                if o is not b and o.status in ENQUEUED_STATUSES and o.obj.get("model") == model
            )
            if enqueued + tokens > limit:
                return [
                    {
                        "code": "token_limit_exceeded",
                        "message": token_limit_message(
                            model, self.cfg.organization, limit if self.cfg.token_limit_figure else None
                        ),
                        "param": None,
                        "line": None,
                    }
                ]
        for req in plan:
            self.custom_id_seen[req.custom_id] += 1
        b.plan = plan
        b.input_data = data  # the batch keeps its input even if the file is deleted later
        b.enqueued_tokens = tokens
        obj["request_counts"] = {"total": len(plan), "completed": 0, "failed": 0}
        return []

    def _fail_seeded(self, plan: list[_Req], occurrences: dict[str, int]) -> list[_Req]:
        """The seeded fraction of requests that fail with a 500 (``request_failure_rate``); a
        custom_id's draw depends on how often it was seen before (a retry may succeed)."""
        rate = self.cfg.request_failure_rate
        if rate > 0:
            for req in plan:
                if (
                    req.fail_status is None
                    and _unit("fail", self.cfg.seed, req.custom_id, occurrences.get(req.custom_id, 0)) < rate
                ):
                    req.fail_status, req.fail_body = 500, _server_error_body()
        return plan

    def _ensure_plan(self, b: _Batch) -> list[_Req]:
        if b.plan is not None:
            return b.plan
        if b.n == 0 or b.input_data is None:
            b.plan = []
            return b.plan
        # Rebuild after a restart: same parse, same deterministic outcomes.
        parsed = []
        for raw in b.input_data.split(b"\n"):
            if raw.strip():
                item = json.loads(raw)
                parsed.append((item["custom_id"], item["body"]))
        occurrence = {cid: max(0, self.custom_id_seen.get(cid, 1) - 1) for cid, _ in parsed}
        plan = plan_requests(b.obj["endpoint"], parsed, b.obj["model"], self.cfg, self.token_cache)
        b.plan = self._fail_seeded(plan, occurrence)
        return b.plan

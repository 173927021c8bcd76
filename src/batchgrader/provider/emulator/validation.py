"""Validation of a batch's input file and the plan of its requests (outcomes decided up front)."""

from __future__ import annotations

import json
from typing import Any

from batchgrader.provider.emulator.answers import _countable_messages, _counter_for, _is_reasoning_model
from batchgrader.provider.emulator.common import _error_body, _server_error_body, _unit
from batchgrader.provider.emulator.config import (
    CHAT_ENDPOINT,
    ENQUEUED_STATUSES,
    FAIL_400_TRIGGER,
    FAIL_500_TRIGGER,
    token_limit_message,
)
from batchgrader.provider.emulator.state import _Batch, _Req, _StoreBase


class ValidationMixin(_StoreBase):
    """Checks an input file like the Batch API does, then plans each request."""

    def _validate(self, b: _Batch) -> list[dict[str, Any]]:
        obj = b.obj
        fid = obj["input_file_id"]
        f = self.files.get(fid)
        if f is None or f.deleted:
            return [
                {
                    "code": "invalid_request",
                    "message": f"Cannot find file {fid}, or organization {self.cfg.organization} does not have access to it.",
                    "param": "file_id",
                    "line": None,
                }
            ]
        if f.obj["purpose"] != "batch":
            return [
                {
                    "code": "invalid_request",
                    "message": f"File {fid} has purpose '{f.obj['purpose']}', but the Batch API requires purpose 'batch'.",
                    "param": "file_id",
                    "line": None,
                }
            ]
        data = f.data
        errors: list[dict[str, Any]] = []

        def err(code: str, message: str, param: str | None, line: int | None) -> None:
            if len(errors) < 1000:
                errors.append({"code": code, "message": message, "param": param, "line": line})

        raw_lines = data.split(b"\n")
        while raw_lines and not raw_lines[-1].strip():
            raw_lines.pop()
        if not raw_lines:
            err("empty_file", "The batch input file is empty.", None, None)
            return errors
        if len(raw_lines) > self.cfg.max_requests_per_batch:
            err(
                "too_many_tasks",
                f"The batch input file has {len(raw_lines):,} requests, but a batch can hold at most {self.cfg.max_requests_per_batch:,}.",
                None,
                None,
            )
            return errors
        endpoint = obj["endpoint"]
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
                err("invalid_url", "The URL provided for this request does not match the batch endpoint.", "url", lineno)
                continue
            body = item["body"]
            if not isinstance(body, dict):
                err("invalid_request", "Invalid type for 'body': expected an object.", "body", lineno)
                continue
            if body.get("stream") is True:
                name = "Chat Completions" if endpoint == CHAT_ENDPOINT else endpoint
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
            if endpoint == CHAT_ENDPOINT and not isinstance(body.get("messages"), list):
                err("invalid_request", "Messages parameter is required.", "body.messages", lineno)
                continue
            parsed.append((cid, body))
        if model is not None:
            obj["model"] = model
        if errors:
            return errors
        assert model is not None
        plan = self._make_plan(b, parsed, model)
        tokens = sum(r.prompt_tokens for r in plan)
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
        for cid, _ in parsed:
            self.custom_id_seen[cid] += 1
        b.plan = plan
        b.input_data = data  # the batch keeps its input even if the file is deleted later
        b.enqueued_tokens = tokens
        obj["request_counts"] = {"total": len(plan), "completed": 0, "failed": 0}
        return []

    def _make_plan(
        self, b: _Batch, parsed: list[tuple[str, dict[str, Any]]], model: str, attempt: dict[str, int] | None = None
    ) -> list[_Req]:
        counter = _counter_for(model)
        endpoint = b.obj["endpoint"]
        messages = [_countable_messages(body.get("messages")) for _, body in parsed]
        if endpoint == CHAT_ENDPOINT:
            prompt = counter.count_many(messages)
        else:
            prompt = [0] * len(parsed)
        first_seen: set[str] = set()
        plan: list[_Req] = []
        for i, ((cid, body), msgs, pt) in enumerate(zip(parsed, messages, prompt)):
            cached = 0
            if msgs and pt >= 1024:
                first = json.dumps(msgs[0], sort_keys=True)
                if first in first_seen:
                    prefix = counter.count([msgs[0]]) - 3
                    cached = min(pt, prefix) // 128 * 128
                    cached = cached if cached >= 1024 else 0
                first_seen.add(first)
            if self.cfg.schema_overhead_tokens and (body.get("response_format") or {}).get("type") == "json_schema":
                pt += self.cfg.schema_overhead_tokens
            req = _Req(i, cid, body, pt, cached)
            user_text = " ".join(m.get("content", "") for m in msgs)
            occurrence = attempt.get(cid, 0) if attempt is not None else self.custom_id_seen.get(cid, 0)
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
            elif endpoint != CHAT_ENDPOINT:
                req.fail_status, req.fail_body = (
                    400,
                    _error_body(
                        f"The emulator does not implement {endpoint}; only {CHAT_ENDPOINT} requests are answered.",
                        "invalid_request_error",
                        "url",
                        "unsupported_endpoint",
                    ),
                )
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
            elif (
                self.cfg.request_failure_rate > 0
                and _unit("fail", self.cfg.seed, cid, occurrence) < self.cfg.request_failure_rate
            ):
                req.fail_status, req.fail_body = 500, _server_error_body()
            plan.append(req)
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
        b.plan = self._make_plan(b, parsed, b.obj["model"], attempt=occurrence)
        return b.plan
